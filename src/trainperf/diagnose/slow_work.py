"""Whether a slow rank's extra computation is the same work run slower or more work, operation by operation against
the other ranks.

A computation kernel is keyed by the operator that launched it and that operator's recorded input shapes
(record_shapes=True): the same operator on the same shapes, as many times a step, is the same work. Its time on the
slow rank over the others' is the slow rank's pace; its whole computation at that pace is split into what the pace
costs ("device": its clocks held down by power or temperature, a slower or faulty part, another process on the GPU)
and the work the others do less of ("work": longer sequences, experts that draw more tokens, more micro-batches, a
pipeline stage with more layers), whichever is the larger part (WorkComparison says how). A kernel of the same name
can be the same work or the same kernel on larger inputs, so without the shapes only more work at the same pace
(more launches) is named, and a slower kernel says nothing: the cause is left open and the figures stated.

A rank whose host starts the same device work late is compared on its training thread instead (host_work): each
operator's own time, its nested calls' taken out, keyed alike; the calls in which a thread waits (device syncs,
collectives) are left out, as they hold the time the slow rank costs the others.

Hand-written: no profiler tool compares ranks operation by operation (HTA compares two traces' kernel totals,
TraceLens two runs' operator tables); this is the straggler finding's own evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.gpu_time import compute_mask
from trainperf.diagnose.host import SYNC_RUNTIME_RE
from trainperf.diagnose.roofline import launching_op, op_shape, shape_key
from trainperf.diagnose.window import StepMarkers, Window, find_step_markers
from trainperf.trace.categories import ATTENTION_RE, COMM_OP_RE
from trainperf.trace.events import CPU_OP, DEVICE_KINDS, HOST_KINDS, EventTable
from trainperf.trace.nesting import nest, row_spans, thread_key

# a part of the slow ranks' extra computation at least this share of it names its cause (device: in the same work;
# work: in work the others do less of). Half: the larger part decides; stated, not fitted (no labeled trace of a
# throttled GPU is at hand)
CAUSE_MIN_SHARE = 0.5
# at least this share of the slow ranks' computation must be launched by operators with recorded shapes for "the
# same work" to be judged at all (else kernels are keyed by name alone); stated, not fitted
SHAPED_MIN_SHARE = 0.5
# a key runs as many times a step on two ranks when their calls a step differ by less than this (a whole call more
# in some steps of a window reads as a fraction)
SAME_CALLS_TOLERANCE = 0.5
# the part of the same work's slowdown a key must show to count as slowed with it (the breadth test of compare_work):
# half, as the larger part decides elsewhere (CAUSE_MIN_SHARE); stated, not fitted
BROAD_SLOWDOWN_PART = 0.5
# operators whose work is set by their inputs' values, not their shapes: an embedding lookup's rows hit (hot rows,
# duplicates), an index or scatter's collisions, a sort's or a routing's data. The same shapes are not the same work
# there, so they never set the pace; their extra time is work the others had less of
DATA_DEPENDENT_RE = re.compile(r"embedding|lookup|index|scatter|gather|sort|topk|unique|nonzero|bincount|histc"
                               r"|masked_select|segment_reduce|grouped_mm|grouped_gemm|varlen", re.I)
# (grouped products: the tokens each expert gets are offsets' values; variable-length attention: each sequence's
# length is; the shapes are the totals)


@dataclass(kw_only=True, frozen=True)
class RankWork:
    """One rank's computation kernels in its window, a step: {key: (calls, µs)}, the key "operator | shapes" (or
    the kernel's name where the launching operator recorded no shapes), and the share (0-1) of its computation time
    keyed by shapes."""

    per_step: dict[str, tuple[float, float]]
    shaped_share: float

    @property
    def total_us(self) -> float:
        """Computation a step (µs; kernels summed, not their union)."""
        return sum(us for _, us in self.per_step.values())

    @property
    def untraced_us(self) -> float:
        """A training thread's time between traced operators a step (µs; UNTRACED_KEY), 0 for kernels."""
        return self.per_step.get(UNTRACED_KEY, (0.0, 0.0))[1]


