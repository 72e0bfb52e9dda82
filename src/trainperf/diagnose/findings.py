"""Findings: typed records naming a bottleneck, its evidence, the what-if gain and a fix.

Gains are marginal (`rank_by_marginal_gain`): the fixes are applied one after the other (removed
waits first, assumed speed-ups last, each group by largest gain alone), and each finding is credited with what its
fix adds to the fixes before it
(replay of the step graph with all of them applied). Causes that overlap (the GPU idles *because*
the host is in the DataLoader) are therefore counted once, and the gains add up to the "fix all"
gain. Severity follows that marginal gain, capped by the finding's own evidence (the share of the
step its evidence shows, `evidence_pct`): high >= 10 % of step time, medium >= 3 %, low otherwise;
a gain that is only an upper bound (`Finding.gain_is_upper_bound`, see UPPER_BOUND_CHANGES) is rated
one level below the level of its bound.
A healthy trace therefore has no high finding: nothing in it can be fixed for a large gain.
The ranking (rank_key) follows the order of fixes: stalls first (with the launches' host cost), then cheaper work
the trace measures, each by marginal gain (an upper bound by the share of it a fix is sure to realise), then other
bounds and findings without a what-if by severity; a stall rated low comes after the findings rated high
(in_rank_order).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import groupby

from trainperf.diagnose.advice import RECOMMENDATIONS

HIGH_GAIN_PCT = 10.0
MEDIUM_GAIN_PCT = 3.0
# a finding whose fix gains less after the fixes before it is dismissed: not a bottleneck, or one whose time
# an earlier fix already gives back (a host sync that waited for a collective: host_sync and exposed_comm
# explain the same wait, and the fix priced first takes it)
MIN_GAIN_PCT = 0.5

# the kinds whose fix makes the host faster (ONE_HOST_FOR_SEVERAL_GPUS goes before their fix)
HOST_BOUND_KINDS = frozenset({"launch_bound", "host_work", "small_kernels"})


def rank_list(ranks) -> str:
    """Ranks as a short list: runs of consecutive ranks as A-B ("8-15", "0, 3-5")."""
    runs = [[r for _, r in g] for _, g in groupby(enumerate(sorted(ranks)), key=lambda p: p[1] - p[0])]
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


@dataclass(kw_only=True)
class Finding:
    """One diagnosed problem: what, how bad, where, the evidence, what fixing it gains and how."""

    kind: str
    severity: str
    ranks: list[int]
    steps: list[int]
    evidence: dict = field(default_factory=dict)  # metrics (value, unit); events (name, start_us from the
    #                                               rank's first event, dur_us)
    gain_pct: float = 0.0                           # marginal step-time reduction, % of the window
    gain_us: float = 0.0
    what_if: str = ""
    recommendation: str = ""
    gain_alone_pct: float = 0.0                     # the same fix applied on its own, % of the window
    fix_order: int = 0                              # position in the order of fixes (1 = first), 0 none
    evidence_pct: float | None = None               # share of the step the evidence itself shows, %
    confidence: str = "high"                        # high / medium / low: how far the evidence can be trusted
    gain_is_upper_bound: bool = False               # the fix assumes what the trace cannot show (UPPER_BOUND_CHANGES)
    # the gain is measured for the window, but the stall is seen once, in one of its steps (a one-off checkpoint save):
    # how often the run pays it the trace cannot tell, so the gain is an upper bound (gain_is_upper_bound) for the run
    rate_unknown: bool = False
    notes: list = field(default_factory=list)       # why the confidence is lowered
    changes: tuple = ()                             # what-if changes (replay.Change) of the fix; not in JSON
    priced: bool = True                             # its gain was computed (replay or host-only); not in JSON

    def to_json(self) -> dict:
        """A plain JSON-able dict."""
        d = asdict(self)
        d.pop("changes")
        d.pop("priced")
        return d


def severity_of(gain_pct: float) -> str:
    """high / medium / low from the estimated gain (% of step time)."""
    return "high" if gain_pct >= HIGH_GAIN_PCT else "medium" if gain_pct >= MEDIUM_GAIN_PCT else "low"


# What-ifs whose gain is an upper bound: the fix restructures the step in a way the trace cannot show is possible.
# graph_launches: the whole step captured as one CUDA graph (static shapes, no host sync or CPU control flow
# inside, every op capturable); speedup: kernels at the HBM roof or an assumed factor; host_speedup: an assumed
# factor. The launches' cost, the kernels' bytes are measured; that the fix removes all of it is assumed. (Fusing
# the tiny kernels small_kernels names, graph_small_kernels, is a local change that foreach ops or torch.compile
# make; removing a wait assumes nothing.) remove_lags: waits whose cause the trace does not hold (another process on
# the GPU, an event of another process), which the fix assumes can go. A rule may also mark its finding an upper
# bound (exposed_comm when the exposed time is point-to-point: the receiver usually needs the data, so overlap may not
# hide it).
UPPER_BOUND_CHANGES = frozenset({"graph_launches", "speedup", "host_speedup", "remove_host_work", "fuse_kernels",
                                 "remove_lags"})


def make(kind: str, ranks, steps, metrics: dict, events=(), gain_pct: float | None = None, gain_us: float = 0.0,
         what_if: str = "", severity: str | None = None, changes: tuple = (),
         evidence_pct: float | None = None, upper_bound: bool = False, rate_unknown: bool = False) -> Finding:
    """A Finding with severity from its gain and the standard recommendation of its kind.

    metrics: name -> (value, unit); events: (name, start µs, dur µs); changes: the replay changes
    of its fix (the gain is then filled in by rank_by_marginal_gain); gain_pct None with no changes: the gain
    is not priced; upper_bound: the gain is an upper bound whatever the changes (changes in
    UPPER_BOUND_CHANGES make it one anyway); rate_unknown: a stall seen once, in one of the window's steps (its gain
    is then an upper bound for the run, Finding.rate_unknown)."""
    priced = bool(changes) or gain_pct is not None
    gain_pct = gain_pct or 0.0
    ev = {"metrics": {k: {"value": round(float(v[0]), 3), "unit": v[1]} for k, v in metrics.items()},
          "events": [{"name": n, "start_us": round(float(s), 1), "dur_us": round(float(d), 1)} for n, s, d in events]}
    bound = upper_bound or rate_unknown or any(c.kind in UPPER_BOUND_CHANGES for c in changes)
    return Finding(kind=kind, severity=severity or capped_severity(gain_pct, None, bound),
                   ranks=sorted(int(r) for r in ranks), steps=[int(s) for s in steps], evidence=ev,
                   gain_pct=round(float(gain_pct), 2), gain_us=round(float(gain_us), 1), what_if=what_if,
                   recommendation=RECOMMENDATIONS[kind], gain_alone_pct=round(float(gain_pct), 2),
                   evidence_pct=None if evidence_pct is None else round(float(evidence_pct), 2), changes=changes,
                   gain_is_upper_bound=bound, rate_unknown=rate_unknown, priced=priced)


def rank_finding(f, kind: str, metrics: dict, events=(), changes: tuple = (), what_if: str = "",
                 evidence_pct: float | None = None, ranks=None, severity: str | None = None,
                 gain_pct: float | None = None, gain_us: float = 0.0, upper_bound: bool = False,
                 rate_unknown: bool = False) -> Finding:
    """make() for a rule reading one rank's facts `f` (a RankFacts): the finding names that rank unless `ranks`
    names others, and the rank's analysed steps."""
    return make(kind, ranks if ranks is not None else [f.rank], f.steps, metrics, events, gain_pct, gain_us, what_if,
                severity=severity, changes=changes, evidence_pct=evidence_pct, upper_bound=upper_bound,
                rate_unknown=rate_unknown)


