"""The job's slow ranks, as one rank's findings: `straggler` (a rank, or a group of ranks, the others wait for at
collectives, step after step) and `load_imbalance` (ranks take turns being late, each with more work in the steps it
is late). crossrank.py finds who waits for whom across the ranks (StragglerFacts); these rules decide what that is and
name its what-if. Thresholds beside the rules that read them.
"""

from __future__ import annotations

from trainperf.diagnose import advice
from trainperf.diagnose import findings as F
from trainperf.diagnose.crossrank import Recurrence, straggler_min_p_value
from trainperf.diagnose.facts import RankFacts, StragglerFacts
from trainperf.diagnose.pipeline import schedule_names
from trainperf.diagnose.replay import Change
from trainperf.diagnose.routing import ROUTED_MIN_SHARE, Routed
from trainperf.diagnose.slow_work import UNTRACED_KEY, WorkComparison, work_kind
from trainperf.diagnose.units import short_name


STRAGGLER_MIN_WAIT_PCT = 2.0  # wait the straggler causes each other rank, % of the window (crossrank decides)


# CPU-only jobs (crossrank.host_straggler) whose window is too short for the test below: the others' per-step
# wait, % of the step, that the recurrence heuristic needs besides. The clean 2-rank gloo run of the corpus
# (healthy-real) waited ~4% per step from ordinary imbalance; the smallest injected straggler (straggler-low-real)
# ~7.5%: in-sample only, 4 cases, not cross-validated. With the steps for the test, the test alone decides
# whether there is a straggler, and its size only how severe it is: a rank late by 4.9 % in every step
# (straggler-low-real-fsdp, p 0.02) is a straggler, one late by 4 % in some steps and early in others is not.
STRAGGLER_HOST_MIN_PCT = 5.0
# ... and its extra work must recur step after step more than load noise makes it (crossrank.straggler_p_value,
# a sign-flip test over the window or its last steps: under "no straggler" each step's extra is as likely
# negative). 0.05: the usual false-alarm rate, stated, not fitted. On a shared machine either rank is slower in
# some steps by the load alone (corpus healthy-real-fsdp, 2026-12-02: +5, +4, -12, +21 ms). The GPU straggler's
# test (crossrank.persistent_laggard: is it the laggard in more steps than ranks taking turns would make it) uses
# the same rate.
STRAGGLER_HOST_ALPHA = 0.05
# With too few steps for the test to pass at all (4 steps of 2 ranks: p >= 0.125), the recurring extra work must
# outweigh the other ranks' opposite excess (crossrank.recurring_over_opposite >= this; 1: as large; not fitted),
# and a caveat says the straggler is unconfirmed (api): a persistent straggler in a short profile stays named.
STRAGGLER_HOST_MIN_SNR = 1.0

# the straggler computes this much longer than the other ranks' median (per step, crossrank.compute_straggler).
# Untouched HTA trace_filter: rank 1 computes 1.28x rank 0, and making it as fast gains < MIN_GAIN_PCT (the
# GPU idles ~80 %): the replayed gain, not this ratio, keeps natural imbalance from being a finding.
STRAGGLER_MIN_COMPUTE_RATIO = 1.05


def testable(steps: int, n_ranks: int) -> bool:
    """Whether `steps` steps of n_ranks ranks are enough for the straggler's sign-flip test to pass at all
    (crossrank.straggler_min_p_value at most STRAGGLER_HOST_ALPHA)."""
    return straggler_min_p_value(steps, n_ranks) <= STRAGGLER_HOST_ALPHA


def extra_work_is_noise(r: Recurrence) -> bool:
    """Whether a CPU-only job's slowest rank's extra work per step is within load noise, so no straggler: the
    sign-flip test (its p_value above STRAGGLER_HOST_ALPHA) when its steps are enough for it (testable), else the
    recurrence heuristic (its snr below STRAGGLER_HOST_MIN_SNR). GPU ranks whose collectives cannot be matched are
    judged by their computation per step (api._compute_extra_is_noise)."""
    return r.p_value > STRAGGLER_HOST_ALPHA if testable(r.steps, r.n_ranks) else r.snr < STRAGGLER_HOST_MIN_SNR


