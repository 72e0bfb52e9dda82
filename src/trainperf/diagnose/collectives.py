"""Collectives across ranks: the wait for the last rank (skew) apart from the transfer, and the bus
bandwidth each collective achieved.

A collective kernel starts on each rank when that rank arrives and ends, on every rank, once the
data has moved, which cannot begin before the last rank arrives. So per matched collective:
skew = last arrival - first arrival; a rank's wait = last arrival - its own arrival; transfer =
end - last arrival (the median over ranks). Collectives are matched by order of issue within a
(process group, collective) pair, as NCCL requires; rank clocks are aligned on the matched
collectives' ends (they end together). With one rank in the trace nothing can be matched: the
transfer is the whole kernel and the bandwidth a lower bound.

Bandwidth follows NCCL's conventions (nccl-tests, doc/PERFORMANCE.md): algorithm bandwidth =
S / transfer time, S the largest of the send and receive buffers (the whole gathered or scattered
tensor for all-gather and reduce-scatter); bus bandwidth = algbw x 2(n-1)/n for all-reduce,
x (n-1)/n for all-gather, reduce-scatter and all-to-all, x 1 for broadcast, reduce and send/recv,
n the group size. Bus bandwidth compares with one GPU's link bandwidth in one direction: the
catalog's scale-up link when the group fits in one node, else the scale-out NIC.
Message sizes come from the kernels' "In msg nelems" / "Out msg nelems" / "dtype" / "Group size"
args (PyTorch >= 2.1 writes them; the loader keeps them in EventTable.args); older traces give no
size and no bandwidth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainperf.diagnose.crossrank import consensus_offset, ends_agree, group_collective_rows, group_kind
from trainperf.diagnose.process_groups import int_list
from trainperf.trace.events import COMMUNICATION, KERNEL, EventTable

DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
               "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
               "ComplexFloat": 8, "ComplexDouble": 16}


def bus_factor(kind: str, n: int) -> float:
    """NCCL's bus-bandwidth factor of a collective over n ranks (busbw = algbw x factor)."""
    if n <= 1:
        return 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, send/recv


@dataclass(frozen=True, kw_only=True, slots=True)
class CommArgs:
    """Size facts of one collective kernel, from its args."""

    nbytes: int             # largest of the send and receive buffers (bytes)
    group_size: int
    group_ranks: tuple      # global ranks of the group, () when the trace does not say
    received_bytes: int = 0  # the receive buffer ("Out msg nelems" x the dtype's size; 0 where not recorded)


def comm_args(t: EventTable | str | Path) -> dict[int, CommArgs]:
    """Correlation id -> size facts of every collective kernel that carries message-size args, from
    the args the loader kept in the table (a path is loaded first)."""
    if not isinstance(t, EventTable):
        from trainperf.trace.producers import read_any

        t = read_any(t)
    out: dict[int, CommArgs] = {}
    kept = t.kept_args()
    rows = np.flatnonzero((t.args >= 0) & (t.kind == KERNEL) & (t.correlation >= 0))
    for row in rows:
        a = kept[int(t.args[row])]
        size = DTYPE_BYTES.get(str(a.get("dtype")), 0)
        n_in, n_out = a.get("In msg nelems"), a.get("Out msg nelems")
        if not size or not isinstance(n_in, int):
            continue
        ranks = int_list(a.get("Process Group Ranks"))
        group = a.get("Group size")
        n_out = n_out if isinstance(n_out, int) else 0
        out[int(t.correlation[row])] = CommArgs(nbytes=size * max(n_in, n_out),
                                                group_size=int(group) if isinstance(group, int) else len(ranks),
                                                group_ranks=ranks, received_bytes=size * n_out)
    return out


# A collective of a handful of values: a barrier's one element (dist.barrier is an all-reduce of one), a loss or metric
# averaged across ranks, a gradient norm, an overflow flag. Its time is latency and the wait for the slowest rank, not
# bandwidth, and it carries no layer's activations (one token's at a hidden size of 1,024 in bf16 is 2 KiB) nor any
# gradient bucket. Stated, not fitted
SCALAR_COLLECTIVE_MAX_BYTES = 1024
BARRIER_RE = re.compile(r"barrier", re.I)  # c10d::barrier, nccl:all_reduce_barrier (PyTorch >= 2.6), gloo:barrier