@dataclass(kw_only=True, frozen=True)
class WorkComparison:
    """The slow ranks' extra computation a step against the other ranks' (µs), split into the two causes.

    The same work's slowdown r is read on the keys both run as many times a step (their summed time over the others');
    the slow ranks' whole computation at the others' pace is then theirs / r: extra = slow - others =
    slow (1 - 1/r), the same pace lost on all of it, + (slow / r - others), the work the others do less of. Ranks
    that run different shapes anyway (embedding tables sharded unequally) keep their difference in work, not in
    pace; a rank whose every kernel is stretched keeps it in pace, whatever its own shapes."""

    extra_us: float            # their computation a step (their mean) minus the others' (the median rank's)
    slower_extra_us: float     # ... of it from running at the same work's slowdown: slow (1 - 1/r)
    more_work_extra_us: float  # ... the rest: more work, timed at the others' pace (slow / r - others)
    same_work_slowdown: float  # r: over the keys run as often on both, their summed time / the others'
    shaped: bool               # keys carry shapes (SHAPED_MIN_SHARE), so "the same work" is the same work
    by_key: dict[str, tuple[float, float]]  # key -> (µs a step on the slow ranks, on the others)

    def by_operator(self) -> dict[str, tuple[float, float, str]]:
        """The keys summed by operator (by kernel where no shapes key it): operator -> (µs a step on the slow ranks, on
        the others, the shapes of its key holding most of the extra, "" where none or not shaped). Net of shapes:
        ranks running an operator on other shapes (their own shards) differ by the operator's totals."""
        out: dict[str, tuple[float, float, str, float]] = {}
        for key, (m, o) in self.by_key.items():
            parts = key.split(" | ")
            op, shapes = (parts[0], parts[1]) if len(parts) == 3 else (key, "")
            a, b, top, top_extra = out.get(op, (0.0, 0.0, "", 0.0))
            if shapes and m - o > top_extra:
                top, top_extra = shapes, m - o
            out[op] = (a + m, b + o, top, top_extra)
        return {op: (a, b, top) for op, (a, b, top, _) in out.items()}

    def largest_extra(self, top: int = 3) -> list[tuple[str, float, float, str]]:
        """The operators holding most of the extra, largest first: (operator, µs a step on the slow ranks, on the
        others, the shapes holding most of its extra) (by_operator)."""
        ops = self.by_operator()
        return [(op, *ops[op]) for op in sorted((op for op, (m, o, _) in ops.items() if m > o),
                                                key=lambda op: ops[op][1] - ops[op][0])[:top]]

    def precision_moves(self) -> tuple[float, list[tuple[str, str, str, str]]]:
        """The same operators on the same dims at another precision: (the µs a step the more-computing side spends on
        them beyond the other side's time on their other-precision twins, [(operator, dims, its precision, the other
        side's)] largest first). Keys carry their precision after the dims (roofline.shape_key: "[m, k] x [k, n]
        bf16"); kernels keyed by name alone have none, and give (0, [])."""
        split = {}
        for key, (m, o) in self.by_key.items():
            parts = key.split(" | ")
            if len(parts) == 3 and " " in parts[1] and not parts[1].endswith("]"):
                dims, prec = parts[1].rsplit(" ", 1)
                a, b = split.get((parts[0], dims, prec), (0.0, 0.0))
                split[(parts[0], dims, prec)] = (a + m, b + o)
        moves = []
        for (op, dims, prec), (m, o) in split.items():
            twins = [(p, b) for (op2, dims2, p), (_, b) in split.items() if (op2, dims2) == (op, dims) and p != prec]
            if m > o and twins:
                other, theirs = max(twins, key=lambda x: x[1])
                if theirs > 0:
                    moves.append((m - theirs, op, dims, prec, other))
        moves.sort(key=lambda x: -x[0])
        return sum(x[0] for x in moves), [(op, dims, prec, other) for _, op, dims, prec, other in moves]

    @property
    def cause(self) -> str:
        """"device" (the same work slower), "work" (more work) or "" (open: mixed, or no shapes to tell the same
        work from larger inputs of the same kernel)."""
        if self.extra_us <= 0:
            return ""
        if self.more_work_extra_us >= CAUSE_MIN_SHARE * self.extra_us:
            return "work"
        if self.shaped and self.slower_extra_us >= CAUSE_MIN_SHARE * self.extra_us:
            return "device"
        return ""

    def share(self, part_us: float) -> float:
        """part_us as % of the extra computation, within 0-100 (a rank that runs a little less of other work has
        more pace lost than extra computation)."""
        return min(max(100.0 * part_us / self.extra_us, 0.0), 100.0) if self.extra_us > 0 else 0.0