def straggler(f: RankFacts) -> F.Finding | None:
    """A rank arrives late at collectives and the others wait for it (decided across ranks). Priced on the
    waiting ranks as their waits removed, and on the straggler itself as its computation as fast as the
    other ranks' median (the job runs at the pace of its slowest rank); the merge keeps the larger."""
    s = f.straggler
    if s is None:
        return None
    h = s.host
    if h is not None:  # CPU-only job: priced from the other ranks' per-step wait, no replay
        # its extra work recurs over the window, and again over the steps without a stall its gain is priced on
        # (crossrank.host_straggler): extra work only beside the stalls is theirs
        noise = extra_work_is_noise(h.recurrence) or extra_work_is_noise(h.unstalled)
        small = not testable(h.unstalled.steps, h.n_ranks) and h.gain_pct < STRAGGLER_HOST_MIN_PCT
        if f.rank != h.rank or noise or small:
            return None
        metrics = {"others_wait_per_step": (h.gain_us, "us"), "others_wait_share": (h.gain_pct, "%"),
                   "p_value_load_noise": (h.recurrence.p_value, ""),
                   "extra_work_over_opposite": (min(h.recurrence.snr, 1e6), "x")}
        stalls = ""
        if h.stalled_steps:  # priced marginal to the DataLoader/checkpoint stalls' fixes (crossrank.host_straggler)
            metrics["steps_with_stall_left_out"] = (h.stalled_steps, "count")
            metrics["p_value_load_noise_unstalled_steps"] = (h.unstalled.p_value, "")
            stalls = ", in the steps without a DataLoader or checkpoint stall"
        metrics |= _work_metrics(s.host_work, host=True)
        found = F.rank_finding(f, kind="straggler", metrics=metrics, gain_pct=h.gain_pct,
                               gain_us=h.gain_us, ranks=[h.rank], evidence_pct=h.gain_pct,
                               what_if=f"no rank waits for rank {h.rank} (host only: the others' wait per "
                                       f"step{stalls})")
        if schedule_names(f.table, f.window).named:  # a pipeline stage: its schedule names itself (pipeline.py)
            found.recommendation = advice.STRAGGLER_STAGE_RECOMMENDATION
        else:
            if s.host_work is not None and s.host_work.cause:  # the same operators slower (its CPU), or more work
                found.recommendation = advice.STRAGGLER_CAUSE_RECOMMENDATION.format(
                    rank=h.rank, cause=_work_cause(s.host_work, [h.rank], host=True))
            found.recommendation += _host_extra_text(s.host_work)  # what its training thread does more of
        return found
    if s.compute_group_ratio and not s.persistent:
        # a slow pipeline stage beside matched waits that name no one rank: its ranks are the straggler (below), the
        # waits load_imbalance's, and no other rank is named a straggler
        if f.rank not in s.compute_group_ratio:
            return None
    elif not s.persistent:  # the rank the others wait for changes from step to step
        if s.slow_ranks:  # among a group of ranks late in every step: a slow node
            return _slow_ranks(f)
        if paused_not_loaded(s):
            return _paused_hosts(f)
        # one rank's extra work, recurring, holds the waiting (a rank-0 evaluation every few steps): that rank, else
        # load_imbalance
        return _extra_work_rank(f) if _one_recurring_late_rank(s) else None
    metrics = {"caused_wait": (s.caused_us, "us"), "caused_wait_per_other_rank": (s.caused_per_other_us, "us"),
               "compute_imbalance": (s.imbalance_pct, "%"), "compute_vs_other_ranks": (s.compute_ratio, "x"),
               "extra_compute": (s.extra_compute_us, "us")}
    if not s.compute_group_ratio:  # the matched collectives' laggard (the compute straggler's are load_imbalance's)
        if s.last_in_steps:  # in how many of the steps with waits it was the one waited for
            metrics["steps_it_was_waited_for"] = (s.last_in_steps.get(s.rank, 0), "count")
            metrics["steps_with_waits"] = (sum(s.last_in_steps.values()), "count")
        metrics |= _lateness_metrics(s)
    metrics |= _work_metrics(s.work)
    metrics |= _routed_metrics(s, sorted(s.compute_group_ratio) or [s.rank])
    # the straggler computes longer; where collectives cannot be matched, so may the ranks computing alike with it
    # (a slow stage's copies), each priced as its own computation at the other ranks' pace
    ratio = s.compute_group_ratio.get(f.rank, s.compute_ratio if f.rank == s.rank else None)
    if ratio is not None:
        if ratio < STRAGGLER_MIN_COMPUTE_RATIO:
            return None
        metrics["compute_vs_other_ranks"] = (ratio, "x")
        found = F.rank_finding(f, "straggler", metrics, [], (Change("compute_speedup", factor=ratio),),
                               f"rank {f.rank} computes as fast as the other ranks ({ratio:.2f}x faster)",
                               evidence_pct=f.pct(max(s.caused_per_other_us, s.extra_compute_us)), ranks=[f.rank])
    elif not f.waits or schedule_drain(f, s):
        return None
    else:
        found = F.rank_finding(f, "straggler", metrics,
                               # the events are on the straggler's timeline, from its first event: shift them so that
                               # api._relative_times (which subtracts this rank's first event) leaves them as they are
                               [(n, t0 + f.origin_us, d) for n, t0, d in s.events], (Change("remove_straggler_wait"),),
                               f"no rank waits for rank {s.rank} inside collectives",
                               evidence_pct=f.pct(s.caused_per_other_us), ranks=[s.rank])
    if f.p2p_comm_share > 0.5:  # pipeline stages (a majority, as exposed_comm's)
        found.recommendation = advice.STRAGGLER_STAGE_RECOMMENDATION
    elif late_without_more_work(s):  # the same computation started late: by its host, or by work queued ahead
        found.recommendation = (_paused_host_recommendation(s, [s.rank]) if paused_not_loaded(s)
                                else advice.QUEUED_WORK_STRAGGLER_RECOMMENDATION.format(rank=s.rank))
    elif routed(s, found.ranks):  # more tokens routed to its experts
        found.recommendation = advice.STRAGGLER_CAUSE_RECOMMENDATION.format(
            rank=found.ranks[0], cause=_routed_cause(s, found.ranks))
    elif s.work is not None and s.work.cause:  # its extra computation: the same work slower, or more work
        found.recommendation = advice.STRAGGLER_CAUSE_RECOMMENDATION.format(
            rank=found.ranks[0], cause=_work_cause(s.work, found.ranks))
        found.recommendation += " " + advice.SLOWER_GPU_EXCLUDE if s.work.cause == "device" else ""
    return found