_SEVERITY_LEVEL = {"low": 0, "medium": 1, "high": 2}
_LEVELS = ("low", "medium", "high")


def capped_severity(gain_pct: float, evidence_pct: float | None, upper_bound: bool = False) -> str:
    """Severity of a gain, no higher than the severity its own evidence share would have, and one level
    lower when the gain is only an upper bound.

    Why one level: severity tells a user how much acting on a finding will give. A measured wait removed is
    worth what the replay says; an upper bound (a CUDA graph of the whole step, perfect overlap of a
    point-to-point transfer) is worth anything from nothing to the bound, depending on facts the trace does
    not hold. So a bound of 3-10 % (medium if measured) rates low, >= 10 % medium, and high needs a measured
    gain. The gain itself is reported as it is, marked as an upper bound (render.gain_text, JSON
    gain_is_upper_bound): nothing is hidden, only its weight is stated. Untouched corpus traces show why it
    matters: launch_bound 4.2 % on nccl_parser and 5.8 % on trace_filter (the whole step as one CUDA graph)
    and exposed_comm 3.4 % on negative_queue (send/recv kernels of a pipeline stage) were rated medium."""
    sev = severity_of(gain_pct)
    if evidence_pct is not None:
        cap = severity_of(evidence_pct)
        sev = sev if _SEVERITY_LEVEL[sev] <= _SEVERITY_LEVEL[cap] else cap
    return _LEVELS[max(_SEVERITY_LEVEL[sev] - 1, 0)] if upper_bound else sev


