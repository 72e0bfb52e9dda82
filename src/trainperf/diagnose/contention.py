"""Computation slowed by the communication that runs beside it (`comm_contention`).

A collective's kernels run on the device's SMs (NCCL's and RCCL's CTAs move and reduce the data) and use its memory
bandwidth, so a computation kernel that overlaps them shares the device with them and runs slower than the same work
run alone. Hiding a collective behind computation is then not free: the overlap lengthens the computation.

The same work is the same operator on the same recorded shapes launching the same kernel (slow_work.work_keys; shapes
needed, record_shapes=True: a kernel's name alone also runs on other inputs) in the same pass, forward or backward
(launched inside an autograd node): a backward reads what the forward saved long before, from memory rather than the
cache a forward's just-written inputs sit in, so the same kernel on the same shapes can be slower there for that
alone, and data parallelism overlaps only the backward with its collectives. Of each such work, the kernels that ran
with communication over at least OVERLAP_MIN_SHARE of their time are compared with those that ran with none, neither
beside another stream's computation (two computations side by side slow each other for another reason): a one-sided
Mann-Whitney U test per work, Benjamini-Hochberg across the works tested (SciPy). Where the overlapped ones are slower,
their median time over the alone ones' median is the slowdown, and the time it adds, the median difference times the
overlapped calls, is what the overlap costs the computation.

Priced by replay: the overlapped kernels of each slowed work at its alone time (speedup_rows, one factor per work).
An upper bound: what a collective's SMs buy is its speed, and with fewer of them it takes longer, which costs nothing
only while it stays hidden; overlapped work with no alone call to compare with is not priced. The fix names the
collective most of the slowed time ran beside (crossrank.launch_collectives' reading), whose knob differs.

Hand-written: HTA reports how much communication overlaps computation (comm_comp_overlap), TraceLens the same and
each kernel's own rate, neither what the overlap costs the computation it hides behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.stats import false_discovery_control, mannwhitneyu

from trainperf.diagnose import advice
from trainperf.diagnose import findings as F
from trainperf.diagnose.autograd_links import backward_node_mask
from trainperf.diagnose.crossrank import launch_collectives
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.gpu_time import compute_mask, concurrent_compute_us
from trainperf.diagnose.launch import launched_inside
from trainperf.diagnose.replay import Change
from trainperf.diagnose.slow_work import work_keys
from trainperf.diagnose.window import Window, covered_each, merge_intervals, times_us
from trainperf.trace.categories import COMMUNICATION
from trainperf.trace.events import CPU_OP, DEVICE_KINDS, KERNEL, EventTable
from trainperf.trace.nesting import row_spans

# a kernel with communication beside it over at least this share of its time ran overlapped (half: most of it); one
# with none, alone. Stated, not fitted (no labeled trace of contention is at hand)
OVERLAP_MIN_SHARE = 0.5
# a kernel beside another stream's computation for more than this share of its time is compared in neither group
CONCURRENT_MAX_SHARE = 0.05
# calls of one work needed on each side for a comparison: the fewest with which the one-sided U test can reach 0.05
MIN_CALLS = 3
# the false discovery rate over the works compared (Benjamini-Hochberg)
FALSE_DISCOVERY_RATE = 0.05
# the time the overlap adds, % of the window, for a finding: the stall rules' own evidence floor (1 %)
CONTENTION_MIN_PCT = 1.0


@dataclass(frozen=True, kw_only=True)
class SlowedWork:
    """One work (operator, shapes, kernel) that runs slower with communication beside it."""

    key: str
    overlapped_rows: tuple     # the trace rows of its overlapped kernels
    alone_calls: int
    overlapped_us: float       # median time of an overlapped call (µs)
    alone_us: float            # median time of a call alone (µs)
    p_value: float             # adjusted (Benjamini-Hochberg)

    @property
    def slowdown(self) -> float:
        """Overlapped time over alone time (x)."""
        return self.overlapped_us / self.alone_us

    @property
    def extra_us(self) -> float:
        """The time the overlap adds to its overlapped calls (µs, over the window)."""
        return (self.overlapped_us - self.alone_us) * len(self.overlapped_rows)


@dataclass(frozen=True, kw_only=True)
class Contention:
    """What communication beside the computation costs it, over the window."""

    slowed: list               # SlowedWork, the most extra time first
    overlapped_us: float       # computation kernels' time with communication beside them (µs)
    compared_us: float         # of which the works with calls alone to compare with (µs)
    works_compared: int
    beside: dict = field(default_factory=dict)  # collective -> share of the slowed calls' time beside it (0-1)

    @property
    def mostly_beside(self) -> str | None:
        """The collective most of the slowed calls' time ran beside (a majority), or None."""
        kind, share = max(self.beside.items(), key=lambda kv: kv[1], default=(None, 0.0))
        return kind if share > 0.5 else None

    @property
    def extra_us(self) -> float:
        """The time the overlap adds to the slowed works' computation (µs)."""
        return sum(s.extra_us for s in self.slowed)

    @property
    def slowdown(self) -> float:
        """The slowed works' overlapped time over their time alone (x; 1 with none)."""
        ov = sum(s.overlapped_us * len(s.overlapped_rows) for s in self.slowed)
        return ov / (ov - self.extra_us) if self.slowed else 1.0