def scalar_collective_rows(t: EventTable, groups: dict[str, np.ndarray], sizes: dict[int, CommArgs],
                           barrier_rows: np.ndarray) -> np.ndarray:
    """The collective kernel rows of `groups` (crossrank.collective_rows) that carry a handful of values: of a known
    message size (sizes: comm_args) <= SCALAR_COLLECTIVE_MAX_BYTES, or launched inside a barrier (barrier_rows: the
    device rows launched inside BARRIER_RE spans) where the trace records no size."""
    rows = np.concatenate([r for r in groups.values()] or [np.zeros(0, np.int64)]).astype(np.int64)
    if not rows.size:
        return rows
    small = np.array([(a := sizes.get(int(c))) is not None and 0 < a.nbytes <= SCALAR_COLLECTIVE_MAX_BYTES
                      for c in t.correlation[rows]], dtype=bool)
    return rows[small | np.isin(rows, barrier_rows)]


@dataclass(kw_only=True)
class Collective:
    """One collective as every rank of the trace saw it (times µs, rank clocks aligned)."""

    group: str                    # "<process group>/<collective>" or "<collective>"
    kind: str
    seq: int                      # order of issue within its group
    arrival_us: dict[int, float]
    end_us: dict[int, float]
    nbytes: int = 0
    group_size: int = 0
    group_ranks: tuple = ()

    @property
    def skew_us(self) -> float:
        """Last arrival - first arrival."""
        return max(self.arrival_us.values()) - min(self.arrival_us.values())

    @property
    def last_rank(self) -> int:
        return max(self.arrival_us, key=self.arrival_us.get)

    def wait_us(self, rank: int) -> float:
        """Time rank spent in the collective before the last rank arrived."""
        return max(self.arrival_us.values()) - self.arrival_us[rank]

    @property
    def transfer_us(self) -> float:
        """End - last arrival, median over ranks: the data movement itself."""
        last = max(self.arrival_us.values())
        return float(np.median([e - last for e in self.end_us.values()]))

    @property
    def algbw_gbps(self) -> float:
        return self.nbytes / (self.transfer_us * 1e3) if self.nbytes and self.transfer_us > 0 else 0.0

    @property
    def busbw_gbps(self) -> float:
        return self.algbw_gbps * bus_factor(self.kind, self.group_size)


@dataclass(kw_only=True)
class GroupStats:
    """All collectives of one (process group, collective) pair: counts, skew, transfer, bandwidth."""

    group: str
    kind: str
    count: int
    ranks: list[int]
    skew_us: float                  # summed over the collectives
    transfer_us: float              # summed
    bytes_median: float
    busbw_gbps_median: float        # of the collectives with a size
    link_gbps: float | None         # one GPU's link, one direction (catalog)
    link: str                       # "scale-up" / "scale-out" / ""
    wait_by_rank_us: dict[int, float] = field(default_factory=dict)

    @property
    def busbw_pct_of_link(self) -> float | None:
        return 100.0 * self.busbw_gbps_median / self.link_gbps if self.link_gbps and self.busbw_gbps_median else None

    def to_json(self) -> dict:
        r = lambda v: round(v, 3) if isinstance(v, float) else v  # noqa: E731
        return {"group": self.group, "kind": self.kind, "count": self.count, "ranks": self.ranks,
                "skew_us": r(self.skew_us), "transfer_us": r(self.transfer_us), "bytes_median": r(self.bytes_median),
                "busbw_gbps_median": r(self.busbw_gbps_median), "link": self.link, "link_gbps": self.link_gbps,
                "busbw_pct_of_link": r(self.busbw_pct_of_link),
                "wait_by_rank_us": {str(k): r(v) for k, v in self.wait_by_rank_us.items()}}


def _rows_by_group(t: EventTable) -> dict[str, np.ndarray]:
    """Communication kernels of a rank by "<process group>/<collective>", in order of issue."""
    rows = np.flatnonzero((t.category == COMMUNICATION) & (t.kind == KERNEL))
    return group_collective_rows(t, rows[np.argsort(t.ts_ns[rows], kind="stable")])