@dataclass(kw_only=True)
class FixPlan:
    """The order of fixes of one rank and the gain of applying them all (% of the window, µs)."""

    order: list[str]
    fix_all_gain_pct: float
    fix_all_gain_us: float
    dismissed: list[str] = field(default_factory=list)  # rules that fired but whose fix gains < MIN_GAIN_PCT


# fixes that remove a wait (the time is waste whatever else changes) are priced before fixes that assume
# some work gets k times faster (a hypothesis): e.g. a DataLoader stall before "host 2x faster". A
# straggler's compute_speedup counts as a wait: the factor is measured (the other ranks' pace), not assumed; so does
# work whose result nothing uses (remove_wasted_rows: gradients all-reduced before more are accumulated into them),
# and a pipeline's bubble halved (shrink_bubble): the stages' wait for each other, which a schedule setting (more
# micro-batches, interleaving) shrinks by the schedule's own law, (p - 1) / (m + p - 1); and the device's waits for
# what the trace does not show (remove_lags: the GPU held by another process), a wait whatever its cause; and host work
# that launches nothing while the device waits (remove_host_work), the host's own waste, as a DataLoader fetch on the
# main thread is (an upper bound: ranked by rank_key at the share of it BOUND_REALISED_SHARE credits; ranked with the
# restructurings, host work of 20 % came after a DataLoader wait of 4.8 %: the corpus's compound cases); and launch
# calls slower than a launch's usual range made usual (usual_launch_calls: time the host's launch path wastes on each)
STALL_CHANGES = frozenset({"remove_data_wait", "remove_checkpoint_wait", "remove_compile_wait", "remove_gc_wait",
                           "remove_syncs", "unblock_pageable_copies", "remove_allocator", "overlap_comm",
                           "remove_straggler_wait", "compute_speedup", "remove_wasted_rows", "shrink_bubble",
                           "remove_lags", "remove_host_work", "usual_launch_calls"})


def _removes_a_stall(f: Finding) -> bool:
    return all(c.kind in STALL_CHANGES for c in f.changes)


# fixes that take off the host a cost the trace measures, the kernel launches' calls and dispatch (a CUDA graph of the
# step), an upper bound only in that the trace cannot show the whole step can be captured: ranked with the stalls, by
# the share of it a fix is sure to realise (rank_key), not after every stall whatever the sizes: a step whose launches
# cost 46 % (its launches 20 % slower than the same base's) ranked a DataLoader wait of 4.8 % first (the corpus's
# compound cases of slower launches beside a stall)
HOST_COST_BOUND_CHANGES = frozenset({"graph_launches"})