def slowed_by_communication(t: EventTable, w: Window, launching: np.ndarray | None = None) -> Contention | None:
    """The computation slowed by the communication beside it (module docstring), or None where the window has no
    communication kernel, or no computation with recorded shapes beside one. launching: roofline.launching_op of t,
    where the caller has it."""
    rows = w.device
    kernels = rows[t.kind[rows] == KERNEL]
    comm = kernels[t.category[kernels] == COMMUNICATION]
    comp = rows[compute_mask(t, rows)]
    if not comm.size or not comp.size:
        return None
    dur = w.end_us[comp] - w.ts_us[comp]
    beside = beside_share(t, w.ts_us, w.end_us, comp, comm)
    single = concurrent_compute_us(t, w, comp) / np.maximum(dur, 1e-9) <= CONCURRENT_MAX_SHARE
    overlapped, alone = single & (beside >= OVERLAP_MIN_SHARE), single & (beside <= 0.0)
    if not overlapped.any():
        return None
    dur_of = dur[overlapped | alone]
    kept = comp[overlapped | alone]  # only these are compared: the others' keys are not read
    keys, shaped = work_keys(t, kept, launching)
    keys = [k + " | backward" if b else k for k, b in zip(keys, np.isin(kept, backward_kernels(t, w)))]
    codes = np.unique(np.asarray(keys, dtype=object), return_inverse=True)[1].ravel()
    side = overlapped[overlapped | alone]
    order = np.argsort(codes, kind="stable")
    tested = []
    for same in np.split(order, np.flatnonzero(np.diff(codes[order])) + 1):
        ov, al = same[side[same]], same[~side[same]]
        if shaped[same[0]] and ov.size >= MIN_CALLS and al.size >= MIN_CALLS:
            p = float(mannwhitneyu(dur_of[ov], dur_of[al], alternative="greater").pvalue)
            tested.append((keys[same[0]], ov, al, p if 0.0 <= p <= 1.0 else 1.0))  # no test read as no evidence
    if not tested:
        return None
    adjusted = false_discovery_control([p for *_, p in tested])
    slowed = []
    for (key, ov, al, _), p in zip(tested, adjusted):
        x = SlowedWork(key=key, overlapped_rows=tuple(int(r) for r in kept[ov]), alone_calls=int(al.size),
                       overlapped_us=float(np.median(dur_of[ov])), alone_us=float(np.median(dur_of[al])),
                       p_value=float(p))
        if p <= FALSE_DISCOVERY_RATE and x.overlapped_us > x.alone_us:
            slowed.append(x)
    slowed_rows = np.array([r for x in slowed for r in x.overlapped_rows], dtype=np.int64)
    return Contention(slowed=sorted(slowed, key=lambda s: -s.extra_us), overlapped_us=float(dur[overlapped].sum()),
                      compared_us=float(sum(dur_of[ov].sum() for _, ov, _, _ in tested)), works_compared=len(tested),
                      beside=_beside(t, w, comm, slowed_rows))


def same_device_cover(t: EventTable, starts_us: np.ndarray, ends_us: np.ndarray, rows: np.ndarray,
                      beside: np.ndarray) -> np.ndarray:
    """For each device row of `rows`, how long (µs) the device rows `beside` of its own device (Kineto's pid of device
    events) ran during it, on the rows' times starts_us / ends_us (per table row): one process may drive several GPUs,
    whose work shares no SM."""
    out = np.zeros(rows.size)
    for device in np.unique(t.pid[rows]):
        mine, theirs = t.pid[rows] == device, beside[t.pid[beside] == device]
        out[mine] = covered_each(starts_us[rows[mine]], ends_us[rows[mine]],
                                 merge_intervals(starts_us[theirs], ends_us[theirs]))
    return out


