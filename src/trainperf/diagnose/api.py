"""`diagnose(path)`: load a trace, run every analysis per rank and across ranks, rank findings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.crossrank import CrossRank, comm_waits, cross_rank
from trainperf.diagnose.gpu_time import (comm_comp_overlap, idle_split, kernel_breakdown, temporal_breakdown)
from trainperf.diagnose.host import checkpoint_spans, dataloader_spans, host_syncs, optimizer_spans, sync_ops
from trainperf.diagnose.launch import launch_bound_stretches, launch_stats, queue_length
from trainperf.diagnose.replay import Change, build_graph, critical_path, replay
from trainperf.diagnose.steps import memcpy_bandwidth, step_times
from trainperf.diagnose.window import Window, analysis_window
from trainperf.errors import TrainperfError
from trainperf.trace.events import ELEMENTWISE, OPTIMIZER, REDUCTION, EventTable
from trainperf.trace.load import load_trace


@dataclass
class RankSummary:
    """Per-rank figures of the JSON output (times µs, shares %)."""

    rank: int
    source: str
    window_us: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    overlap_pct: float
    idle_host_pct: float
    idle_kernel_pct: float
    idle_other_pct: float
    comm_us: float = 0.0
    exposed_comm_us: float = 0.0
    n_events: int = 0
    steps: list[int] = field(default_factory=list)
    step_time_median_us: float = 0.0
    step_times: list = field(default_factory=list)  # [{step, host_us, device_busy_us}] per ProfilerStep
    kernel_categories_pct: dict = field(default_factory=dict)
    launch_delay_median_us: float = 0.0
    launch_delay_p95_us: float = 0.0
    small_kernel_count_pct: float = 0.0
    queue_length_max: int = 0
    memcpy_gbps: dict = field(default_factory=dict)
    dataloader_pct: float = 0.0
    host_sync_pct: float = 0.0
    optimizer_pct: float = 0.0
    critical_path_pct: dict = field(default_factory=dict)
    gpu_analyses: str = "ok"


@dataclass
class Diagnosis:
    """Everything `trainperf diagnose` reports: per-rank summaries, cross-rank view, ranked findings."""

    path: str
    ranks: list[RankSummary]
    findings: list[F.Finding]
    cross_rank: dict
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """The documented JSON object: {path, ranks: [...], findings: [...], cross_rank, notes}."""
        return {"path": self.path, "ranks": [_round(asdict(r)) for r in self.ranks],
                "findings": [f.to_json() for f in self.findings], "cross_rank": _round(self.cross_rank),
                "notes": self.notes}


def _round(x):
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return round(float(x), 3)
    if isinstance(x, np.integer):
        return int(x)
    return x


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """'A:B' -> (A, B) inclusive; 'A' -> (A, A); None -> None."""
    if not text:
        return None
    try:
        a, _, b = text.partition(":")
        lo = int(a) if a else -(1 << 31)
        hi = int(b) if b else (1 << 31) if _ else lo
        return lo, hi
    except ValueError:
        raise TrainperfError(f"--steps {text!r}: expected A:B with step numbers, e.g. 3:5") from None


def _restrict_steps(t: EventTable, steps: tuple[int, int]) -> EventTable:
    sel = (t.step >= steps[0]) & (t.step <= steps[1])
    if not sel.any():
        present = sorted(set(int(s) for s in np.unique(t.step) if s >= 0))
        raise TrainperfError(f"{t.source}: no events in steps {steps[0]}:{steps[1]}; steps present: {present}")
    return t.take(sel)


def diagnose(path: str | Path, rank: int | None = None, steps: str | None = None, top: int = 10,
             progress: bool = False) -> Diagnosis:
    """Diagnose the trace(s) at path (a Kineto file or a folder of ranks); return a Diagnosis."""
    tables = load_trace(path, ranks=None, progress=progress)
    step_range = parse_steps(steps)
    if step_range:
        tables = {r: _restrict_steps(t, step_range) for r, t in tables.items()}
    windows = {r: analysis_window(t, include_last_step=bool(step_range)) for r, t in tables.items()}
    notes: list[str] = []
    summaries: dict[int, RankSummary] = {}
    found: list[F.Finding] = []
    gpu_ranks = [r for r, t in tables.items() if windows[r].device.size]
    xr = None
    if len(gpu_ranks) >= 2:
        # compute/busy per rank are filled in after the per-rank pass; the matching needs only kernels
        xr = cross_rank({r: tables[r] for r in gpu_ranks}, {r: windows[r] for r in gpu_ranks}, {}, {})
        notes += xr.notes
    straggler_gain: dict[int, float] = {}
    for r, t in tables.items():
        waits = comm_waits(xr, r) if xr is not None and r in gpu_ranks else None
        s, fs, sg = _rank_analyses(t, windows[r], waits)
        summaries[r] = s
        found += fs
        straggler_gain[r] = sg
        if windows[r].note:
            notes.append(f"rank {r}: {windows[r].note}")
    if not gpu_ranks:
        notes.append("no kernel/memcpy/memset events in the trace: GPU analyses (breakdown, idle, overlap, "
                     "launches, critical path) are skipped; host-side analyses only")
    if xr is not None:
        for r in gpu_ranks:
            s = summaries[r]
            xr.compute_by_rank_us[r] = s.compute_pct * s.window_us / 100
            xr.busy_by_rank_us[r] = (100 - s.idle_pct) * s.window_us / 100
        found += _straggler_findings(xr, summaries, straggler_gain, windows)
    merged = F.merge_across_ranks(found)
    if rank is not None:
        if rank not in summaries:
            raise TrainperfError(f"{path}: rank {rank} not found; ranks present: {sorted(summaries)}")
        summaries = {rank: summaries[rank]}
        merged = [f for f in merged if rank in f.ranks]
    xr_json = {}
    if xr is not None:
        st = xr.straggler
        xr_json = {"n_collectives_matched": len(xr.collectives), "wait_by_rank_us": xr.wait_by_rank_us,
                   "caused_by_rank_us": xr.caused_by_rank_us, "straggler_rank": st[0] if st else None,
                   "straggler_caused_wait_us": st[1] if st else 0.0, "compute_imbalance_pct": xr.imbalance_pct,
                   "unmatched": xr.unmatched}
    return Diagnosis(str(path), list(summaries.values()), merged[:top], xr_json, notes)


def _pct(a: float, b: float) -> float:
    return 100.0 * a / b if b > 0 else 0.0


def _rank_analyses(t: EventTable, w: Window, waits: dict | None = None
                   ) -> tuple[RankSummary, list[F.Finding], float]:
    """Every single-rank analysis, the findings it supports, and the gain (%) of not waiting for
    other ranks inside collectives (waits: crossrank.comm_waits of this rank)."""
    steps = sorted(int(s) for s in np.unique(t.step[w.keep]) if s >= 0) if len(t) else []
    st = [s for s in step_times(t, w) if s.step in steps and s.step not in w.steps_excluded]
    host_window = (float(w.end_us[w.keep].max() - w.ts_us[w.keep].min()) if w.keep.any() else 0.0)
    dl = dataloader_spans(t, w)
    opt = optimizer_spans(t, w)
    ck = checkpoint_spans(t, w)
    sops = sync_ops(t, w)
    found: list[F.Finding] = []
    if not w.device.size:
        s = RankSummary(t.rank, t.source, host_window, 0, 0, 0, 0, 0, 0, 0, n_events=len(t), steps=steps,
                        gpu_analyses="skipped: no kernel, memcpy or memset events in this rank's trace",
                        dataloader_pct=_pct(dl.time_us, host_window), optimizer_pct=_pct(opt.time_us, host_window),
                        step_time_median_us=float(np.median([x.host_us for x in st])) if st else 0.0,
                        step_times=[{"step": x.step, "host_us": x.host_us, "device_busy_us": x.device_busy_us}
                                    for x in st])
        found.append(F.make("gpu_analyses_skipped", [t.rank], steps, {"device_events": (0, "count")},
                            severity="low"))
        if dl.time_us > 0.05 * host_window > 0:
            found.append(F.make("data_loader_stall", [t.rank], steps,
                                {"dataloader_time": (dl.time_us, "us"),
                                 "dataloader_share": (_pct(dl.time_us, host_window), "%")},
                                dl.longest, gain_pct=_pct(dl.time_us, host_window), gain_us=dl.time_us,
                                what_if="remove_data_wait (host only: upper bound)"))
        return s, _relative_times(found, w), 0.0

    tb = temporal_breakdown(t, w)
    ov = comm_comp_overlap(t, w)
    idle = idle_split(t, w)
    hp, kp, op = idle.pct()
    cats = kernel_breakdown(t, w)
    ls = launch_stats(t, w)
    ql = queue_length(t, w)
    lbs = launch_bound_stretches(t, w)
    syncs = host_syncs(t, w)
    g = build_graph(t, w, waits)
    base = replay(g)
    span = base.makespan_us
    cp = critical_path(g, base)

    def gain(change: Change) -> tuple[float, float]:
        d = span - replay(g, change).makespan_us
        return _pct(d, span), d

    s = RankSummary(
        t.rank, t.source, tb.window_us, tb.idle_pct, tb.compute_pct, tb.non_compute_pct, ov.overlap_pct, hp, kp, op,
        comm_us=ov.comm_us, exposed_comm_us=ov.exposed_us, n_events=len(t), steps=steps,
        step_time_median_us=float(np.median([x.host_us for x in st])) if st else 0.0,
        step_times=[{"step": x.step, "host_us": x.host_us, "device_busy_us": x.device_busy_us} for x in st],
        kernel_categories_pct={c.category: c.pct_of_busy for c in cats},
        launch_delay_median_us=ls.delay_median_us, launch_delay_p95_us=ls.delay_p95_us,
        small_kernel_count_pct=ls.small_kernel_count_pct,
        queue_length_max=max((v[1] for v in ql.by_stream.values()), default=0),
        memcpy_gbps={b.direction: b.gbps for b in memcpy_bandwidth(t, w)},
        dataloader_pct=_pct(dl.time_us, span), host_sync_pct=_pct(syncs.time_us, span),
        optimizer_pct=_pct(opt.time_us, span),
        critical_path_pct={k: _pct(v, span) for k, v in sorted(cp.items(), key=lambda kv: -kv[1])})
    r = [t.rank]
    if dl.time_us > 0.01 * span:
        gp, gu = gain(Change("remove_data_wait"))
        found.append(F.make("data_loader_stall", r, steps, {"dataloader_time": (dl.time_us, "us"),
                                                            "dataloader_share": (_pct(dl.time_us, span), "%")},
                            dl.longest, gp, gu, "remove the data-loader wait"))
    if ck.time_us > 0.01 * span:
        gp, gu = gain(Change("remove_checkpoint_wait"))
        found.append(F.make("checkpoint_stall", r, steps, {"checkpoint_time": (ck.time_us, "us")}, ck.longest,
                            gp, gu, "remove the checkpoint wait"))
    sync_wait = cp.get("sync_wait", 0.0)
    if syncs.count and (syncs.time_us > 0.01 * span or sync_wait > 0.01 * span):
        gp, gu = gain(Change("remove_syncs"))
        found.append(F.make("host_sync", r, steps, {"sync_calls": (syncs.count, "count"),
                                                    "sync_time": (syncs.time_us, "us"),
                                                    "sync_wait_on_critical_path": (sync_wait, "us"),
                                                    "sync_ops": (sops.count, "count")},
                            syncs.longest + sops.longest[:2], gp, gu, "remove host syncs"))
    if ov.comm_us > 0 and ov.exposed_us > 0.03 * tb.window_us:
        gp, gu = gain(Change("overlap_comm"))
        found.append(F.make("exposed_comm", r, steps, {"comm_time": (ov.comm_us, "us"),
                                                       "exposed_comm": (ov.exposed_us, "us"),
                                                       "overlap": (ov.overlap_pct, "%")},
                            [], gp, gu, "overlap exposed collectives with compute"))
    host_bound = cp.get("cpu", 0.0) + cp.get("runtime", 0.0)
    if idle.host_wait_us > 0.5 * max(idle.total_us, 1e-9) and tb.idle_pct > 15 and host_bound > 0.3 * span:
        gp, gu = gain(Change("host_speedup", factor=2.0))
        found.append(F.make("launch_bound", r, steps, {
            "gpu_idle": (tb.idle_pct, "%"), "idle_waiting_on_host": (hp, "%"),
            "host_on_critical_path": (_pct(host_bound, span), "%"),
            "launch_bound_stretches": (len(lbs), "count"),
            "launch_delay_median": (ls.delay_median_us, "us")},
            [("launch-bound stretch (stream %d, %d kernels)" % (x.stream, x.n_kernels), x.start_us,
              x.end_us - x.start_us) for x in lbs[:3]], gp, gu, "host work between launches 2x faster"))
    if ls.small_kernel_count_pct > 50 and (kp > 5 or host_bound > 0.3 * span):
        gp, gu = gain(Change("host_speedup", factor=2.0))
        gp *= ls.small_kernel_count_pct / 100
        found.append(F.make("small_kernels", r, steps, {"small_kernels": (ls.small_kernel_count_pct, "% of kernels"),
                                                        "their_time": (ls.small_kernel_time_pct, "% of kernel time"),
                                                        "threshold": (10.0, "us")},
                            [], gp, gu * ls.small_kernel_count_pct / 100,
                            "launch overhead of small kernels halved (share of the host-2x gain)"))
    share = {c.category: c.pct_of_busy for c in cats}
    mem_share = share.get("elementwise", 0.0) + share.get("reduction_norm", 0.0)
    if mem_share > 25:
        g1, u1 = gain(Change("speedup", ELEMENTWISE, 2.0))
        g2, u2 = gain(Change("speedup", REDUCTION, 2.0))
        top = [(f"[{k} launches] {n}", t0, d) for c in cats if c.category in ("elementwise", "reduction_norm")
               for n, d, k, t0 in c.top_kernels]
        found.append(F.make("memory_bound_unfused", r, steps, {"elementwise_and_reduction": (mem_share, "% of busy")},
                            top[:4], g1 + g2, u1 + u2, "elementwise and reduction kernels 2x faster (fused)"))
    if share.get("optimizer", 0.0) > 10:
        gp, gu = gain(Change("speedup", OPTIMIZER, 3.0))
        top = [(f"[{k} launches] {n}", t0, d) for c in cats if c.category == "optimizer" for n, d, k, t0 in c.top_kernels]
        found.append(F.make("optimizer_slow", r, steps, {"optimizer_kernels": (share["optimizer"], "% of busy"),
                                                         "optimizer_host_spans": (_pct(opt.time_us, span), "%")},
                            top, gp, gu, "optimizer kernels 3x faster (fused/foreach)"))
    if tb.idle_pct > 30 and not any(f.kind in ("launch_bound", "data_loader_stall", "host_sync") for f in found):
        found.append(F.make("idle_gpu", r, steps, {"gpu_idle": (tb.idle_pct, "%"), "host_wait": (hp, "% of idle"),
                                                   "kernel_wait": (kp, "% of idle"), "other": (op, "% of idle")},
                            severity="medium"))
    straggler_gain = gain(Change("remove_straggler_wait"))[0] if waits else 0.0
    return s, _relative_times(found, w), straggler_gain


def _relative_times(found: list[F.Finding], w: Window) -> list[F.Finding]:
    """Evidence event starts as µs from the rank's first event (as Perfetto shows the trace)."""
    origin = float(w.ts_us.min()) if w.ts_us.size else 0.0
    for f in found:
        for e in f.evidence.get("events", []):
            e["start_us"] = round(e["start_us"] - origin, 1)
    return found


def _straggler_findings(xr: CrossRank, summaries, straggler_gain: dict[int, float], windows) -> list[F.Finding]:
    """A straggler finding when one rank makes the others wait >= 2 % of the window each."""
    st = xr.straggler
    if st is None:
        return []
    srank, caused = st
    window = max(s.window_us for s in summaries.values())
    others = max(len(xr.wait_by_rank_us) - 1, 1)
    if caused < 0.02 * window * others:
        return []
    worst = sorted((c for c in xr.collectives if c.last_rank == srank), key=lambda c: -sum(c.wait_us.values()))[:3]
    w = windows[srank]
    origin = float(w.ts_us.min())
    events = [(f"{c.kind} #{c.seq} (rank {srank} arrived last)", float(w.ts_us[c.rows[srank]]) - origin,
               sum(c.wait_us.values())) for c in worst]
    return [F.make("straggler", [srank], [], {"caused_wait": (caused, "us"),
                                              "caused_wait_per_other_rank": (caused / others, "us"),
                                              "compute_imbalance": (xr.imbalance_pct, "%")},
                   events, max(straggler_gain.values(), default=0.0), 0.0,
                   f"no rank waits for rank {srank} inside collectives")]
