"""Insufficient evidence is a result: what in a trace limits how far its findings can be trusted.

Each check returns Caveats: a note for the user, the confidence it leaves ("medium" or "low") and
the finding kinds it touches (None: all). `apply_caveats` lowers each finding's confidence to the
lowest caveat touching it and attaches the notes; the same notes reach the terminal, JSON and HTML.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.facts import RankFacts
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import PYTHON, RUNTIME

MIN_STEPS = 2                  # fewer analysed ProfilerSteps: a single step may be atypical
MISSING_GPU_PCT = 5.0          # launch calls without their device event, % of launches
UNLAUNCHED_PCT = 5.0           # device events whose launch is not in the trace, % of device events
PY_FRAMES_PER_LAUNCH = 1.0     # with_stack: Python frames per launch call above which host time is inflated
CLOCK_SPREAD_US = 50.0         # rank clocks aligned on collective ends disagree by more than this (IQR)
GPU_LAG_NOTE_SHARE = 0.5       # a step's GPU work ends after its ProfilerStep by more than this share of a step

HOST_TIME_KINDS = frozenset({"launch_bound", "small_kernels", "idle_gpu", "data_loader_stall", "checkpoint_stall"})
CROSS_RANK_KINDS = frozenset({"straggler", "exposed_comm"})
_LAUNCH_WORDS = ("LaunchKernel", "LaunchCooperativeKernel", "Memcpy", "Memset", "GraphLaunch")


@dataclass(kw_only=True, frozen=True)
class Caveat:
    """One limit of the evidence: its note, the confidence it leaves, and the kinds it touches (None: all)."""

    note: str
    confidence: str
    kinds: frozenset | None = None


def rank_caveats(f: RankFacts) -> list[Caveat]:
    """The limits of one rank's evidence (see the module docstring)."""
    t, w = f.table, f.window
    out: list[Caveat] = []
    step = steps_caveat(f)
    if step is not None:
        out.append(step)
    if not f.has_gpu:
        out.append(Caveat(note="no GPU activity recorded: host-side evidence only, gains are host-time upper bounds",
                          confidence="low"))
        return out
    link = correlated_host_row(t)
    launches = np.flatnonzero(w.keep & (t.kind == RUNTIME) & (t.correlation >= 0) &
                              np.isin(t.name, t.ids_matching(lambda s: any(x in s for x in _LAUNCH_WORDS))))
    if launches.size:
        dev_corr = t.correlation[w.device]
        missing = 100.0 * float((~np.isin(t.correlation[launches], dev_corr)).mean())
        if missing > MISSING_GPU_PCT:
            out.append(Caveat(note=f"{missing:.0f}% of kernel launches and copies have no GPU event (GPU activity "
                                   "missing, or the GPU trace ends before the host's): device-side figures are "
                                   "incomplete", confidence="medium"))
    dev = np.flatnonzero(t.on_device)  # the whole trace: the window keeps only launched device events
    unlaunched = 100.0 * float((link[dev] < 0).mean()) if dev.size else 0.0
    if unlaunched > UNLAUNCHED_PCT:
        out.append(Caveat(note=f"{unlaunched:.0f}% of GPU events have no launch in the trace (the window is "
                               "truncated: it starts or ends mid-step)", confidence="medium"))
    n_py = int((w.keep & (t.kind == PYTHON)).sum())
    shapes = bool(t.metadata.get("profiler", {}).get("record_shapes"))
    if n_py > PY_FRAMES_PER_LAUNCH * max(launches.size, 1) or shapes:
        what = " and ".join(x for x in ((f"with_stack=True ({n_py / max(launches.size, 1):.0f} Python frames "
                                         "per launch)") if n_py else "", "record_shapes=True" if shapes else "") if x)
        out.append(Caveat(note=f"profiler overhead ({what}) adds host time: host-bound findings and their gains "
                               "may be overstated; confirm with a profile without it",
                          confidence="medium", kinds=HOST_TIME_KINDS))
    return out


def steps_caveat(f: RankFacts) -> Caveat | None:
    """Fewer than MIN_STEPS complete steps analysed: with none, every finding and gain is over the whole trace
    (the step finder's note says why there are no steps); with one, that step may not be typical."""
    n_steps, w = len(f.step_times), f.window
    if n_steps >= MIN_STEPS:
        return None
    if n_steps == 0:
        why = w.markers.note or w.note or "no complete profiler step in the chosen range"
        return Caveat(note="no complete profiler step: findings and gains are over the whole trace (start-up and "
                           f"partial iterations included), not per step; {why}", confidence="medium")
    why = w.note or ("the last step, cut short by the profiler, is left out; " if w.steps_excluded else "") + \
        "profile more steps (torch.profiler schedule with active>=3)"
    return Caveat(note=f"1 complete profiler step analysed (fewer than {MIN_STEPS}): one step may not be typical; "
                       f"{why}", confidence="medium")


def rank_notes(f: RankFacts) -> list[str]:
    """Observations that qualify the per-step figures without lowering any finding's confidence."""
    out = []
    other = f.window.markers.ignored_rows.size
    if other:
        out.append(f"{other} ProfilerStep span(s) on another host thread than the one that calls prof.step() are "
                   "not taken as steps")
    st = [x for x in f.step_times if x.gpu_end_us == x.gpu_end_us]
    if not st:
        return out
    overrun = float(np.median([x.gpu_end_us - (x.start_us + x.host_us) for x in st]))
    step = float(np.median([x.host_us for x in st]))
    if step > 0 and overrun > GPU_LAG_NOTE_SHARE * step:
        out.append(f"the GPU work of a step ends {overrun / 1e3:.1f} ms after its ProfilerStep ends on the host "
                   f"({overrun / step:.1f} steps behind): per-step GPU figures follow the launches, not the host "
                   "windows")
    return out


def cross_rank_caveats(clock_offset_us: dict, clock_spread_us: dict) -> list[Caveat]:
    """Clock offsets between ranks: waits across ranks rest on aligning the clocks on collective ends."""
    if not clock_spread_us:
        return []
    worst = max(clock_spread_us, key=clock_spread_us.get)
    if clock_spread_us[worst] <= CLOCK_SPREAD_US:
        return []
    off = max(abs(v) for v in clock_offset_us.values())
    return [Caveat(note=f"rank clocks differ by up to {off / 1e3:.2f} ms and the alignment on collective ends "
                        f"varies by {clock_spread_us[worst]:.0f} µs (IQR, rank {worst}): cross-rank waits are "
                        "approximate", confidence="medium", kinds=CROSS_RANK_KINDS)]


_LEVEL = {"high": 2, "medium": 1, "low": 0}


def apply_caveats(found: list[F.Finding], caveats: list[Caveat]) -> None:
    """Lower each finding's confidence to the lowest caveat touching its kind, and attach the notes."""
    for x in found:
        for c in caveats:
            if c.kinds is None or x.kind in c.kinds:
                if _LEVEL[c.confidence] < _LEVEL[x.confidence]:
                    x.confidence = c.confidence
                if c.note not in x.notes:
                    x.notes.append(c.note)