def _removes_a_host_cost(f: Finding) -> bool:
    return bool(f.changes) and all(c.kind in HOST_COST_BOUND_CHANGES for c in f.changes)


# a fix that contains a narrower one (capturing every launch in a CUDA graph contains capturing the small
# kernels' launches) is priced after it when both are found: the specific cause gets its own gain and the
# broader fix what it adds. So does a category-wide speed-up (every elementwise and reduction kernel at the HBM
# peak, every GEMM on tensor cores) beside a fix of named kernels sped up (speedup_rows: attention's softmax and
# mask kernels fused into one kernel), which it would otherwise claim part of; fusing every tiny kernel beside
# fusing the optimizer's per-tensor ones (a fused or foreach optimizer); and hiding every collective behind compute
# beside not running the wasted ones (gradients synchronised before more are accumulated into them: overlapping a
# collective nothing needs is no fix for it) and beside removing the waits for a late rank inside them (a
# straggler's or unequal work's: overlapping does not make the late rank's data arrive sooner; a one-rank replay
# that lets the step run on without the collective would credit the wait to the overlap), or the late rank's own
# computation at the others' pace (a pipeline's slow stage: overlapping its send/recv first left it 1 % of 13); so is
# a pipeline's bubble halved beside its slow stage's computation at the others' pace (halving the slow stage's own
# send/recv waits first left its computation < 0.5 %, dismissed, on 8 stages at +-2 ms per kernel); and hiding every
# collective beside halving the bubble, whose send/recv it would otherwise claim
BROADER_FIX = {"graph_launches": ("graph_small_kernels",), "speedup": ("speedup_rows",),
               "graph_small_kernels": ("fuse_optimizer",),
               "overlap_comm": ("remove_wasted_rows", "remove_straggler_wait", "compute_speedup", "shrink_bubble"),
               "shrink_bubble": ("compute_speedup",)}


def _fix_order_key(f: Finding, present: set) -> tuple:
    # measured gains first, waits before other work ("waste first"), then bounds, then assumed factors: a bound priced
    # first claims a measured fix's gain (exposed collectives put on the critical path by injected layout transposes
    # took 12.1 of their 17.8 %; host work's bound made a host-bound step device-bound and the transposes' 5.3 % read
    # 17.1 after it)
    broader = any(k in present for c in f.changes for k in BROADER_FIX.get(c.kind, ()))
    assumed = _assumes_a_speedup(f)
    # a stall seen once in the window is measured for the window (priced with the measured fixes); how often the run
    # pays it is what makes it a bound
    measured = (not f.gain_is_upper_bound or f.rate_unknown) and not assumed
    group = 0 if measured and _removes_a_stall(f) else 1 if measured else 2
    # of two fixes that give the same alone, the waste goes first (host work that launches nothing before a CUDA graph
    # of every launch, where either brings a host-paced step back to the device's pace): the other gets what it adds
    return group, assumed, broader, -f.gain_alone_pct, not _removes_a_stall(f)


def _assumes_a_speedup(f: Finding) -> bool:
    """Whether the fix's size is a factor someone chose (ASSUMED_SPEEDUP_CHANGES): priced after the fixes whose size
    the trace measures, so that those are priced against the trace as it is (fp32 GEMMs made 5.6x faster first
    would make a GPU-bound step host-bound and hand the host's fixes a gain the trace does not show) and the
    assumed factor claims what is left."""
    return any(c.kind in ASSUMED_SPEEDUP_CHANGES for c in f.changes)