def match_collectives(tables: dict[int, EventTable], sizes: dict[int, dict[int, CommArgs]] | None = None
                      ) -> list[Collective]:
    """Every collective matched across the ranks that issue it (one rank: each kernel alone), with
    arrivals and ends in µs on rank clocks aligned to the first rank's (crossrank.consensus_offset); kernels
    matched by order that do not end together (crossrank.ends_agree) are left out. sizes: {rank: comm_args}
    (default: read from the tables)."""
    if sizes is None:
        sizes = {r: comm_args(t) for r, t in tables.items()}
    ranks = sorted(tables)
    groups = {r: _rows_by_group(tables[r]) for r in ranks}
    offset = {r: 0.0 for r in ranks}
    t0 = tables[ranks[0]]
    for r in ranks[1:]:  # collectives end together: the end difference they agree on is the clock offset
        diffs, durs = [], []
        for g, ref in groups[ranks[0]].items():
            other = groups[r].get(g)
            if other is not None:
                n = min(ref.size, other.size)
                diffs.extend((tables[r].end_ns[other[:n]] - t0.end_ns[ref[:n]]) / 1e3)
                durs.extend(np.minimum(tables[r].dur_ns[other[:n]], t0.dur_ns[ref[:n]]) / 1e3)
        offset[r] = consensus_offset(np.array(diffs), np.array(durs)) if diffs else 0.0
    out = []
    for g in sorted(set().union(*[set(x) for x in groups.values()])):
        members = [r for r in ranks if g in groups[r]]
        n = min(groups[r][g].size for r in members)
        for k in range(n):
            arrival, end, dur = {}, {}, {}
            nbytes, gsize, granks = 0, 0, ()
            for r in members:
                t, row = tables[r], int(groups[r][g][k])
                arrival[r] = t.ts_ns[row] / 1e3 - offset[r]
                end[r] = t.end_ns[row] / 1e3 - offset[r]
                dur[r] = t.dur_ns[row] / 1e3
                a = sizes.get(r, {}).get(int(t.correlation[row]))
                if a is not None:
                    nbytes, gsize, granks = max(nbytes, a.nbytes), max(gsize, a.group_size), a.group_ranks or granks
            if not ends_agree(end, dur):  # matched by order, not one collective (crossrank.ends_agree)
                continue
            out.append(Collective(group=g, kind=group_kind(g), seq=k, arrival_us=arrival, end_us=end,
                                  nbytes=nbytes, group_size=gsize, group_ranks=granks))
    return out