def _work_metrics(work: WorkComparison | None, host: bool = False) -> dict:
    """The slow ranks' extra computation a step (host: their training thread's own time, a CPU-only job's) and where
    it sits (slow_work.WorkComparison), as finding metrics; none without the comparison."""
    if work is None:
        return {}
    out = {("extra_host_time_per_step" if host else "extra_compute_per_step"): (work.extra_us, "us"),
           "extra_from_slower_same_work": (work.share(work.slower_extra_us), "%"),
           "extra_from_more_work": (work.share(work.more_work_extra_us), "%")}
    if work.shaped:  # the same operator on the same shapes: the slowdown of the same work
        out["same_work_slowdown"] = (work.same_work_slowdown, "x")
    return out


def _routed(s: StragglerFacts, ranks: list[int] | None, late_steps: bool) -> Routed | None:
    """What `ranks` (None: every late rank) received in their all-to-alls against the other ranks: in the steps each
    was the late one (late_steps: ranks late in turn, or one rank late in some steps), else across every step (ranks
    slow step after step, among whom each step's laggard is the one that drew the most; routing.RoutingEvidence)."""
    if s.routing is None:
        return None
    return s.routing.in_late_steps(ranks) if late_steps or ranks is None else s.routing.across_steps(ranks)


def routed(s: StragglerFacts, ranks: list[int] | None = None, late_steps: bool = False) -> bool:
    """Whether the extra computation of `ranks` (None: every late rank; late_steps: as _routed) is read as routing's:
    their extra all-to-all data (the tokens routed to their experts) accounts for at least ROUTED_MIN_SHARE of it
    (_routed), and no recorded shapes compare their products (a comparison by shapes says what the work is, or that
    it ran slower, itself)."""
    shaped = any(w is not None and w.shaped and w.cause for w in (s.work, s.late_work))
    seen = _routed(s, ranks, late_steps)
    return seen is not None and seen.routed_share >= ROUTED_MIN_SHARE and not shaped