def _kernel_keys(t: EventTable, w: Window) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """The window's computation kernels: (rows, their keys as the module says, their µs, whether keyed by shapes)."""
    rows = w.device[compute_mask(t, w.device)] if w.device.size else w.device
    keys, shaped = work_keys(t, rows)
    return rows, keys, w.end_us[rows] - w.ts_us[rows], shaped


def work_keys(t: EventTable, rows: np.ndarray, launching: np.ndarray | None = None) -> tuple[list[str], np.ndarray]:
    """The keys of these kernel rows (module docstring: the same key is the same work) and whether each is keyed by
    shapes; launching: roofline.launching_op of t, where the caller has it."""
    ops = (launching_op(t) if launching is None else launching)[rows] if rows.size else rows
    keys: list[str] = []
    shaped = np.zeros(rows.size, dtype=bool)
    shapes: dict[int, str | None] = {}  # one operator row launches several kernels: its shapes read once
    for i, (row, op) in enumerate(zip(rows.tolist(), ops.tolist())):
        if op >= 0 and op not in shapes:
            s = op_shape(t, op)
            shapes[op] = f"{s.name} | {shape_key(s)}" if s is not None else None
        key = shapes.get(op) if op >= 0 else None
        shaped[i] = key is not None
        # the kernel's own name beside its operator's: one operator may launch several kernels of a step
        keys.append(f"{key} | {t.names[int(t.name[row])]}" if key is not None else t.names[int(t.name[row])])
    return keys, shaped


def steps_work(t: EventTable, steps: np.ndarray) -> RankWork:
    """The computation kernels the given steps launched (EventTable.step), keyed as the module says, a step (their
    recorded durations; `trainperf diff`'s kept steps)."""
    dev = np.flatnonzero(np.isin(t.kind, DEVICE_KINDS) & np.isin(t.step, steps))
    rows = dev[compute_mask(t, dev)] if dev.size else dev
    keys, shaped = work_keys(t, rows)
    return _work(keys, t.dur_ns[rows] / 1e3, shaped, len(steps))


def _work(keys: list[str], durs: np.ndarray, shaped: np.ndarray, steps: int) -> RankWork:
    """RankWork of the kernels given (their keys, µs, shapes known), divided over `steps` steps."""
    n = max(steps, 1)
    per_step: dict[str, tuple[float, float]] = {}
    for key, us in zip(keys, durs.tolist()):
        calls, total = per_step.get(key, (0.0, 0.0))
        per_step[key] = (calls + 1.0 / n, total + us / n)
    total_us = float(durs.sum())
    return RankWork(per_step=per_step, shaped_share=float(durs[shaped].sum()) / total_us if total_us > 0 else 0.0)


def rank_work(t: EventTable, w: Window, steps: int) -> RankWork:
    """The rank's computation kernels in its window keyed as the module says, divided over `steps` steps."""
    _, keys, durs, shaped = _kernel_keys(t, w)
    return _work(keys, durs, shaped, steps)


