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

import re
from dataclasses import dataclass, field

import numpy as np

from trainperf.diagnose.host import STALL_SPAN_RES
from trainperf.diagnose.window import Window, analysis_window, iteration_hint_rows, union_us
from trainperf.trace.annotate import STEP_RE, correlated_host_row, step_numbers, step_rows
from trainperf.trace.categories import COMM_OP_RE, collective_type
from trainperf.trace.events import COMMUNICATION, CPU_OP, KERNEL, USER_ANNOTATION, EventTable
from trainperf.trace.nesting import enclosing_span, thread_key


def collective_rows(t: EventTable, w: Window) -> dict[str, np.ndarray]:
    """Window communication kernels of a rank grouped by process group and collective type
    ("pg/all_reduce", or "all_reduce" when the trace names no process group), in issue order (rows)."""
    rows = w.device[(t.category[w.device] == COMMUNICATION) & (t.kind[w.device] == KERNEL)]
    return group_collective_rows(t, rows[np.argsort(w.ts_us[rows], kind="stable")])


def launch_collectives(t: EventTable, rows: np.ndarray) -> list[str]:
    """Per communication kernel row: the collective it runs ("all_to_all", ...). From the kernel's own
    "Collective name" arg; else from the host op its launch is inside, the innermost collective op
    (trace.categories.COMM_OP_RE) that names a known collective by its arg or its name: NCCL runs all-to-all,
    and in some versions all-reduce, reduce-scatter and all-gather, as ncclKernel_SendRecv_* kernels, which
    are point-to-point only by name (HTA's negative_queue trace: 65 of 80 SendRecv kernels are launched inside
    c10d::alltoall_base_, _reduce_scatter_base_, allreduce_ or _allgather_base_); record_param_comms without
    args names none. Else from the kernel's name. A kernel's own arg naming only a coalesced group reads as absent:
    the kernel of a coalesced group (batch_isend_irecv's send/recv, a coalesced all-gather), launched as the group
    ends inside "nccl:coalesced", may carry the group's name, not its collective's."""
    own = [int(t.collective[r]) for r in rows]
    own = [-1 if c >= 0 and _coalesced_only(t.names[c]) else c for c in own]
    out = [t.names[c] if c >= 0 else "" for c in own]
    todo = [i for i, c in enumerate(own) if c < 0]
    if todo:
        known = np.array([collective_type(n) != "unknown" for n in t.names])
        op_named = np.where(t.collective >= 0, t.collective, t.name)   # an op's collective: its arg, else its name
        ops = np.flatnonzero(np.isin(t.name, t.ids_matching(COMM_OP_RE.search)) & (t.stream < 0)
                             & np.isin(t.kind, (CPU_OP, USER_ANNOTATION)) & known[op_named])
        launch = correlated_host_row(t)[rows[todo]] if ops.size else np.full(len(todo), -1)
        has = launch >= 0
        hit = np.full(len(todo), -1)
        if has.any():
            key = thread_key(t.pid, t.tid)
            hit[has] = enclosing_span(key[ops], t.ts_ns[ops], t.ts_ns[ops] + t.dur_ns[ops], key[launch[has]],
                                      t.ts_ns[launch[has]])
        for i, h in zip(todo, hit):
            out[i] = t.names[int(op_named[ops[h]])] if h >= 0 else t.names[int(t.name[rows[i]])]
    return [collective_type(n) for n in out]


def _coalesced_only(name: str) -> bool:
    """Whether a collective's name is a coalesced group's that names no collective ("coalesced", "nccl:coalesced";
    not "allreduce_coalesced")."""
    return "coalesced" in name.lower() and collective_type(name) == "unknown"