def _routed_kind(s: StragglerFacts) -> str:
    """What the late ranks' all-to-all carries: "embeddings" where their extra computation is the lookups' (slow_work.
    work_kind, by the operators' names), else "experts"."""
    works = [w for w in (s.work, s.late_work) if w is not None]
    return "embeddings" if any(work_kind(w) == "embeddings" for w in works) else "experts"


def _routed_cause(s: StragglerFacts, ranks: list[int], late_steps: bool = False) -> str:
    """advice.ROUTED_TOKENS_CAUSE for `ranks` (late_steps: as _routed), with the balancing of what the all-to-all
    carries (_routed_kind)."""
    who = f"Rank {ranks[0]}" if len(ranks) == 1 else f"Ranks {F.rank_list(ranks)}"
    kind = _routed_kind(s)
    when = ("in the steps it was late" if len(ranks) == 1 else "in the steps they were late") if late_steps \
        else "a step"
    return (advice.ROUTED_TOKENS_CAUSE.format(who=who, ratio=_routed(s, ranks, late_steps).ratio, when=when,
                                              what=advice.ROUTED_WHAT[kind])
            + " " + advice.BALANCE_BY_WORK_KIND[kind])


def _routed_metrics(s: StragglerFacts, ranks: list[int] | None, late_steps: bool = False) -> dict:
    """_routed of `ranks` as finding metrics; none where no all-to-all records its size."""
    seen = _routed(s, ranks, late_steps)
    if seen is None:
        return {}
    return {"all_to_all_received_vs_others": (seen.ratio, "x"),
            "extra_compute_from_routed_tokens": (100.0 * seen.routed_share, "%")}


def _work_cause(work: WorkComparison, ranks: list[int], host: bool = False) -> str:
    """The cause the slow ranks' extra computation names (advice.SAME_WORK_SLOWER_CAUSE or MORE_WORK_CAUSE); host: a
    CPU-only job's straggler's training thread (SAME_HOST_WORK_SLOWER_CAUSE or HOST_MORE_WORK_CAUSE)."""
    if host:
        return (advice.SAME_HOST_WORK_SLOWER_CAUSE.format(slowdown=work.same_work_slowdown, rank=ranks[0],
                                                          share=work.share(work.slower_extra_us))
                if work.cause == "device" else advice.HOST_MORE_WORK_CAUSE.format(
                    share=work.share(work.more_work_extra_us)))
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {F.rank_list(ranks)}"
    if work.cause == "device":
        return advice.SAME_WORK_SLOWER_CAUSE.format(slowdown=work.same_work_slowdown, who=who,
                                                    share=work.share(work.slower_extra_us))
    return advice.MORE_WORK_CAUSE.format(who=who[0].upper() + who[1:], share=work.share(work.more_work_extra_us),
                                         largest=_largest_text(work), fix=advice.BALANCE_BY_WORK_KIND[work_kind(work)])


def _largest_text(work: WorkComparison) -> str:
    """The two operators holding most of the extra computation, with the shapes holding most of theirs and their time
    a step on the slow ranks and the others."""
    return _extra_text(work.largest_extra(2))


def _extra_text(largest: list[tuple[str, float, float, str]], shapes: bool = True) -> str:
    """WorkComparison.largest_extra rows as text: "op (most on shapes): 2.95 ms a step there, 0.00 on the others";
    shapes: name the shapes holding most of each operator's extra."""
    return "; ".join(f"{short_name(op + (f' (most on {where})' if shapes and where else ''), 100)}: "
                     f"{mine / 1e3:.2f} ms a step there, {theirs / 1e3:.2f} on the others"
                     for op, mine, theirs, where in largest)


# the late ranks' extra computation accounts for less than this share of their lateness (crossrank.lateness_share):
# they had the same work and started it late; their GPU's extra idle at least this share: their host started it late.
# Half: the midpoint between the two readings, not fitted (no labeled case of either kind)
LATE_WORK_MIN_SHARE = 0.5


def _under_half(share: float | None) -> bool:
    """Whether a measured share of the lateness (crossrank.lateness_share) is under LATE_WORK_MIN_SHARE."""
    return share is not None and share < LATE_WORK_MIN_SHARE


def late_without_more_work(s: StragglerFacts) -> bool:
    """Whether the late ranks had no more computation than the others in the steps they were late."""
    return _under_half(s.late_work_share)