# What-ifs that assume a speed-up of a chosen size (optimizer kernels 3x faster) or an upper bound (kernels at
# the HBM peak): their gain is as large as the factor someone picked or the roof allows, while removing a
# wait has a gain the trace itself measures. rank_key ranks every upper bound (Finding.gain_is_upper_bound) with
# them: the launches' host cost is measured, but that one CUDA graph of the whole step removes all of it is not
# (UPPER_BOUND_CHANGES), so it must not outrank a fix the trace confirms (fusing the tiny kernels it also holds).
ASSUMED_SPEEDUP_CHANGES = frozenset({"host_speedup", "speedup", "speedup_rows", "fuse_kernels"})

# A stall (time the step spends waiting: data, checkpoint, syncs, blocking copies, the allocator, exposed
# collectives, a slower rank) ranks before fixes that make necessary work cheaper (CUDA graphs, fusion, a
# faster optimizer) when removing it gains at least this much of the step, as in the order of fixes: waste
# first, whatever its size against the restructurings, since a stall has a configuration-level fix and its
# gain is measured, while a restructuring's is an estimate of work not yet done. 1 % is the stall rules' own
# evidence threshold (DATALOADER_MIN_PCT, HOST_SYNC_MIN_PCT, ...): a stall too small to be priced at that
# ranks by its gain with the rest.
STALL_FIRST_MIN_GAIN_PCT = 1.0
# The share of an upper bound's gain that ranks it against the gains the trace measures. Where a bound was itself
# the truth (the corpus's injected host work and queued waits, H200's launch-bound and fp32 loops) its fix realised
# 0.76-1.0 of it at high severity; at low severity the base's own cost of the same kind is in the bound (host work
# in a host-bound base: 0.19 of it). A bound ranks above a measured stall only when this share of it is still more.
BOUND_REALISED_SHARE = 0.5


def rank_key(f: Finding) -> tuple:
    """Sort key of the ranking: stalls (and the launches' host cost a CUDA graph takes off, HOST_COST_BOUND_CHANGES)
    whose removal gains >= STALL_FIRST_MIN_GAIN_PCT first, then other
    fixes whose effect the trace measures gaining >= MEDIUM_GAIN_PCT, each group by the gain a fix gives whatever else
    is done: its marginal gain, or its gain alone where that is smaller (a stall priced at an upper bound by
    BOUND_REALISED_SHARE of it); then the rest (assumed or upper-bound
    speed-ups, small gains, findings without a what-if) by severity, the priced ones first at a severity, by that
    gain. A fix priced after others can gain more than alone (fp32 GEMMs sped up once the host waits are gone: the
    step has become GPU-bound), a gain that exists only if those are fixed first; ranking on it would put a fix above
    the ones it depends on."""
    assumed = f.gain_is_upper_bound or any(c.kind in ASSUMED_SPEEDUP_CHANGES for c in f.changes)
    sure = min(f.gain_pct, f.gain_alone_pct) if f.priced and f.changes else f.gain_pct
    if not f.changes:
        tier = 3
    elif _removes_a_stall(f) and f.gain_pct >= STALL_FIRST_MIN_GAIN_PCT:
        tier = 0
    elif _removes_a_host_cost(f) and sure * BOUND_REALISED_SHARE >= STALL_FIRST_MIN_GAIN_PCT:
        tier = 0  # with the stalls where the share sure to be realised is a stall's size (HOST_COST_BOUND_CHANGES)
    elif not assumed and f.gain_pct >= MEDIUM_GAIN_PCT:
        tier = 1
    else:
        tier = 2
    if tier >= 2:
        # bounds, small gains and findings without a what-if: by severity, which follows each one's own evidence,
        # then the priced ones first, by gain. A device-only trace idling its GPU 39 % of the time (idle_gpu, medium,
        # unpriced: no host activity says why) ranked below a 6.6 % bound rated low
        return 2, False, -_SEVERITY_LEVEL[f.severity], tier, -sure
    # among stalls, a bound is credited with the share of it a fix is sure to realise (BOUND_REALISED_SHARE): a
    # pipeline's exposed send/recv priced as if overlapped (44 % of the step, an upper bound: the next stage needs
    # the data) ranks below the slow stage that made the other stages wait (26 %, measured as its computation at the
    # others' pace), and an exposed all-reduce priced at 60 % above a DataLoader wait of 5 %
    credited = sure * BOUND_REALISED_SHARE if tier == 0 and assumed else sure
    return tier, -credited, -_SEVERITY_LEVEL[f.severity]