def _link(accelerator, group_ranks: tuple, group_size: int) -> tuple[float | None, str]:
    if accelerator is None or group_size <= 1:
        return None, ""
    per_node = accelerator.gpus_per_node or 1
    if group_ranks:
        nodes = {int(r) // per_node for r in group_ranks}
        one_node = len(nodes) == 1
    else:
        one_node = group_size <= min(per_node, accelerator.scaleup_domain)
    return (float(accelerator.scaleup_gbps), "scale-up") if one_node else (float(accelerator.scaleout_gbps), "scale-out")


# NCCL's fixed cost per collective (µs): nccl-tests' times for the smallest messages within a node, ~10 µs on 8
# NVLink GPUs (doc/PERFORMANCE.md's latency-bound end); stated, not fitted: no labeled trace has a slow transport
COLLECTIVE_LATENCY_US = 10.0
# NCCL's kernel names end in the algorithm and protocol they run ("ncclKernel_AllReduce_RING_LL_Sum_float" before
# 2.19, "ncclDevKernel_AllReduce_Sum_f32_RING_LL" since). LL stores 8 bytes with a 4-byte flag each: at most half a
# link's rate, which NCCL's tuner accepts for small messages only (LL128 loses 1/16, Simple nothing)
LL_PROTOCOL_RE = re.compile(r"_(?:RING|TREE|COLLNET\w*|NVLS\w*|PAT)_LL(?!128)(?![A-Za-z0-9])")


@dataclass(frozen=True, kw_only=True)
class TransferRate:
    """How fast one rank's collectives moved their data, against the links they crossed (catalog)."""

    sized_count: int        # collectives with recorded message sizes over a group of 2 or more ranks
    busbw_gbps: float       # NCCL bus bandwidth over their transfer time, time-weighted (GB/s)
    link_gbps: float        # the link most of their transfer time crossed (GB/s, one direction)
    link: str               # "scale-up" / "scale-out"
    link_share: float       # their time at the links' rates (plus COLLECTIVE_LATENCY_US each) / the time taken, 0-1
    partners_seen: bool     # the waits for other ranks were measured (their traces matched), not only bounded
    ll_share: float = 0.0   # share (0-1) of their bus bytes NCCL moved with its LL protocol (LL_PROTOCOL_RE)


def transfer_rate(t: EventTable, groups: dict[str, np.ndarray], wait_us: dict[int, float] | None,
                  accelerator, sizes: dict[int, CommArgs] | None = None) -> TransferRate | None:
    """The transfer rate of a rank's collectives (groups: crossrank.collective_rows, "<pg>/<collective>" -> rows;
    wait_us: trace row -> µs the kernel waited for another rank, from the matched ranks; None with one rank's trace).

    A collective's transfer is its kernel's time less its wait, and the shortest of that over the collectives of
    its group, kind and size: waiting only adds time, so with one rank's trace the fastest of N repeats is the
    transfer of one whose partners had arrived. Compared with the time the bytes take at the link's rate (NCCL's
    bus bandwidth convention: bus_factor; the scale-up link within a node, else the scale-out NIC: _link) plus
    COLLECTIVE_LATENCY_US. Collectives of a handful of values (SCALAR_COLLECTIVE_MAX_BYTES) are left out: they measure
    latency and waiting, not the link. None without message sizes (PyTorch < 2.1) or a catalog device. sizes: comm_args
    of t, when the caller has them."""
    if accelerator is None:
        return None
    sizes = comm_args(t) if sizes is None else sizes
    fastest: dict[tuple, float] = {}
    members: list[tuple[tuple, float, float, str, bool]] = []  # (class, bus bytes, link GB/s, link, LL protocol)
    for key, rows in groups.items():
        kind = group_kind(key)
        for r in rows:
            a = sizes.get(int(t.correlation[r]))
            if a is None or a.group_size <= 1 or a.nbytes <= SCALAR_COLLECTIVE_MAX_BYTES:
                continue
            link_gbps, link = _link(accelerator, a.group_ranks, a.group_size)
            if not link_gbps:
                continue
            us = t.dur_ns[r] / 1e3 - (wait_us or {}).get(int(r), 0.0)
            if us <= 0:
                continue
            cls = (key, a.nbytes, a.group_size)
            fastest[cls] = min(fastest.get(cls, np.inf), us)
            members.append((cls, a.nbytes * bus_factor(kind, a.group_size), link_gbps, link,
                            LL_PROTOCOL_RE.search(t.names[int(t.name[r])]) is not None))
    if not members:
        return None
    taken = np.array([fastest[m[0]] for m in members])
    bus_bytes = np.array([m[1] for m in members])
    at_link = np.array([COLLECTIVE_LATENCY_US + m[1] / (m[2] * 1e3) for m in members])
    by_link: dict[tuple[str, float], float] = {}
    for m, us in zip(members, taken):
        by_link[(m[3], m[2])] = by_link.get((m[3], m[2]), 0.0) + us
    (link, link_gbps) = max(by_link, key=by_link.get)
    return TransferRate(sized_count=len(members), busbw_gbps=float(bus_bytes.sum() / (taken.sum() * 1e3)),
                        link_gbps=link_gbps, link=link, link_share=float(min(at_link.sum() / taken.sum(), 1.0)),
                        partners_seen=wait_us is not None,
                        ll_share=float(bus_bytes[np.array([m[4] for m in members], dtype=bool)].sum()
                                       / bus_bytes.sum()))


def collective_stats(tables: dict[int, EventTable], accelerator=None, sizes: dict[int, dict[int, CommArgs]] | None
                     = None) -> list[GroupStats]:
    """Per (process group, collective): skew and transfer time summed, median size and bus bandwidth,
    and the link it is compared with; sorted by skew + transfer time. sizes: {rank: comm_args}
    (default: read from the tables)."""
    colls = match_collectives(tables, sizes)
    out = []
    for g in sorted({c.group for c in colls}):
        cs = [c for c in colls if c.group == g]
        sized = [c for c in cs if c.nbytes]
        gsize = max((c.group_size for c in cs), default=0)
        granks = next((c.group_ranks for c in cs if c.group_ranks), ())
        link_gbps, link = _link(accelerator, granks, gsize)
        members = sorted(cs[0].arrival_us)
        out.append(GroupStats(
            group=g, kind=cs[0].kind, count=len(cs), ranks=members, skew_us=float(sum(c.skew_us for c in cs)),
            transfer_us=float(sum(c.transfer_us for c in cs)),
            bytes_median=float(np.median([c.nbytes for c in sized])) if sized else 0.0,
            busbw_gbps_median=float(np.median([c.busbw_gbps for c in sized])) if sized else 0.0,
            link_gbps=link_gbps, link=link,
            wait_by_rank_us={r: float(sum(c.wait_us(r) for c in cs if r in c.arrival_us)) for r in members}))
    return sorted(out, key=lambda s: -(s.skew_us + s.transfer_us))


def collectives_for_trace(path: str | Path, accelerator: str | None = None) -> list[GroupStats]:
    """collective_stats of a Kineto file or folder of ranks (accelerator: a catalog name; default
    the first rank's deviceProperties)."""
    from trainperf.diagnose.roofline import device_accelerator
    from trainperf.hardware import get_accelerator
    from trainperf.trace.load import load_trace

    tables = load_trace(path)
    acc = get_accelerator(accelerator) if accelerator else device_accelerator(next(iter(tables.values())))
    return collective_stats(tables, acc)