def late_by_queued_work(work_share: float | None, idle_share: float | None) -> bool:
    """Whether late ranks were late with no more computation than the others (work_share, crossrank.lateness_share of
    their computation) and no longer GPU idle waiting for their host (idle_share): device work queued ahead of the
    collectives made them late (LATE_WORK_MIN_SHARE each)."""
    return _under_half(work_share) and _under_half(idle_share)


def schedule_drain(f: RankFacts, s: StragglerFacts) -> bool:
    """Whether the rank the others wait for in a pipeline job is late by its place in the schedule, not slow: no
    more computation than the others in the steps it was late and no more host pause (late_by_queued_work), so the
    work queued ahead of it, a stage's receives waiting for its neighbours, made it late. In 1F1B and GPipe the first
    stage runs the last backward and reaches the step's closing collectives (gradient-norm all-reduce, DP gradient
    sync) last by design, its waits the drain of the bubble that pipeline_bubble prices; a slow stage computes more
    and is named by its computation (api: the compute straggler is sought then, as where no collective is matched)."""
    return f.pipeline_stage and late_by_queued_work(s.late_work_share, s.late_idle_share)


def paused_not_loaded(s: StragglerFacts) -> bool:
    """Whether late ranks started the same work late because their host did: no more computation, and (where the
    steps tell) their GPU's extra idle, waiting for the host, accounts for at least half the lateness (else other
    device work queued ahead delayed them)."""
    return late_without_more_work(s) and (s.late_idle_share is None or s.late_idle_share >= LATE_WORK_MIN_SHARE)


def paused_by(s: StragglerFacts) -> str | None:
    """The named host stall the late ranks' hosts paused in (a cause of facts.STALL_CAUSES: a DataLoader fetch, a
    save, a compile, a garbage collection), where they started the same work late (paused_not_loaded) and their own
    stalls of that cause in the steps they were late account for at least half the lateness
    (StragglerFacts.late_stall_shares; the largest such); else None."""
    if not paused_not_loaded(s) or not s.late_stall_shares:
        return None
    cause, share = max(s.late_stall_shares.items(), key=lambda kv: kv[1])
    return cause if share >= LATE_WORK_MIN_SHARE else None


def _paused_host_recommendation(s: StragglerFacts, ranks: list[int]) -> str:
    """The fix for late ranks whose host paused: that stall's, with its share, where their own stalls of one cause
    account for the lateness (paused_by); else what one late rank does alone, or what pauses ranks in turn."""
    cause = paused_by(s)
    if cause is not None:
        return advice.STALL_STRAGGLER_RECOMMENDATIONS[cause].format(share=100.0 * s.late_stall_shares[cause])
    return (advice.LATE_HOST_STRAGGLER_RECOMMENDATION.format(rank=ranks[0]) if len(ranks) == 1
            else advice.PAUSED_HOSTS_RECOMMENDATION) + _host_extra_text(s.host_work, late_steps=not s.persistent)


# a host operator is named as the straggler's extra host work when its own time beyond the other ranks' is at least
# this share of the straggler's host work a step: the larger differences, not the jitter of a hundred small ones.
# Stated, not fitted
HOST_EXTRA_MIN_SHARE = 0.01


def _host_extra_text(work: WorkComparison | None, late_steps: bool = False) -> str:
    """" " + the straggler's training-thread operators with the most own time beyond the other ranks' (up to two,
    each at least HOST_EXTRA_MIN_SHARE of its host work a step, advice.HOST_EXTRA_WORK_TEXT; in the steps each rank
    was late, LATE_STEPS_HOST_WORK_TEXT, for ranks late in turn), or "" where none."""
    if work is None:
        return ""
    floor = HOST_EXTRA_MIN_SHARE * sum(m for m, _ in work.by_key.values())
    named = [x for x in work.largest_extra(2) if x[1] - x[2] >= floor]
    if not named:
        return ""
    text = _extra_text(named, shapes=False)
    untraced = named[0][0] == UNTRACED_KEY
    said = (advice.LATE_STEPS_HOST_WORK_TEXT if late_steps else advice.HOST_EXTRA_WORK_TEXT).format(largest=text)
    return " " + said + (f" {advice.NAMING_UNTRACED}" if untraced else "")