def in_rank_order(found: list[Finding]) -> list[Finding]:
    """The findings ranked: by rank_key, with every low stall (ranked first by it) moved after the last finding
    rated medium or high. Waste comes first among findings of a size, but a stall under MEDIUM_GAIN_PCT of the step
    is not the step's bottleneck beside a finding rated medium or high (>= MEDIUM_GAIN_PCT with its own evidence
    behind it; a bound of >= HIGH_GAIN_PCT): a blocking sync worth 1 % of a GPU-bound step ranked above the unfused
    attention worth 22 % of it, and syncs worth 2.2 % above 87 % of host work (HTA's cuda_event_sync). Nor can such
    a stall be what a large bound measures the symptom of (host stalls idling the GPU read as launch-bound): a stall
    that is, is priced at its size and rated so, and still comes first. (Real traces hold such small stalls often: a
    loss.item() per step, a few cudaMalloc calls, a short DataLoader wait. The corpus's 13 low stalls injected into
    bases with a medium cost of their own now rank after it, as their untouched twins do: top-1 against the labels
    0.930 -> 0.828, against the twin 0.977 both; docs/benchmarks.md.)"""
    ranked = sorted(found, key=rank_key)
    rated = [k for k, f in enumerate(ranked) if f.severity in ("high", "medium")]
    if not rated:
        return _bounds_after_larger_measured_fixes(ranked)
    # the low stalls move first, so that a low bound, which ends after the rated findings, moves no fix before others
    low_stalls = [f for f in ranked[:rated[-1]] if f.severity == "low" and rank_key(f)[0] == 0]
    rest = _bounds_after_larger_measured_fixes([f for f in ranked if all(f is not x for x in low_stalls)])
    at = max(k for k, f in enumerate(rest) if f.severity in ("high", "medium")) + 1
    return rest[:at] + low_stalls + rest[at:]


def _bounds_after_larger_measured_fixes(ranked: list[Finding]) -> list[Finding]:
    """ranked (by rank_key) with the measured fixes of the next group (rank_key's tier 1) that gain more than the
    share of a stall priced at an upper bound rank_key credits moved up to just before it: stalls come before other
    fixes when the trace measures them, but a bound ranks by what its fix is sure to realise (host work priced at 30 %,
    credited 15 %, after DDP's buffer broadcast measured at 15.5 %).

    The larger fix moves up, the bound does not move down: moving the bound after it also moved it after the smaller
    measured stalls it outranks, and three rules each true of a pair (a stall before a restructuring, a restructuring
    before a bound it exceeds, a bound before a stall it exceeds) then put the smallest of the three first (a
    DataLoader wait of 4.8 % above DDP's broadcast of 12.9 % above launches costing 24 %, credited 12.1: the corpus's
    compound cases on nccl_parser). Now the measured 12.9 % goes first, the bound next, the 4.8 % after both."""
    out = list(ranked)
    keys = {id(f): rank_key(f) for f in ranked}
    for b in [f for f in ranked if keys[id(f)][0] == 0 and f.gain_is_upper_bound]:
        at = out.index(b)
        larger = [f for f in out[at + 1:] if keys[id(f)][0] == 1 and -keys[id(f)][1] > -keys[id(b)][1]]
        out = out[:at] + larger + [f for f in out[at:] if all(f is not x for x in larger)]
    return out