def beside_share(t: EventTable, starts_us: np.ndarray, ends_us: np.ndarray, comp: np.ndarray,
                 comm: np.ndarray) -> np.ndarray:
    """For each computation kernel of `comp`, the share (0-1) of its time the communication kernels `comm` of its own
    device ran beside it (same_device_cover over its duration): OVERLAP_MIN_SHARE or more is overlapped, 0 alone."""
    dur = ends_us[comp] - starts_us[comp]
    return same_device_cover(t, starts_us, ends_us, comp, comm) / np.maximum(dur, 1e-9)


def computation_beside_communication(t: EventTable, steps: np.ndarray) -> tuple[float, float]:
    """(the time of the computation kernels that ran with communication of their own device over at least
    OVERLAP_MIN_SHARE of their time, all the computation kernels' time), µs over the given steps (device rows by their
    step): how much of a run's computation the collectives beside it share the device with (`trainperf diff`)."""
    dev = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS) & np.isin(t.step, steps))
    comp = dev[compute_mask(t, dev)]
    comm = dev[(t.kind[dev] == KERNEL) & (t.category[dev] == COMMUNICATION)]
    starts, ends = times_us(t)
    dur = ends[comp] - starts[comp]
    beside = beside_share(t, starts, ends, comp, comm) >= OVERLAP_MIN_SHARE
    return float(dur[beside].sum()), float(dur.sum())


def _beside(t: EventTable, w: Window, comm: np.ndarray, slowed: np.ndarray) -> dict[str, float]:
    """collective (crossrank.launch_collectives) -> share of the slowed calls' time (µs) each kind of communication
    kernel ran beside (0-1, over the kinds; {} with no slowed call)."""
    if not slowed.size:
        return {}
    covered = same_device_cover(t, w.ts_us, w.end_us, comm, slowed)
    near = covered > 0  # the collectives beside no slowed call need no reading of what they run
    by_kind: dict[str, float] = {}
    for kind, us in zip(launch_collectives(t, comm[near]), covered[near]):
        by_kind[kind] = by_kind.get(kind, 0.0) + float(us)
    total = sum(by_kind.values())
    return {k: v / total for k, v in by_kind.items() if v > 0} if total > 0 else {}


def backward_kernels(t: EventTable, w: Window) -> np.ndarray:
    """The window's device rows launched inside an autograd node (the backward pass), as launch.launched_inside
    reads them; none where the trace records no node."""
    ops = np.flatnonzero(t.kind == CPU_OP)
    nodes = ops[backward_node_mask(t, ops)]
    return launched_inside(t, w, *row_spans(t, nodes))


def measured_contention(f: RankFacts) -> Contention | None:
    """slowed_by_communication of the rank (None without GPU activity), once per rank: comm_contention reads it, and
    exposed_comm, whose fix puts more computation beside the collectives."""
    if not f.has_gpu:
        return None
    return f.once("contention", lambda: slowed_by_communication(f.table, f.window, f.launching_op()))


def comm_contention(f: RankFacts) -> F.Finding | None:
    """Computation slowed by the communication beside it by at least CONTENTION_MIN_PCT of the window (the module
    docstring says how it is found and priced), or None."""
    c = measured_contention(f)
    if c is None or not c.slowed or f.pct(c.extra_us) < CONTENTION_MIN_PCT:
        return None
    events = [(f"{s.key}: {s.slowdown:.2f}x beside communication ({len(s.overlapped_rows)} calls, "
               f"{s.alone_us:.0f} us alone)", float(f.window.ts_us[s.overlapped_rows[0]]), s.overlapped_us)
              for s in c.slowed[:3]]
    metrics = {"contention_extra_time": (c.extra_us, "us"), "contention_extra_share": (f.pct(c.extra_us), "%"),
               "slowdown_beside_communication": (c.slowdown, "x"),
               "computation_beside_communication": (f.pct(c.overlapped_us), "%"),
               "of_which_compared": (100.0 * c.compared_us / c.overlapped_us, "%"),
               "works_slowed": (len(c.slowed), "count"), "works_compared": (c.works_compared, "count")}
    metrics.update({f"beside_{kind}": (100.0 * share, "% of the slowed time") for kind, share in c.beside.items()})
    changes = tuple(Change("speedup_rows", factor=s.slowdown, rows=s.overlapped_rows) for s in c.slowed)
    found = F.rank_finding(f, "comm_contention", metrics, events, changes=changes, evidence_pct=f.pct(c.extra_us),
                           what_if=f"the computation beside communication as fast as alone ({c.slowdown:.3g}x faster)",
                           upper_bound=True)
    found.recommendation = advice.CONTENTION_BESIDE.get(c.mostly_beside, "") + found.recommendation
    return found