def step_work(t: EventTable, w: Window) -> dict[int, RankWork]:
    """The rank's computation kernels in its window, keyed as the module says, per step that launched them (step ->
    RankWork of that one step; kernels launched outside every step left out)."""
    rows, keys, durs, shaped = _kernel_keys(t, w)
    step = t.step[rows]
    keep = np.flatnonzero(step >= 0)
    return _work_by_step([keys[i] for i in keep.tolist()], durs[keep], shaped[keep], step[keep])


def _work_by_step(keys: list[str], durs: np.ndarray, shaped: np.ndarray, of_step: np.ndarray) -> dict[int, RankWork]:
    """{step: RankWork of that one step} of the keyed rows given (their keys, µs, shapes known, step of each)."""
    out = {}
    for s in np.unique(of_step).tolist():
        sel = np.flatnonzero(of_step == s)
        out[int(s)] = _work([keys[i] for i in sel.tolist()], durs[sel], shaped[sel], 1)
    return out


# a rank's training thread, the host side of its work: its operators' own time (their nested calls' taken out), by
# operator and shapes, in the analysed steps; the time the thread waits is left out: device syncs (the waiting ranks
# block there for the late one's GPU) and collectives (there for the late rank itself)
UNTRACED_KEY = "time between traced operators (Python the profiler does not record)"


# a framework's record function named for the collective it wraps (FSDP2's "FSDP::all_gather (layers.1)"): the
# collective's wait for the other ranks is in its own time (not its copy-out, "FSDP::all_gather_copy_out", work)
COLLECTIVE_SPAN_RE = re.compile(r"(?<![a-z])(all_?gather|reduce_?scatter|all_?reduce|all_?to_?all|broadcast|barrier)"
                                r"(?![a-z_])", re.I)


def _host_wait(name: str) -> bool:
    """Whether a host call's time is waiting, not work: a device sync, or a collective's call or span (COMM_OP_RE,
    COLLECTIVE_SPAN_RE)."""
    return bool(SYNC_RUNTIME_RE.match(name) or COMM_OP_RE.search(name) or COLLECTIVE_SPAN_RE.search(name))


def _host_keys(t: EventTable, markers: StepMarkers, steps):
    """The training thread's own time in the given steps (their numbers; the markers' host ProfilerStep spans):
    (keys as the module says, µs, shaped, the step of each, the steps found), or None without any of them."""
    analysed = np.isin(markers.numbers, list(steps))
    step_rows, numbers = markers.host_rows[analysed].astype(np.int64), markers.numbers[analysed]
    if not step_rows.size:
        return None
    loop = thread_key(t.pid[step_rows[:1]], t.tid[step_rows[:1]])[0]
    lo, hi = int(t.ts_ns[step_rows].min()), int((t.ts_ns[step_rows] + t.dur_ns[step_rows]).max())
    rows = np.flatnonzero(np.isin(t.kind, HOST_KINDS) & (thread_key(t.pid, t.tid) == loop) & (t.ts_ns >= lo)
                          & (t.ts_ns < hi))
    n = nest(*row_spans(t, rows))
    rows = rows[n.order]
    own = (n.end - n.start).astype(float)
    inner = n.parent >= 0
    np.subtract.at(own, n.parent[inner], (n.end - n.start)[inner].astype(float))  # its nested calls' time out
    # each row's step: the last step span started at or before it (the analysed steps follow one another)
    order = np.argsort(t.ts_ns[step_rows], kind="stable")
    starts, in_order = t.ts_ns[step_rows][order], numbers[order]
    step_at = in_order[np.maximum(np.searchsorted(starts, t.ts_ns[rows], side="right") - 1, 0)].tolist()
    step_set = set(step_rows.tolist())
    keys, durs, shaped, of_step = [], [], [], []
    for row, us, step in zip(rows.tolist(), (np.maximum(own, 0.0) / 1e3).tolist(), step_at):
        name = t.names[int(t.name[row])]
        if row not in step_set and _host_wait(name):
            continue
        s = op_shape(t, row) if t.kind[row] == CPU_OP else None
        # keyed as a kernel is ("operator | shapes | what ran it"), or by name alone
        keys.append(UNTRACED_KEY if row in step_set else f"{name} | {shape_key(s)} | host" if s is not None else name)
        durs.append(us)
        shaped.append(s is not None and row not in step_set)
        of_step.append(int(step))
    return keys, np.array(durs), np.array(shaped, dtype=bool), np.array(of_step, dtype=np.int64), step_rows.size