def group_collective_rows(t: EventTable, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Communication kernel rows (in issue order) grouped by "<process group>/<collective>"
    ("all_reduce" alone when the trace names no process group), order kept; the collective as
    launch_collectives finds it."""
    groups: dict[str, list[int]] = {}
    for r, kind in zip(rows, launch_collectives(t, rows)):
        pg = int(t.process_group[r])
        groups.setdefault(f"{t.names[pg]}/{kind}" if pg >= 0 else kind, []).append(int(r))
    return {k: np.array(v, dtype=np.int64) for k, v in groups.items()}


def group_kind(key: str) -> str:
    """The collective of a group_collective_rows key ("pg/all_reduce" or "all_reduce" -> "all_reduce")."""
    return key.rsplit("/", 1)[-1]


P2P_KIND = "send_recv"  # collective_type of send/recv kernels (ncclKernel_SendRecv, ncclDevKernel_SendRecv)


@dataclass
class MatchedCollective:
    """One collective seen on every rank: arrival (kernel start, µs, aligned) and wait per rank."""

    kind: str
    seq: int
    start_us: dict[int, float]
    wait_us: dict[int, float]
    last_rank: int
    rows: dict[int, int] = field(default_factory=dict)  # trace row of this collective's kernel on each rank


@dataclass(kw_only=True)
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
    point_to_point: bool = False  # some rank's collectives are send/recv (pipeline stages), never matched

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
    """Per-rank clock offset (µs): collectives end together on every rank, so the end differences of matched
    collectives against the first rank agree on that rank's clock skew (consensus_offset: the value most of them
    agree on, as pairs matched by order across process groups the trace does not name do not end together).
    Also the spread of all the differences (interquartile range, µs): how well one offset explains them."""
    off = {r: 0.0 for r in ranks}
    spread = {r: 0.0 for r in ranks}
    ref = ranks[0]
    for r in ranks[1:]:
        diffs, durs = [], []
        for kind, rows_ref in groups[ref].items():
            rows_r = groups[r].get(kind)
            if rows_r is None:
                continue
            n = min(len(rows_ref), len(rows_r))
            a, b = windows[ref], windows[r]
            diffs.extend(b.end_us[rows_r[:n]] - a.end_us[rows_ref[:n]])
            durs.extend(np.minimum(b.end_us[rows_r[:n]] - b.ts_us[rows_r[:n]],
                                   a.end_us[rows_ref[:n]] - a.ts_us[rows_ref[:n]]))
        off[r] = consensus_offset(np.array(diffs), np.array(durs)) if diffs else 0.0
        spread[r] = float(np.subtract(*np.percentile(diffs, [75, 25]))) if diffs else 0.0
    return off, spread


def consensus_offset(diffs_us: np.ndarray, durs_us: np.ndarray) -> float:
    """The clock offset (µs) most matched pairs agree on: for each pair's end difference, the pairs whose
    difference is within their end tolerance of it (end_tolerance_us); the median of the largest such set's
    differences. Equals the median of all differences when every pair is one collective, and when no two
    pairs agree."""
    d = np.asarray(diffs_us, dtype=float)
    tol = end_tolerance_us(np.asarray(durs_us, dtype=float))
    agree = np.abs(d[None, :] - d[:, None]) <= tol[None, :]
    best = agree[int(np.argmax(agree.sum(axis=1)))]
    return float(np.median(d[best] if best.sum() >= 2 else d))  # no two pairs agree: no consensus, the median


# ranks leave a collective together: its last data reaches every rank within one step's latency (µs over NVLink,
# tens of µs between nodes), plus what the clock alignment leaves; matched by order, two kernels that end further
# apart than the larger of these are not one collective (HTA trace_filter, ranks 0-1 of 128 without process-group
# names: 4 of 10 SendRecv pairs end within 0.4 ms on 42-63 ms kernels, the other 6 are 13.9-134 ms apart)
MATCH_END_MIN_US = 100.0
MATCH_END_SHARE = 0.05  # of the shorter kernel


def end_tolerance_us(shortest_us):
    """How far apart (µs) the kernels of one collective may end: MATCH_END_MIN_US or MATCH_END_SHARE of the
    shortest of them, whichever is larger (scalar or array)."""
    return np.maximum(MATCH_END_MIN_US, MATCH_END_SHARE * np.asarray(shortest_us, dtype=float))


def ends_agree(ends_us: dict[int, float], durs_us: dict[int, float]) -> bool:
    """Whether kernels matched as one collective end together (aligned clocks, µs), within end_tolerance_us."""
    return max(ends_us.values()) - min(ends_us.values()) <= float(end_tolerance_us(min(durs_us.values())))


def laggards(collectives: list[MatchedCollective], step_of) -> dict:
    """Per step: the rank whose late arrival made the others wait most inside that step's matched collectives, and
    that wait (µs, summed over the waiting ranks); steps where nobody waited are left out. step_of(collective) ->
    the step it belongs to (api: the ProfilerStep of its launch; a trace without steps gives each collective its
    own key). A straggler is the same rank here step after step; under load imbalance it changes."""
    caused: dict = {}
    for c in collectives:
        w = sum(c.wait_us.values())
        if w > 0:
            per = caused.setdefault(step_of(c), {})
            per[c.last_rank] = per.get(c.last_rank, 0.0) + w
    return {s: max(per.items(), key=lambda kv: kv[1]) for s, per in caused.items()}


def laggard_p_value(times_last: int, steps: int, n_ranks: int) -> float:
    """The chance (0..1) that ranks taking turns at random (each the laggard of a step with probability 1/n_ranks)
    make one of them the laggard in times_last or more of `steps` steps: a one-sided binomial test
    (scipy.stats.binomtest), times n_ranks (the rank tested is the one with the most: Bonferroni over the ranks).
    1.0 with no step. The smallest value `steps` steps allow is n_ranks^(1 - steps)."""
    from scipy.stats import binomtest  # here: scipy.stats costs ~0.3 s to import, most traces need none

    if steps <= 0 or n_ranks < 2:
        return 1.0
    return float(min(1.0, n_ranks * binomtest(times_last, steps, 1.0 / n_ranks, alternative="greater").pvalue))


def persistent_laggard(times_last: int, steps: int, n_ranks: int, alpha: float) -> bool:
    """Whether the rank the others waited for most is a straggler rather than one of ranks taking turns: its share
    of the steps beyond chance (laggard_p_value <= alpha), or, where the steps are too few for the test to pass at
    all (2 ranks, 5 steps: p >= 0.0625), the laggard in a majority of them."""
    if n_ranks < 2 or steps <= 0:
        return True
    if float(n_ranks) ** (1 - steps) <= alpha:
        return laggard_p_value(times_last, steps, n_ranks) <= alpha
    return times_last > steps / 2


def lateness_by_step(collectives: list[MatchedCollective], step_of) -> dict:
    """Per step: {rank: µs it arrived after the earliest rank of each of the step's matched collectives, summed}
    (clock-aligned arrivals: MatchedCollective.start_us); step_of as laggards'."""
    out: dict = {}
    for c in collectives:
        first = min(c.start_us.values())
        per = out.setdefault(step_of(c), {})
        for r, t in c.start_us.items():
            per[r] = per.get(r, 0.0) + t - first
    return out


SLOW_RANKS_DRAWS = 9999  # random within-step permutations for slow_ranks' p-values (their floor: 1e-4)
# ... below this many steps (blocks); from it on, Friedman's chi-square approximation: the permutations of 20 steps of
# 64 ranks hold 12.8M positions (100 MB), and the approximation is good with this many blocks
FRIEDMAN_CHI2_MIN_BLOCKS = 20


def arrival_order_p_value(late_us: np.ndarray) -> float:
    """The chance (0..1) that ranks equally fast give an order of arrival this consistent from step to step
    (late_us: steps x ranks, µs): Friedman's test of the ranks' positions within each step (the steps as blocks;
    statistic: the sum over ranks of their squared position sums, ties averaged), its p-value from SLOW_RANKS_DRAWS
    draws that permute each step's positions among the ranks (the null: any order as likely in each step); with
    FRIEDMAN_CHI2_MIN_BLOCKS blocks or more (a trace without steps: one block per collective), the chi-square
    approximation (scipy.stats.friedmanchisquare, tie-corrected), accurate there and without the draws' memory. 1.0
    with fewer than 2 steps or 3 ranks."""
    from scipy.stats import friedmanchisquare, rankdata  # here: scipy.stats costs ~0.3 s to import

    if late_us.ndim != 2 or late_us.shape[0] < 2 or late_us.shape[1] < 3:
        return 1.0
    if late_us.shape[0] >= FRIEDMAN_CHI2_MIN_BLOCKS:
        with np.errstate(invalid="ignore", divide="ignore"):
            p = friedmanchisquare(*late_us.T).pvalue
        return float(p) if np.isfinite(p) else 1.0  # nan: every step's positions tied
    pos = rankdata(late_us, axis=1)
    observed = float((pos.sum(axis=0) ** 2).sum())
    # the permutations drawn directly, all at once (scipy.stats.permutation_test draws each step's permutation of
    # 64 ranks in Python: 2.6 s for 16 ranks against 0.01 s here); the p-value as permutation_test gives it
    draws = np.random.default_rng(0).permuted(np.broadcast_to(pos, (SLOW_RANKS_DRAWS, *pos.shape)), axis=-1)
    null = (draws.sum(axis=1) ** 2).sum(axis=-1)
    return float((1 + np.count_nonzero(null >= observed * (1 - 1e-12))) / (SLOW_RANKS_DRAWS + 1))


def _upper_class(values: np.ndarray) -> np.ndarray:
    """Positions (into values) of the values above the widest gap between consecutive sorted values, or none when
    that leaves more than half of them above (a group of slow ranks is the minority; where most ranks are late
    together the odd ones out are fast). A natural break, not a threshold: Otsu's between-class variance was tried
    first and split the fast ranks' own spread when one or four ranks of 64 were slow and every rank's time varied
    by as much as their slowness."""
    order = np.argsort(values, kind="stable")
    split = 1 + int(np.argmax(np.diff(values[order])))
    return order[split:] if len(values) - split <= len(values) / 2 else order[:0]


def slow_ranks(late: dict, last: dict, alpha: float) -> tuple[list[int], float]:
    """The ranks late at the collectives step after step, as a group ([] when none), and the test's p-value.

    Ranks that take turns being the last (load imbalance: unequal work per step) and a group of ranks each late in
    every step (a slow node: its GPUs throttled, a slower link, a shared host), each of them the last in some steps
    by jitter, look alike to the laggard count (persistent_laggard: no one rank is the last in most steps). They
    differ in whether the ranks' order of arrival holds from step to step (arrival_order_p_value). When it holds
    (p <= alpha), the group is the ranks whose mean lateness lies above the widest gap, at most half of the ranks
    (_upper_class; else the odd ones out are fast, and their waits are their own idle; lateness, not positions,
    because the fast ranks' positions spread over the whole lower range by jitter while their lateness stays near
    zero). A consistent order alone is not a slow group (a clock offset the alignment left, a rank that logs 50 µs
    before each collective keep one too): the group must also be what the others wait for, the laggard of a
    majority of the steps with waits (last: laggards). Compares the ranks that arrived in every step of `late`
    (lateness_by_step); needs >= 3 of them and >= 2 steps, else ([], 1.0)."""
    ranks = sorted(set.intersection(*[set(v) for v in late.values()])) if late else []  # in every step
    if len(ranks) < 3 or len(late) < 2:
        return [], 1.0
    x = np.array([[per[r] for r in ranks] for per in late.values()])  # steps x ranks, µs
    p_value = arrival_order_p_value(x)
    if p_value > alpha:
        return [], p_value
    members = sorted(int(ranks[i]) for i in _upper_class(x.mean(axis=0)))
    waited_for = sum(1 for r, _ in last.values() if r in members)
    if not members or waited_for <= len(last) / 2:
        return [], p_value
    return members, p_value


def lateness_share(last: dict, per_step: dict[int, dict], n_ranks: int) -> float | None:
    """How much of the laggards' lateness a per-step measure's excess accounts for (0-1): over the steps of `last`
    (laggards: step -> (rank, wait summed over the waiting ranks)) that every rank's measure (per_step: {rank:
    {step: µs}}, e.g. compute_per_step's computation, or the GPU's idle waiting for the host) has,
    sum(min(extra, lateness)) / sum(lateness), where lateness is the mean wait of the other ranks (wait / (n_ranks -
    1)) and extra the laggard's measure in that step beyond the other ranks' median. For computation: near 1, the
    late rank had more work (unequal work per step); near 0, the same work started late. None when no such step (a
    trace without steps keys its collectives as steps: compute_before_collectives gives the measure per collective)."""
    per = {r: v for r, v in per_step.items() if v}
    if len(per) < 2 or n_ranks < 2:
        return None
    num = den = 0.0
    for step, (rank, wait) in last.items():
        if rank not in per or not all(step in v for v in per.values()):
            continue
        late = wait / (n_ranks - 1)
        extra = per[rank][step] - float(np.median([v[step] for r, v in per.items() if r != rank]))
        num += min(max(extra, 0.0), late)
        den += late
    return num / den if den > 0 else None


def comm_waits(xr: "CrossRank", rank: int) -> dict[int, tuple[float, int]]:
    """For one rank: trace row of each matched collective kernel -> (µs waited inside it, rank waited for)."""
    return {c.rows[rank]: (c.wait_us[rank], c.last_rank) for c in xr.collectives
            if rank in c.rows and c.wait_us.get(rank, 0.0) > 0}


def cross_rank(tables: dict[int, EventTable], windows: dict[int, Window], compute_us: dict[int, float],
               busy_us: dict[int, float]) -> CrossRank:
    """Match collectives across ranks and measure stragglers (µs); needs >= 2 ranks for waits."""
    ranks = sorted(tables)
    groups = {r: collective_rows(tables[r], windows[r]) for r in ranks}
    # point-to-point kernels pair with one partner (a pipeline stage, maybe outside the trace), not with
    # the k-th kernel of every rank: matching them by issue order would invent waits and clock offsets
    p2p = sorted({k for g in groups.values() for k in g if k.endswith(P2P_KIND)})
    groups = {r: {k: v for k, v in g.items() if not k.endswith(P2P_KIND)} for r, g in groups.items()}
    t0, spread = _clock_offsets(tables, windows, groups, ranks)
    matched: list[MatchedCollective] = []
    unmatched: dict[str, dict[int, int]] = {}
    wait = {r: 0.0 for r in ranks}
    caused = {r: 0.0 for r in ranks}
    apart: dict[str, int] = {}
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
                ends = {}
                for r in members:
                    row = groups[r][kind][k]
                    w = windows[r]
                    starts[r] = float(w.ts_us[row] - t0[r])
                    durs[r] = float(w.end_us[row] - w.ts_us[row])
                    ends[r] = float(w.end_us[row] - t0[r])
                if not ends_agree(ends, durs):
                    apart[kind] = apart.get(kind, 0) + 1
                    continue
                last = max(starts, key=starts.get)
                waits = {r: min(max(0.0, starts[last] - starts[r]), durs[r]) for r in members}
                for r in members:
                    wait[r] += waits[r]
                caused[last] += sum(waits.values())
                matched.append(MatchedCollective(kind, k, starts, waits, last,
                                                 {r: int(groups[r][kind][k]) for r in members}))
        if apart:
            notes.append("collectives matched by order that do not end together were left unmatched ("
                         + ", ".join(f"{k} {n}" for k, n in sorted(apart.items())) + "): another process group's "
                         "collective of the same type, which the trace does not name")
        if unmatched:
            notes.append("collective counts differ across ranks for " + ", ".join(sorted(unmatched))
                         + ": matched by order up to the smallest count")
        if p2p:
            notes.append("point-to-point communication (" + ", ".join(p2p) + ") is not matched across ranks "
                         "(its partners are not known from the trace): no straggler wait or clock offset from it")
    else:
        notes.append("one rank: cross-rank analyses need traces of at least two ranks")
    return CrossRank(collectives=matched, unmatched=unmatched, wait_by_rank_us=wait,
                     caused_by_rank_us=caused if len(ranks) >= 2 else {}, busy_by_rank_us=busy_us,
                     compute_by_rank_us=compute_us, notes=notes, clock_offset_us=t0, clock_spread_us=spread,
                     point_to_point=bool(p2p))


# --- CPU-only ranks (gloo): where each rank spends its step --------------------------------------------

# ops inside which the training-loop thread waits for a collective of another thread (DDP's buffer
# broadcast in forward, the reducer's all-reduce at the end of backward, explicit c10d calls / waits)
BLOCKING_OP_RE = re.compile(r"DistributedDataParallel|c10d::|record_param_comms|autograd::engine::evaluate|"
                            r"backward|wait|barrier|all_?reduce|broadcast|all_?gather|reduce_scatter", re.I)
GLOO_SPAN_PREFIX = "gloo:"
# the collective calls themselves on the loop thread (c10d's ops, the functional collectives and their waits,
# the record function PyTorch wraps collectives in): arrival at a collective is entering one of these
COLLECTIVE_CALL_RE = re.compile(r"^(?:c10d::|_?c10d_functional::)|record_param_comms")
# a thread blocked on a collective resumes within this long of its end (ns): DDP's reducer resumed 0.2-0.7 ms
# from the gloo span's end (either side: the worker closes its span after waking the waiter) on the loaded
# 2-core machine of the corpus (2026-12-02)
WAKE_NS = 2_000_000
# a step in which some rank spends this much of it (%) inside DataLoader or checkpoint spans is one that the stall's
# fix changes beyond removing the span (host_straggler). The corpus's clean 2-rank gloo runs spend 0.1-1.4 % of a
# step there (the DataLoader's own next()), its smallest injected stall 7.2 %; 5 %: the smallest straggler named
# without the test (stragglers.STRAGGLER_HOST_MIN_PCT), stated, not fitted: a smaller stall cannot make a rank that late
STALLED_STEP_MIN_PCT = 5.0


@dataclass(frozen=True, kw_only=True)
class Recurrence:
    """How consistently the slowest rank's per-step extra work recurs over `steps` steps of n_ranks ranks:
    p_value, straggler_p_value of it (the chance that load noise alone, as often one way as the other, makes some
    rank's extra this consistent); snr, recurring_over_opposite of it (what is left to judge by when the steps are
    too few for the test: straggler_min_p_value says how low p_value can go)."""

    steps: int
    n_ranks: int
    p_value: float = 1.0
    snr: float = float("inf")

    @classmethod
    def of(cls, extra_us: np.ndarray, n_ranks: int) -> "Recurrence":
        """The recurrence of a per-step extra (µs) among n_ranks ranks."""
        return cls(steps=int(np.asarray(extra_us).size), n_ranks=n_ranks,
                   p_value=straggler_p_value(extra_us, n_ranks), snr=recurring_over_opposite(extra_us))

    @property
    def min_p_value(self) -> float:
        """The smallest p_value these steps allow (every step's extra positive)."""
        return straggler_min_p_value(self.steps, self.n_ranks)


@dataclass(kw_only=True)
class HostStraggler:
    """The straggler of a CPU-only job, from where each rank's training-loop thread spends its steps.

    Per step and rank (host_step_waits): own work = step - communication - stall. Per step, the straggler's
    extra = its own work - the other ranks' median own work (paired in the step: both ranks lived through the
    same load on the machine). own_us / wait_us: per rank, per-step medians (µs). gain_us / gain_pct: the others'
    wait for the straggler, min(extra, their communication time) summed over the window's steps with its sign (a
    step in which the others are slower counts against it), per step (µs) and % of the steps' time: a straggler
    late in some steps costs its share of the window, and step-to-step noise, as often one way as the other,
    cancels instead of adding up. recurrence: how consistently its per-step extra (extra_us) recurs over every
    common step; unstalled: the same over the steps its gain is priced on (those without a stall, host_straggler).
    """

    rank: int
    gain_pct: float
    gain_us: float
    own_us: dict[int, float]
    wait_us: dict[int, float]
    recurrence: Recurrence
    unstalled: Recurrence
    extra_us: list[float] = field(default_factory=list)  # per common step: the straggler's extra own work (µs)

    @property
    def steps(self) -> int:
        """The ranks' common profiled steps (count)."""
        return self.recurrence.steps

    @property
    def n_ranks(self) -> int:
        """The ranks compared (count)."""
        return self.recurrence.n_ranks

    @property
    def stalled_steps(self) -> int:
        """Common steps its gain left out: a DataLoader or checkpoint stall in them (count)."""
        return self.recurrence.steps - self.unstalled.steps


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intersection of two merged interval lists, itself merged (ns)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Total length (ns) of the intersection of two merged interval lists, inside [lo, hi)."""
    return sum(max(0, min(e, hi) - max(s, lo)) for s, e in _intersect(a, b))


def _nearest_gap(sorted_ns: np.ndarray, x: int) -> int:
    """Distance (ns) from x to the nearest value of a sorted, non-empty array."""
    k = int(np.searchsorted(sorted_ns, x))
    return int(min(abs(int(sorted_ns[j]) - x) for j in (k - 1, k) if 0 <= j < sorted_ns.size))


def loop_steps(t: EventTable, keep: np.ndarray | None = None) -> tuple[tuple[int, int], list[tuple[int, int, int]]]:
    """The training loop's thread (pid, tid) and its steps [(number, start ns, end ns)]: the ProfilerStep#N spans
    whose rows are in keep (bool per row, default all); in a trace without them, the iterations torch.optim's
    `Optimizer.step#...` annotations mark (window.ITERATION_HINT_RE), each from the end of one optimizer step to the
    end of the next, numbered 1.. (the part before the first is an iteration cut short). ((-1, -1), []) with
    neither."""
    srows, _ = step_rows(t)  # the stepping thread's steps: that thread is the training loop
    end = t.ts_ns + t.dur_ns
    if srows.size:
        loop = (int(t.pid[srows[0]]), int(t.tid[srows[0]]))
        return loop, [(int(n), int(t.ts_ns[r]), int(end[r])) for r, n in zip(srows, step_numbers(t, srows))
                      if keep is None or keep[r]]
    opt = iteration_hint_rows(t)
    if opt.size < 2:
        return (-1, -1), []
    thread = thread_key(t.pid[opt], t.tid[opt])
    keys, counts = np.unique(thread, return_counts=True)
    opt = opt[thread == keys[np.argmax(counts)]]
    opt = opt[np.argsort(end[opt], kind="stable")]
    loop = (int(t.pid[opt[0]]), int(t.tid[opt[0]]))
    return loop, [(k, int(end[a]), int(end[b])) for k, (a, b) in enumerate(zip(opt[:-1], opt[1:]), start=1)]


def host_step_waits(t: EventTable, keep: np.ndarray | None = None) -> dict[int, tuple[float, float, float]]:
    """Per step of one rank (loop_steps: its ProfilerSteps in keep, bool per row, e.g. the analysis window's; in a
    trace without them, the optimizer's iterations): step number -> (step µs, communication µs, stall µs).

    Communication: the time the training-loop thread spends inside collective calls (COLLECTIVE_CALL_RE, whole:
    the copies into and out of the communication buffers and the wait for the other ranks included), and blocked
    inside another collective-blocking op (BLOCKING_OP_RE) with no child op of its own while a gloo:* span is open
    on any thread of the rank (DDP waiting for the buffer broadcast), or inside no op at all until a gloo:* span
    ends (DDP's reducer waiting for its all-reduces, which PyTorch records inside no op). A rank arrives
    at a collective when it calls it (TraceLens: arrival = the collective's start on that rank): what happens
    inside the call is the collective's time, not the rank's own work, so a rank whose calls are slow (its
    gloo worker scheduled late on a loaded machine) is not taken for a rank that computes slowly.
    Stall: the rest of its time inside DataLoader, checkpoint, compile and garbage-collection spans, host stalls
    with findings of their own (``host.STALL_SPAN_RES``). Empty when the trace has neither steps nor optimizer
    iterations."""
    names = t.names
    loop, steps = loop_steps(t, keep)
    if not steps:
        return {}
    is_step = np.isin(t.name, t.ids_matching(STEP_RE.match))
    gloo_ids = [i for i, n in enumerate(names) if n.startswith(GLOO_SPAN_PREFIX)]
    g = np.flatnonzero(np.isin(t.name, gloo_ids) & (t.pid == loop[0]))
    end = t.ts_ns + t.dur_ns
    gloo = _merge([(int(t.ts_ns[r]), int(end[r])) for r in g])
    # a gloo:* span is the transfer of a collective issued asynchronously, whichever thread it is recorded on (the
    # loop thread itself for torch.distributed.pipelining's batched send/recv): never the loop thread's own work
    on_loop = np.flatnonzero((t.pid == loop[0]) & (t.tid == loop[1]) & ~is_step & (t.dur_ns > 0)
                             & ~np.isin(t.name, gloo_ids))
    ts_loop = t.ts_ns[on_loop]
    call_ids = {i for i, n in enumerate(names) if COLLECTIVE_CALL_RE.search(n)}
    calls = _merge([(int(t.ts_ns[r]), int(end[r])) for r in on_loop[np.isin(t.name[on_loop], list(call_ids))]])
    block_ids = [i for i, n in enumerate(names) if BLOCKING_OP_RE.search(n) and i not in call_ids]
    gaps: list[tuple[int, int]] = []
    loose: list[tuple[int, int]] = []  # gaps inside no op at all (the step's own)
    blocking = [(int(t.ts_ns[b]), int(end[b]), int(b)) for b in on_loop[np.isin(t.name[on_loop], block_ids)]]
    for s, e, b in blocking + [(s, e, -1) for _, s, e in steps]:
        lo, hi = np.searchsorted(ts_loop, s, "left"), np.searchsorted(ts_loop, e, "left")
        kids = _merge([(int(t.ts_ns[c]), int(end[c])) for c in on_loop[lo:hi] if c != b and end[c] <= e])
        into = loose if b < 0 else gaps
        cur = s
        for a, z in kids:
            if a > cur:
                into.append((cur, a))
            cur = max(cur, z)
        if e > cur:
            into.append((cur, e))
    # the loop thread inside no op at all is blocked on a collective where PyTorch records no op (DDP's reducer
    # waiting for its all-reduces after the last backward function: 51 ms in one step of corpus
    # data_loader_stall-low-real, rank 1) when it resumes as a collective ends (within WAKE_NS), as a woken
    # thread does; a gap between two backward functions while an all-reduce runs beside them (the engine
    # descheduled, not waiting) ends at no collective's end and stays the rank's own time
    gloo_ends = np.sort(end[g])
    woken = [(a, z) for a, z in _merge(loose) if gloo_ends.size and _nearest_gap(gloo_ends, z) <= WAKE_NS]
    comm = _merge(calls + _intersect(_merge(gaps + woken), gloo))
    stall_ids = [i for i, n in enumerate(names) if any(p.search(n) for p in STALL_SPAN_RES)]
    stalls = _merge([(int(t.ts_ns[r]), int(end[r])) for r in on_loop[np.isin(t.name[on_loop], stall_ids)]])
    out = {}
    for number, s, e in steps:
        c = _overlap(comm, [(s, e)], s, e)
        stall = _overlap(stalls, [(s, e)], s, e) - _overlap(stalls, comm, s, e)
        out[number] = ((e - s) / 1e3, c / 1e3, stall / 1e3)
    return out


def _steps_in_common(per_step: dict[int, dict]) -> tuple[dict[int, dict], list[int], list[int]]:
    """({rank: its steps' values} of the ranks with any step, those ranks sorted, the steps every one of them has,
    sorted); no common step (empty list) with fewer than 2 such ranks."""
    per = {r: v for r, v in per_step.items() if v}
    if len(per) < 2:
        return per, sorted(per), []
    return per, sorted(per), sorted(set.intersection(*[set(v) for v in per.values()]))


def host_straggler(tables: dict[int, EventTable], keep: dict[int, np.ndarray] | None = None) -> HostStraggler | None:
    """The straggler of a job whose ranks have no GPU activity (gloo), over the steps in keep ({rank: bool per
    row}: the analysis windows' keep; default each rank's window.analysis_window, which leaves out the last
    step, cut short by the profiler, as every rule and the corpus truth do): per step, own work = step - communication -
    stall (host_step_waits): time in DataLoader or checkpoint spans is those findings' cause, whose fix removes
    it on every rank, so a rank late because it was fetching a batch is a data-loader stall, not a straggler.
    The straggler is the rank whose own work exceeds the other ranks' in the same steps most, summed over the
    steps; its gain and its signal over noise as HostStraggler says. None with fewer than 2 ranks or no common
    steps.

    Priced marginal to the stalls' fixes: a step in which some rank stalls (STALLED_STEP_MIN_PCT) changes with
    the fix beyond losing the span (in the corpus's real runs a rank's own work is slower by a few ms, step after
    step, only in the steps with a checkpoint's writes or a DataLoader's sleep). Where the window has at least 2
    steps without a stall, the others' wait per step is that of those steps, over every step of the window
    (stalled_steps: how many it left out): the rank's extra work only beside stalls gains nothing once they are
    fixed. Which rank is late, and how consistently (recurrence), is judged on every step: a few steps before a
    stall's onset are too few to test, and the warm-up among them often late on one rank (corpus
    data_loader_stall-low-real: tested on its 2 unstalled steps alone, rank 1 would be a 30 % straggler). Its
    recurrence is judged again on the priced steps alone (unstalled), for the rule to ask both: extra work that
    recurs only beside the stalls is the stalls', and the fix of the stall leaves none of it (corpus
    checkpoint_stall-high-real, 2026-12-06: rank 1 late in all 10 steps, p 0.01, by a few ms in the 6 with a
    checkpoint's writes; its 4 other steps are too few for the test, and their 4 % per step too little to name a
    straggler without it). With a stall in (nearly) every step, all steps are priced and judged."""
    if keep is None:
        keep = {r: analysis_window(t).keep for r, t in tables.items()}
    per = {r: host_step_waits(t, keep.get(r)) for r, t in tables.items()}
    per, ranks, common = _steps_in_common(per)
    if not common:
        return None
    own = {r: np.array([per[r][s][0] - per[r][s][1] - per[r][s][2] for s in common]) for r in ranks}
    wait = {r: np.array([per[r][s][1] for s in common]) for r in ranks}
    step = np.median(np.array([[per[r][s][0] for s in common] for r in ranks]), axis=0)

    def extra(r: int) -> np.ndarray:   # per step: r's own work beyond the other ranks' median (µs)
        return own[r] - np.median(np.stack([own[o] for o in ranks if o != r]), axis=0)

    srank = max(ranks, key=lambda r: float(extra(r).sum()))
    x = extra(srank)
    others_wait = np.median(np.stack([wait[r] for r in ranks if r != srank]), axis=0)
    # the others wait for the straggler's extra work: a step shortens by what both agree on (never by more than
    # the others waited); a step where the others were slower counts against it, as in the job's total time
    covered = np.minimum(x, others_wait)
    stalled = np.array([any(per[r][s][2] >= STALLED_STEP_MIN_PCT / 100.0 * per[r][s][0] for r in ranks)
                        for s in common])
    priced = ~stalled if (~stalled).sum() >= 2 else np.ones_like(stalled)
    gain_us = max(float(covered[priced].mean()), 0.0)  # per step: every step, once the stalls are fixed
    total = float(step.sum())
    return HostStraggler(rank=srank, gain_pct=100.0 * gain_us * step.size / total if total > 0 else 0.0,
                         gain_us=gain_us, own_us={r: float(np.median(v)) for r, v in own.items()},
                         wait_us={r: float(np.median(v)) for r, v in wait.items()},
                         recurrence=Recurrence.of(x, len(ranks)), unstalled=Recurrence.of(x[priced], len(ranks)),
                         extra_us=[float(v) for v in x])


def straggler_p_value(extra_us: np.ndarray, n_ranks: int) -> float:
    """The chance (0..1) that ranks equal but for load noise give the slowest of n_ranks ranks a per-step extra
    work (µs, against the other ranks in the same step) this consistently positive over the whole window or over
    its last steps (at least half of them: onset_statistic): a sign-flip permutation test
    (scipy.stats.permutation_test, exact up to 2^16 sign patterns), one-sided, times n_ranks (the straggler is the
    rank with the largest sum: Bonferroni over the ranks it was chosen from).

    Why this null: on a shared machine either rank is slower in some steps by the load alone, so under "no
    straggler" each step's extra is as likely negative as positive. A straggler must be late step after step:
    one long step (start-up, a one-off pause), however long, leaves half of the sign patterns above it.
    Why its last steps too: a rank that turns slow inside the window (a throttled or shared host, a fault from
    step 6 of 3-12) and stays slow is late in every step from then on, the steps the job goes on paying, and the
    earlier steps' noise, summed with them, can hide it; the permutation gives the largest of the segments'
    statistics its own null, so looking at several keeps the false-alarm rate (simulated in docs/benchmarks.md).
    A rank slow only in the first steps has recovered: no suffix, no finding. With k steps the smallest value is
    n_ranks / 2^k (`straggler_min_p_value`): 4 steps of 2 ranks cannot go below 0.125. 1.0 with fewer than 2
    steps."""
    from scipy.stats import permutation_test  # here: scipy.stats costs ~0.3 s to import, most traces need none

    x = np.asarray(extra_us, dtype=float)
    if x.size < 2 or not np.any(x):
        return 1.0
    res = permutation_test((x,), onset_statistic, permutation_type="samples", alternative="greater",
                           vectorized=True, n_resamples=np.inf if x.size <= 16 else 9999, random_state=0)
    return float(min(1.0, n_ranks * res.pvalue))


def onset_statistic(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """How consistently positive per-step values are from some step to the last (dimensionless): the largest
    self-normalised sum, sum / sqrt(sum of squares), over the series' suffixes of at least half its steps, the
    whole series among them (a straggler must recur: a shorter run of late steps is a pause, not a slow rank).
    Self-normalised so that a run of k equal steps scores sqrt(k) whatever their size; over the whole series it
    orders sign patterns as the plain sum does (the sum of squares does not change with the signs). Along axis
    (vectorised for permutation_test)."""
    x = np.moveaxis(np.asarray(x, dtype=float), axis, -1)
    k = x.shape[-1]
    lengths = np.arange(max(2, -(-k // 2)), k + 1)
    # the suffix of length L: the whole series less its first k - L steps
    cs = np.concatenate([np.zeros(x.shape[:-1] + (1,)), np.cumsum(x, axis=-1)], axis=-1)
    cq = np.concatenate([np.zeros(x.shape[:-1] + (1,)), np.cumsum(x * x, axis=-1)], axis=-1)
    total, squares = cs[..., k - lengths], cq[..., k - lengths]
    return ((cs[..., -1:] - total) / np.sqrt(np.maximum(cq[..., -1:] - squares, 1e-300))).max(axis=-1)


def slowest_rank_p_value(per_step_us: np.ndarray) -> float:
    """The chance (0..1) that ranks equally fast but for noise make one of them stand out this consistently as the
    slowest (per_step_us: steps x ranks, e.g. each rank's computation per step, µs), over the whole window or its last
    steps (at least half of them, as straggler_p_value): a permutation test that shuffles each step's values among the
    ranks (SLOW_RANKS_DRAWS draws; the null: in each step any rank as likely to get any of the values).

    Statistic: the largest, over ranks and suffixes of L steps, of sum(z) / sqrt(L), where z is a rank's value in a
    step less the step's mean over ranks (µs; a step whose ranks are all equal adds 0), so a rank that is the slowest
    by far in every step scores most. In µs, not in units of each step's spread: one step's wild value (a pause)
    stays in its step under the shuffles, so it lifts the null's statistic as much as the observed one and decides
    nothing, while dividing by the spread of 4 ranks' values lost a 1.3x stage in noisy steps (13 of 24 pipelines
    found at +-2 ms against 11). The max over ranks makes the choice of the rank part of the null (no Bonferroni
    factor needed). Why not the
    sign-flip test of the slowest rank's extra against the others' median (straggler_p_value): with N ranks the
    slowest of a noisy window is above the others' median in every one of 4 steps with probability ~N / 16, too
    often for a short window; being the slowest by a wide margin in every step is rarer (~N^(1 - k) for k steps:
    slowest_rank_min_p_value). 1.0 with fewer than 2 steps or 2 ranks."""
    x = np.asarray(per_step_us, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        return 1.0
    k = x.shape[0]
    z = x - x.mean(axis=1, keepdims=True)
    lengths = np.arange(max(2, -(-k // 2)), k + 1)

    def statistic(zz: np.ndarray) -> np.ndarray:  # (..., steps, ranks) -> (...)
        cs = np.concatenate([np.zeros(zz.shape[:-2] + (1, zz.shape[-1])), np.cumsum(zz, axis=-2)], axis=-2)
        suffix = (cs[..., -1:, :] - cs[..., k - lengths, :]) / np.sqrt(lengths)[:, None]
        return suffix.max(axis=(-2, -1))

    observed = float(statistic(z))
    # drawn directly, as arrival_order_p_value does (the p-value as scipy.stats.permutation_test gives it), in chunks
    # of ~4M values (64 ranks x 64 steps x 1,000 draws) so that a long window of many ranks stays in memory
    rng, at_least, left = np.random.default_rng(0), 0, SLOW_RANKS_DRAWS
    chunk = max(1, min(SLOW_RANKS_DRAWS, 4_000_000 // z.size))
    while left > 0:
        draws = rng.permuted(np.broadcast_to(z, (min(chunk, left), *z.shape)), axis=-1)
        at_least += int(np.count_nonzero(statistic(draws) >= observed * (1 - 1e-12)))
        left -= draws.shape[0]
    return float((1 + at_least) / (SLOW_RANKS_DRAWS + 1))


def slowest_rank_min_p_value(steps: int, n_ranks: int) -> float:
    """About the smallest slowest_rank_p_value that `steps` steps of n_ranks ranks allow: one rank the slowest in
    every step, n_ranks^(1 - steps) (1.0 with fewer than 2 steps or 2 ranks)."""
    return float(n_ranks) ** (1 - steps) if steps >= 2 and n_ranks >= 2 else 1.0


def recurring_over_opposite(extra_us: np.ndarray) -> float:
    """How far a rank's extra work per step (µs, against the other ranks in the same step) stands out of the
    noise: its sum without its largest step, over the sum of the steps' opposite excess (where the other ranks
    were the slower ones). Without its largest step, because one step's delay, however long (start-up, a one-off
    pause), is not a rank that keeps the others waiting: it must recur. Over the opposite excess, because on a
    shared machine either rank is slower in some steps by the load alone, and a straggler's excess must outweigh
    that. inf when the others are never slower and the excess recurs; 0 with one step. A heuristic with no
    false-alarm rate: what a window too short for straggler_p_value leaves to judge by."""
    x = np.asarray(extra_us, dtype=float)
    if x.size < 2:
        return 0.0
    recurring = float(x.sum() - x.max())
    opposite = float(np.maximum(-x, 0.0).sum())
    if opposite > 0:
        return recurring / opposite
    return float("inf") if recurring > 0 else 0.0


def straggler_min_p_value(steps: int, n_ranks: int) -> float:
    """The smallest straggler_p_value that `steps` steps of n_ranks ranks allow (every step's extra positive)."""
    return min(1.0, n_ranks / 2.0 ** steps) if steps >= 2 else 1.0


def straggler_steps_needed(n_ranks: int, alpha: float) -> int:
    """The fewest steps whose straggler_min_p_value is at most alpha (2 ranks, 0.05: 6); a straggler that is not
    slower in every step needs more."""
    return max(2, int(np.ceil(np.log2(n_ranks / alpha))))


# --- GPU ranks whose collectives cannot be matched: compute per step ----------------------------------


WHOLE_WINDOW_STEP = -1  # compute_per_step's one step of a trace without ProfilerStep spans


def compute_per_step(t: EventTable, w: Window) -> dict[int, float]:
    """Per ProfilerStep: step number -> µs of computation kernels that step launched (union of their
    intervals). A kernel belongs to the step of its launch call (launch->kernel correlation,
    trace.annotate), wherever it ran on the GPU timeline. A trace with no step at all (profiled without
    prof.step()) is one step, WHOLE_WINDOW_STEP, its analysis window: the ranks' computation still compares over
    the same span. Empty without device events."""
    from trainperf.diagnose.gpu_time import compute_mask  # gpu_time imports nothing of this module

    rows = w.device[compute_mask(t, w.device)] if w.device.size else w.device
    if rows.size and not (t.step >= 0).any():
        return {WHOLE_WINDOW_STEP: union_us(w, rows)}
    out = {}
    for s in np.unique(t.step[rows]):
        if s >= 0:
            sel = rows[t.step[rows] == s]
            out[int(s)] = union_us(w, sel)
    return out


def compute_before_collectives(t: EventTable, w: Window, collectives: list[MatchedCollective],
                               rank: int) -> dict[tuple, float]:
    """Per matched collective on `rank`, keyed (kind, seq) as a trace without steps keys its collectives
    (api._collective_step): µs of computation kernels (union) that started between this rank's previous matched
    collective kernel and this one's: the work it did before arriving. What lateness_share compares across ranks
    when no ProfilerStep groups the collectives."""
    from trainperf.diagnose.gpu_time import compute_mask  # gpu_time imports nothing of this module

    rows = w.device[compute_mask(t, w.device)] if w.device.size else w.device
    rows = rows[np.argsort(w.ts_us[rows], kind="stable")]
    starts = w.ts_us[rows]
    mine = sorted((c for c in collectives if rank in c.rows), key=lambda c: w.ts_us[c.rows[rank]])
    out: dict[tuple, float] = {}
    lo = 0
    for c in mine:
        hi = int(np.searchsorted(starts, w.ts_us[c.rows[rank]], side="left"))
        out[(c.kind, c.seq)] = union_us(w, rows[lo:hi])
        lo = hi  # the collectives are in time order: hi only grows
    return out


@dataclass(kw_only=True)
class ComputeStraggler:
    """The rank that computes longest per step against the other ranks (µs).

    ratio: median over the common steps of its compute / the other ranks' median compute in that step;
    by_step_us: steps x ranks (the columns: `ranks`), each rank's compute in each common step;
    group_ratio: it and the ranks computing alike with it (compute_straggler: a slow stage's copies), each with its
    compute over the rest's median (median over the steps): {rank: ratio}."""

    rank: int
    ratio: float
    ranks: list[int]
    by_step_us: np.ndarray
    group_ratio: dict[int, float] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        """The common steps compared."""
        return int(self.by_step_us.shape[0])

    @property
    def extra_by_step_us(self) -> np.ndarray:
        """Per common step, its compute minus the other ranks' median (µs; negative where it computed less)."""
        col = self.ranks.index(self.rank)
        return self.by_step_us[:, col] - np.median(np.delete(self.by_step_us, col, axis=1), axis=1)

    @property
    def extra_us(self) -> float:
        """Its compute beyond the others' median, summed over the steps where it computed more (µs)."""
        return float(np.maximum(self.extra_by_step_us, 0.0).sum())


def compute_straggler(per_step: dict[int, dict[int, float]]) -> ComputeStraggler | None:
    """From {rank: compute_per_step(...)}: the rank whose per-step compute exceeds the other ranks' median
    most (median ratio over the steps every rank has). None with fewer than 2 ranks or no common step."""
    per, ranks, common = _steps_in_common(per_step)
    if not common:
        return None
    c = np.array([[per[r][s] for s in common] for r in ranks])  # ranks x steps

    def ratio(i: int, ref: np.ndarray) -> float:  # rank i's compute over a reference, step by step, the median
        return float(np.median(np.where(ref > 0, c[i] / np.where(ref > 0, ref, 1.0), 1.0)))

    ratios = [ratio(i, np.median(np.delete(c, i, axis=0), axis=0)) for i in range(len(ranks))]
    k = int(np.argmax(ratios))
    # the ranks that compute alike with it, above the widest break in the ranks' median compute (_upper_class: a
    # minority, so some rank is left to compare with): a slow pipeline stage has as many slow ranks as it has data-
    # or tensor-parallel copies, and naming one of them would leave the others out; each over the rest's median
    members = _upper_class(np.median(c, axis=1))
    members = members if k in members else np.array([k])
    rest = np.median(np.delete(c, members, axis=0), axis=0)
    return ComputeStraggler(rank=ranks[k], ratio=ratios[k], ranks=ranks, by_step_us=c.T,
                            group_ratio={ranks[i]: ratio(i, rest) for i in sorted(int(v) for v in members)})
