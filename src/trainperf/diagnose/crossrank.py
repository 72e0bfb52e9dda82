"""Across ranks: collectives matched by sequence, stragglers and load imbalance.

Collectives are matched by their order of issue: the k-th communication kernel of a given
collective type in a given process group (the kernel's "Process Group Name" argument when the
trace has it) is the same collective on every rank of that group (NCCL requires the ranks of a
communicator to issue its collectives in the same order). A collective kernel starts when its rank
arrives and finishes after the last rank arrives, so each rank's wait inside it is
latest arrival - own arrival (capped at the kernel's duration), and the last rank to arrive
is the one the others waited for. Rank clocks are aligned first on the matched collectives' end
times (they end together), which removes clock skew between hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.window import Window
from trainperf.trace.categories import collective_type
from trainperf.trace.events import COMMUNICATION, KERNEL, EventTable


def collective_rows(t: EventTable, w: Window) -> dict[str, np.ndarray]:
    """Window communication kernels of a rank grouped by process group and collective type
    ("pg/all_reduce", or "all_reduce" when the trace names no process group), in issue order (rows)."""
    rows = w.device[(t.category[w.device] == COMMUNICATION) & (t.kind[w.device] == KERNEL)]
    return group_collective_rows(t, rows[np.argsort(w.ts_us[rows], kind="stable")])


def group_collective_rows(t: EventTable, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Communication kernel rows (in issue order) grouped by "<process group>/<collective>"
    ("all_reduce" alone when the trace names no process group), order kept."""
    groups: dict[str, list[int]] = {}
    for r in rows:
        c = int(t.collective[r])
        kind = collective_type(t.names[c] if c >= 0 else t.names[int(t.name[r])])
        pg = int(t.process_group[r])
        groups.setdefault(f"{t.names[pg]}/{kind}" if pg >= 0 else kind, []).append(int(r))
    return {k: np.array(v, dtype=np.int64) for k, v in groups.items()}


@dataclass
class MatchedCollective:
    """One collective seen on every rank: arrival (kernel start, µs, aligned) and wait per rank."""

    kind: str
    seq: int
    start_us: dict[int, float]
    wait_us: dict[int, float]
    last_rank: int
    rows: dict[int, int] = field(default_factory=dict)  # trace row of this collective's kernel on each rank


@dataclass
class CrossRank:
    """Matched collectives, wait caused by each rank, and imbalance of compute time across ranks."""

    collectives: list[MatchedCollective]
    unmatched: dict[str, dict[int, int]]          # collective type -> {rank: count} when counts differ
    wait_by_rank_us: dict[int, float]             # time each rank spent waiting inside collectives
    caused_by_rank_us: dict[int, float]           # waiting of the others that each rank caused
    busy_by_rank_us: dict[int, float]             # device busy time per rank
    compute_by_rank_us: dict[int, float]
    notes: list[str] = field(default_factory=list)
    clock_offset_us: dict[int, float] = field(default_factory=dict)  # rank clock - first rank's clock
    clock_spread_us: dict[int, float] = field(default_factory=dict)  # IQR of matched end differences

    @property
    def straggler(self) -> tuple[int, float] | None:
        """(rank, µs of others' waiting it caused) of the worst straggler, or None."""
        if not self.caused_by_rank_us:
            return None
        r = max(self.caused_by_rank_us, key=self.caused_by_rank_us.get)
        return r, self.caused_by_rank_us[r]

    @property
    def imbalance_pct(self) -> float:
        """(max - mean) / mean of per-rank compute time, %."""
        v = np.array(list(self.compute_by_rank_us.values()), dtype=float)
        return float(100.0 * (v.max() - v.mean()) / v.mean()) if v.size > 1 and v.mean() > 0 else 0.0


def _clock_offsets(tables, windows, groups, ranks) -> tuple[dict[int, float], dict[int, float]]:
    """Per-rank clock offset (µs): collectives end together on every rank, so the median difference
    of matched collective end times against the first rank is that rank's clock skew. Also the
    spread of those differences (interquartile range, µs): how well one offset explains them."""
    off = {r: 0.0 for r in ranks}
    spread = {r: 0.0 for r in ranks}
    ref = ranks[0]
    for r in ranks[1:]:
        diffs = []
        for kind, rows_ref in groups[ref].items():
            rows_r = groups[r].get(kind)
            if rows_r is None:
                continue
            n = min(len(rows_ref), len(rows_r))
            diffs.extend(windows[r].end_us[rows_r[:n]] - windows[ref].end_us[rows_ref[:n]])
        off[r] = float(np.median(diffs)) if diffs else 0.0
        spread[r] = float(np.subtract(*np.percentile(diffs, [75, 25]))) if diffs else 0.0
    return off, spread


def comm_waits(xr: "CrossRank", rank: int) -> dict[int, tuple[float, int]]:
    """For one rank: trace row of each matched collective kernel -> (µs waited inside it, rank waited for)."""
    return {c.rows[rank]: (c.wait_us[rank], c.last_rank) for c in xr.collectives
            if rank in c.rows and c.wait_us.get(rank, 0.0) > 0}


def cross_rank(tables: dict[int, EventTable], windows: dict[int, Window], compute_us: dict[int, float],
               busy_us: dict[int, float]) -> CrossRank:
    """Match collectives across ranks and measure stragglers (µs); needs >= 2 ranks for waits."""
    ranks = sorted(tables)
    groups = {r: collective_rows(tables[r], windows[r]) for r in ranks}
    t0, spread = _clock_offsets(tables, windows, groups, ranks)
    matched: list[MatchedCollective] = []
    unmatched: dict[str, dict[int, int]] = {}
    wait = {r: 0.0 for r in ranks}
    caused = {r: 0.0 for r in ranks}
    notes = []
    if len(ranks) >= 2:
        kinds = set().union(*[set(g) for g in groups.values()])
        for kind in sorted(kinds):
            # only the ranks that issue this (process group, collective) take part in it
            members = [r for r in ranks if kind in groups[r]]
            if len(members) < 2:
                continue
            counts = {r: len(groups[r][kind]) for r in members}
            if len(set(counts.values())) > 1:
                unmatched[kind] = counts
            for k in range(min(counts.values())):
                starts = {}
                durs = {}
                for r in members:
                    row = groups[r][kind][k]
                    w = windows[r]
                    starts[r] = float(w.ts_us[row] - t0[r])
                    durs[r] = float(w.end_us[row] - w.ts_us[row])
                last = max(starts, key=starts.get)
                waits = {r: min(max(0.0, starts[last] - starts[r]), durs[r]) for r in members}
                for r in members:
                    wait[r] += waits[r]
                caused[last] += sum(waits.values())
                matched.append(MatchedCollective(kind, k, starts, waits, last,
                                                 {r: int(groups[r][kind][k]) for r in members}))
        if unmatched:
            notes.append("collective counts differ across ranks for " + ", ".join(sorted(unmatched))
                         + ": matched by order up to the smallest count")
    else:
        notes.append("one rank: cross-rank analyses need traces of at least two ranks")
    return CrossRank(matched, unmatched, wait, caused if len(ranks) >= 2 else {}, busy_us, compute_us, notes,
                     clock_offset_us=t0, clock_spread_us=spread)