def host_work(t: EventTable, w: Window) -> RankWork | None:
    """The training thread's own work in the window's analysed steps (the thread of the ProfilerStep spans), keyed
    by operator and shapes (the operator's name where none are recorded; a step span's own time, between the traced
    operators, as UNTRACED_KEY), a step; None without analysed steps."""
    return host_steps_work(t, w.steps, w.markers)


def host_steps_work(t: EventTable, steps, markers: StepMarkers | None = None) -> RankWork | None:
    """host_work over the given steps (their ProfilerStep numbers; markers: the rank's, found when not given: `trainperf
    diff`'s kept steps), a step; None without any of them."""
    got = _host_keys(t, markers if markers is not None else find_step_markers(t), steps)
    if got is None:
        return None
    keys, durs, shaped, _, found = got
    return _work(keys, durs, shaped, found)


def host_step_work(t: EventTable, w: Window) -> dict[int, RankWork]:
    """host_work per analysed step (step -> RankWork of that one step); {} without analysed steps."""
    got = _host_keys(t, w.markers, w.steps)
    if got is None:
        return {}
    keys, durs, shaped, of_step, _ = got
    return _work_by_step(keys, durs, shaped, of_step)


def compare_work(slow: list[RankWork], others: list[RankWork], waits_untraced: bool = False) -> WorkComparison | None:
    """The slow ranks' computation (their mean, key by key) against the other ranks' (their median, key by key);
    None without both. waits_untraced: training threads compared (host_work) whose waits for the slow ranks may fall
    between traced operators (a CPU job's gloo waits inside DDP's hooks): the other ranks' untraced time beyond the
    slow ranks' is their waiting, not work, and is left out (capped at the slow ranks')."""
    if not slow or not others:
        return None
    if waits_untraced:
        cap = float(np.mean([w.untraced_us for w in slow]))
        others = [_untraced_capped(w, cap) for w in others]
    keys = sorted({k for w in slow + others for k in w.per_step})

    def typical(works: list[RankWork], pick) -> dict[str, tuple[float, float]]:
        return {k: (float(pick([w.per_step.get(k, (0.0, 0.0))[0] for w in works])),
                    float(pick([w.per_step.get(k, (0.0, 0.0))[1] for w in works]))) for k in keys}

    mine, theirs = typical(slow, np.mean), typical(others, np.median)
    same = [k for k in keys if theirs[k][1] > 0 and abs(mine[k][0] - theirs[k][0]) < SAME_CALLS_TOLERANCE
            and k != UNTRACED_KEY and not DATA_DEPENDENT_RE.search(k.split(" | ")[0])]
    # the same work's time on the slow ranks over the others' (the ratios' mean weighted by the others' time): every
    # key run alike counts at its own ratio, so ops slowed unequally (memory-bound ones more, on shared cores or a
    # throttled GPU) add up, and the extra of those keys is all in the pace
    theirs_same = sum(theirs[k][1] for k in same)
    slowdown = sum(mine[k][1] for k in same) / theirs_same if theirs_same > 0 else 1.0
    # a slower device or CPU slows its work broadly: at least CAUSE_MIN_SHARE of the same work's time (the others')
    # in keys slowed at least BROAD_SLOWDOWN_PART of the whole slowdown; one operator slowed alone is slowed by its
    # inputs' values, which its shapes do not show (a kind DATA_DEPENDENT_RE does not know): work, not pace
    bar = 1.0 + BROAD_SLOWDOWN_PART * (slowdown - 1.0)
    broad = sum(theirs[k][1] for k in same if mine[k][1] >= bar * theirs[k][1]) >= CAUSE_MIN_SHARE * theirs_same
    pace = max(slowdown, 1.0) if broad else 1.0  # a faster same work is no device's slowness: the extra is work
    # totals rank by rank: ranks whose shapes differ anyway (shards) have keys of their own, so a sum of per-key
    # medians would leave out the others' own work
    slow_us = float(np.mean([w.total_us for w in slow]))
    others_us = float(np.median([w.total_us for w in others]))
    return WorkComparison(extra_us=slow_us - others_us, slower_extra_us=slow_us * (1.0 - 1.0 / pace),
                          more_work_extra_us=slow_us / pace - others_us, same_work_slowdown=slowdown,
                          shaped=min(w.shaped_share for w in slow) >= SHAPED_MIN_SHARE,
                          by_key={k: (mine[k][1], theirs[k][1]) for k in keys})