def _lateness_metrics(s: StragglerFacts) -> dict:
    """How much of the late ranks' lateness their extra computation, their GPU's extra idle and their own named host
    stalls, by cause, account for (%)."""
    out = {}
    if s.late_work_share is not None:
        out["lateness_from_extra_compute"] = (100.0 * s.late_work_share, "%")
    if s.late_idle_share is not None:
        out["lateness_from_gpu_idle"] = (100.0 * s.late_idle_share, "%")
    out |= {f"lateness_from_{cause}": (100.0 * share, "%") for cause, share in sorted(s.late_stall_shares.items())}
    return out


def late_ranks_that_cost(s: StragglerFacts) -> list[int]:
    """The ranks the others waited for, among those that were the last in some step, that caused at least half the
    mean wait caused per such rank (StragglerFacts.laggard_waits): ranks taking turns cause alike and are all
    named; one rank's 6-ms pause in one step, beside jitter laggards of 0.1 ms in the others, is named alone. Half
    the mean: a stated margin for turns that are not even (not fitted; no labeled case of either kind)."""
    caused: dict[int, float] = {}
    for rank, us in s.laggard_waits:
        caused[rank] = caused.get(rank, 0.0) + us
    if not caused:
        return sorted(s.last_in_steps)
    bar = 0.5 * sum(caused.values()) / len(caused)
    return sorted(r for r, us in caused.items() if us >= bar)


def _one_recurring_late_rank(s: StragglerFacts) -> bool:
    """Whether one rank alone caused the waiting that costs (late_ranks_that_cost), and did so in two steps or more
    (steps whose wait for it is at least the mean wait of a step with waits, not jitter): a straggler must recur (as
    the CPU-only test asks, crossrank.straggler_p_value); one long step of one rank is as likely the largest draw of
    unequal work (a long sequence) as work only that rank does."""
    costly = late_ranks_that_cost(s)
    if len(costly) != 1 or not s.laggard_waits:
        return False
    mean = sum(us for _, us in s.laggard_waits) / len(s.laggard_waits)
    return sum(1 for rank, us in s.laggard_waits if rank == costly[0] and us >= mean) >= 2


def _turn_waits(f: RankFacts, kind: str, what_if: str, ranks: list[int] | None = None,
                extra: dict | None = None) -> F.Finding:
    """The waits of this rank inside matched collectives for ranks that take turns being late, as a finding of
    `kind` naming `ranks` (default: the late ranks whose waits cost, late_ranks_that_cost), with `extra` metrics:
    priced as those waits removed (every rank at the step's mean pace instead of its slowest)."""
    s = f.straggler
    ranks = late_ranks_that_cost(s) if ranks is None else ranks
    waited = float(sum(v for v, _ in f.waits.values()))
    metrics = {"waited_in_collectives": (waited, "us"), "waited_share": (f.pct(waited), "%"),
               "steps_with_waits": (sum(s.last_in_steps.values()), "count"),
               "compute_imbalance": (s.imbalance_pct, "%")}
    metrics |= _lateness_metrics(s) | _routed_metrics(s, ranks, late_steps=not s.slow_ranks)
    metrics |= {f"steps_rank_{r}_was_waited_for": (n, "count") for r, n in sorted(s.last_in_steps.items())}
    metrics |= extra or {}
    longest = sorted(f.waits.items(), key=lambda kv: -kv[1][0])[:3]
    return F.rank_finding(f, kind, metrics,
                          [(f"{f.table.names[int(f.table.name[row])][:60]} (waited for rank {other})",
                            float(f.window.ts_us[row]), us) for row, (us, other) in longest],
                          (Change("remove_straggler_wait"),), what_if, evidence_pct=f.pct(waited), ranks=ranks)


def _paused_hosts(f: RankFacts) -> F.Finding | None:
    """Ranks take turns arriving late at collectives with no more computation than the others in those steps: each
    started its work late, its host paused (Python's garbage collector at a different moment on each rank, CPU
    contention, a slow read on that rank). Transient stragglers (the kind a job-wide GC schedule fixes), not
    unequal work."""
    if not f.waits:
        return None
    found = _turn_waits(f, "straggler", "no rank's host pauses before its work: nobody waits in collectives")
    # one rank's pauses hold the waiting (a rank-0 evaluation or log write in one step): what only it does
    found.recommendation = _paused_host_recommendation(f.straggler, found.ranks)
    return found