def rank_by_marginal_gain(found: list[Finding], gain) -> tuple[list[Finding], FixPlan]:
    """Give each finding with what-if changes its marginal gain and rank the findings by it.

    gain(changes) -> (% , µs) replays the changes together. Order of fixes: those whose gain the trace measures
    first, those that remove a wait (STALL_CHANGES) before the others; then those priced at an upper bound
    (Finding.gain_is_upper_bound, a stall's too); those that assume a speed-up factor (ASSUMED_SPEEDUP_CHANGES) last;
    each group by largest gain alone first; each finding's gain_pct is what its fix adds to the fixes before it, so
    the gains add up to the fix-all gain. Findings without changes (no what-if) keep their gain and come last;
    findings whose fix gains less than MIN_GAIN_PCT in that order are dismissed (FixPlan.dismissed). The ranking
    (rank_key) puts stalls gaining >= STALL_FIRST_MIN_GAIN_PCT first, as the order of fixes does."""
    fixable = [f for f in found if f.changes]
    for f in fixable:
        f.gain_alone_pct = round(gain(f.changes)[0], 2)
    present = {c.kind for f in fixable for c in f.changes}
    fixable.sort(key=lambda f: _fix_order_key(f, present))
    before = _price_in_order(fixable, gain)
    dismissed = [f.kind for f in fixable if f.gain_pct < MIN_GAIN_PCT]
    if dismissed:  # price the rest again without them: a dismissed fix must not lend its gain to the next
        fixable = [f for f in fixable if f.kind not in dismissed]
        before = _price_in_order(fixable, gain)
    # a gain priced without replay (host only) below MIN_GAIN_PCT is checked and found worth too little, as a
    # replayed fix is above: listing it read "gain ≈ 0.0%" beside a severity
    nothing = [f for f in found if not f.changes and f.priced and f.gain_pct < MIN_GAIN_PCT]
    dismissed += [f.kind for f in nothing]
    rest = [f for f in found if not f.changes and f not in nothing]
    for f in rest:
        if f.evidence_pct is not None:
            f.severity = capped_severity(f.gain_pct, f.evidence_pct, f.gain_is_upper_bound) if f.gain_pct else f.severity
    ranked = in_rank_order(fixable) + rest
    return ranked, FixPlan(order=[f.kind for f in fixable], fix_all_gain_pct=round(before[0], 2),
                           fix_all_gain_us=round(before[1], 1), dismissed=dismissed)


def _price_in_order(fixable: list[Finding], gain) -> tuple[float, float]:
    """Apply the fixes in order, credit each with what it adds (marginal gain, fix_order, severity);
    return the gain of all of them (% , µs). The severity is that of the gain the fix gives whatever else is done:
    its marginal gain, or its gain alone where that is smaller (as rank_key ranks). A fix worth more after others
    (queued waits that cost 1.1 % of a host-bound step, 24 % once the host is fast) is rated by what it gains now:
    rated by the gain it would have after them, it ranked above the fixes it depends on."""
    applied: tuple = ()
    before = (0.0, 0.0)
    for k, f in enumerate(fixable, 1):
        applied = applied + tuple(f.changes)
        now = gain(applied)
        f.gain_pct, f.gain_us = round(now[0] - before[0], 2), round(now[1] - before[1], 1)
        f.fix_order = k
        f.severity = capped_severity(min(f.gain_pct, f.gain_alone_pct), f.evidence_pct, f.gain_is_upper_bound)
        before = now
    return before


def merge_across_ranks(findings: list[Finding]) -> list[Finding]:
    """One finding per kind: ranks joined, evidence and gain of the rank with the largest gain."""
    best: dict[str, Finding] = {}
    ranks: dict[str, set] = {}
    for f in findings:
        ranks.setdefault(f.kind, set()).update(f.ranks)
        if f.kind not in best or f.gain_pct > best[f.kind].gain_pct:
            best[f.kind] = f
    out = []
    for k, f in best.items():
        f.ranks = sorted(ranks[k])
        out.append(f)
    return in_rank_order(out)