def merge_comparisons(parts: list[WorkComparison]) -> WorkComparison | None:
    """Comparisons of separate steps (each a step's late rank against the others in that step) as one, a step of
    them on average: the extra, its parts and the keys' time their mean, the pace the steps' own weighted by the
    others' work in them; None without any."""
    if not parts:
        return None
    n = len(parts)
    by_key: dict[str, tuple[float, float]] = {}
    for c in parts:
        for k, (m, o) in c.by_key.items():
            a, b = by_key.get(k, (0.0, 0.0))
            by_key[k] = (a + m / n, b + o / n)
    weights = np.array([sum(o for _, o in c.by_key.values()) for c in parts])
    paces = np.array([c.same_work_slowdown for c in parts])
    return WorkComparison(extra_us=sum(c.extra_us for c in parts) / n,
                          slower_extra_us=sum(c.slower_extra_us for c in parts) / n,
                          more_work_extra_us=sum(c.more_work_extra_us for c in parts) / n,
                          same_work_slowdown=float(np.average(paces, weights=weights)) if weights.sum() > 0 else 1.0,
                          shaped=all(c.shaped for c in parts), by_key=by_key)


# what the work a slow rank has more of is, by its operators: an attention's cost grows with the square of each
# sequence's length, the experts' products with the tokens routed to them, a table's lookups with its shard's traffic
WORK_KINDS = {"attention": ATTENTION_RE,
              "experts": re.compile(r"grouped_mm|grouped_gemm|moe|expert|(?<![a-z])fmoe|megablocks"
                                    r"|(?<![a-z])gmm(?![a-z])", re.I),
              # sharded embedding tables (TorchRec / FBGEMM's table-batched lookups)
              "embeddings": re.compile(r"embedding|SplitLookup|split_embedding|table_batched", re.I)}


def work_kind(c: WorkComparison) -> str:
    """"attention", "experts" or "embeddings" where operators of that kind (their extra net of shapes: by_operator)
    hold most of the extra computation (CAUSE_MIN_SHARE of it), else ""."""
    ops = c.by_operator()
    for kind, pattern in WORK_KINDS.items():
        extra = sum(m - o for op, (m, o, _) in ops.items() if m > o and pattern.search(op))
        if c.extra_us > 0 and extra >= CAUSE_MIN_SHARE * c.extra_us:
            return kind
    return ""


def waits_left_out(works: list[RankWork]) -> list[RankWork]:
    """One job's training threads (host_work, a rank each) with each one's untraced time a step capped at the least of
    theirs: the ranks wait for the slowest between traced operators too (a CPU job's gloo waits inside DDP's hooks),
    and the slowest, waited for, waits least; what the others spend there beyond it is their waiting, not work."""
    if len(works) < 2:
        return works
    cap = min(w.untraced_us for w in works)
    return [_untraced_capped(w, cap) for w in works]


def _untraced_capped(w: RankWork, cap_us: float) -> RankWork:
    """w with its untraced time a step (UNTRACED_KEY) at most cap_us."""
    if w.untraced_us <= cap_us:
        return w
    return RankWork(per_step={**w.per_step, UNTRACED_KEY: (w.per_step[UNTRACED_KEY][0], cap_us)},
                    shaped_share=w.shaped_share)