def _slow_ranks(f: RankFacts) -> F.Finding | None:
    """A group of ranks late at the collectives step after step, each the last in some steps (StragglerFacts.
    slow_ranks: a slow node, not unequal work per step). Priced, as load imbalance, as this rank's waits inside
    collectives removed: the group as fast as the others."""
    if not f.waits:
        return None
    s = f.straggler
    group = s.slow_ranks
    found = _turn_waits(f, "straggler", f"rank(s) {F.rank_list(group)} as fast as the others: nobody waits in "
                        "collectives", ranks=list(group),
                        extra={"p_value_arrival_order_random": (s.slow_ranks_p_value, "")} | _work_metrics(s.work))
    cause = (advice.SLOW_RANKS_HOST_CAUSE if paused_not_loaded(s)
             else _routed_cause(s, list(group)) if routed(s, list(group))
             else _work_cause(s.work, list(group)) if s.work is not None and s.work.cause
             else advice.SLOW_RANKS_DEVICE_CAUSE)
    who = f"Ranks {F.rank_list(group)}" if len(group) > 1 else f"Rank {group[0]}"
    found.recommendation = advice.SLOW_RANKS_RECOMMENDATION.format(who=who, cause=cause)
    return found


def _extra_work_rank(f: RankFacts) -> F.Finding | None:
    """One rank, late in some steps with more computation, caused the waiting that costs, in two steps or more
    (_one_recurring_late_rank): work only it does in those steps, a straggler of those steps rather than ranks
    taking turns."""
    if not f.waits:
        return None
    found = _turn_waits(f, "straggler", "no rank does more work than the others in a step: nobody waits in "
                        "collectives", extra=_work_metrics(f.straggler.late_work))
    if routed(f.straggler, found.ranks, late_steps=True):  # more tokens routed to its experts in those steps
        found.recommendation = advice.LATE_STEPS_ROUTED_RECOMMENDATION.format(
            rank=found.ranks[0], cause=_routed_cause(f.straggler, found.ranks, late_steps=True))
        return found
    found.recommendation = advice.EXTRA_WORK_STRAGGLER_RECOMMENDATION.format(rank=found.ranks[0])
    work = f.straggler.late_work
    if work is not None and work.cause:  # what the late steps' extra computation was
        found.recommendation += " " + advice.LATE_STEPS_WORK_TEXT.format(
            largest=_largest_text(work) if work.cause == "work" else
            f"the same operations on the same shapes, {work.same_work_slowdown:.2f}x slower")
    return found


def load_imbalance(f: RankFacts) -> F.Finding | None:
    """Ranks wait for each other inside matched collectives, but the rank they wait for changes from step to step
    (StragglerFacts.persistent false) and computes more in the steps it is late (or the steps cannot be compared):
    no rank is slow, the ranks get unequal work per step (sequence lengths without packing, MoE routing, uneven
    shards). Priced, like a straggler's waiting ranks, as this rank's waits inside collectives removed."""
    s = f.straggler
    if (s is None or s.persistent or s.slow_ranks or s.host is not None or not f.waits
            or paused_not_loaded(s) or _one_recurring_late_rank(s)):
        return None
    found = _turn_waits(f, "load_imbalance", "every rank's work per step balanced: nobody waits in collectives",
                        extra=_work_metrics(s.late_work))
    work = s.late_work
    if routed(s, found.ranks, late_steps=True):
        kind = _routed_kind(s)
        found.recommendation = advice.LOAD_IMBALANCE_ROUTED_RECOMMENDATION.format(
            ratio=_routed(s, found.ranks, late_steps=True).ratio, what=advice.ROUTED_WHAT[kind],
            fix=advice.BALANCE_BY_WORK_KIND[kind])
    elif work is not None and work.cause == "work":
        found.recommendation = advice.LOAD_IMBALANCE_WORK_RECOMMENDATION.format(
            share=work.share(work.more_work_extra_us), largest=_largest_text(work),
            fix=advice.BALANCE_BY_WORK_KIND[work_kind(work)])
    elif work is not None and work.cause == "device":
        found.recommendation = advice.LOAD_IMBALANCE_DEVICE_RECOMMENDATION.format(
            slowdown=work.same_work_slowdown, share=work.share(work.slower_extra_us))
    return found
