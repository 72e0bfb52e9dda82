"""Several GPUs driven by one process, and the `devices_take_turns` finding.

Kineto writes each GPU's events under its device index as pid, so one process that drives several GPUs (a model
split across them by Accelerate's device_map="auto" or by hand, nn.DataParallel's replicas, a single-process
pipeline) leaves several devices in one rank's trace. Every breakdown figure is then over their union, where a GPU
idle while another works counts as busy (evidence.devices_caveat says so). When the devices' busy time barely
overlaps, they take turns: the model runs layer after layer on one GPU, then the next, and each GPU idles while
the others work: the step is the sum of the devices' work where it could be the largest one's. That is the finding.
nn.DataParallel's replicas run side by side and do not take turns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.replay import Change
from trainperf.diagnose.window import union_us
from trainperf.trace.events import GPU_SYNC, HOST_KINDS
from trainperf.trace.nesting import thread_key

# devices of one process that run one after another: the busy time of each summed is at most this much over their
# union (1.0: never at the same time; N: always together). 1.2: a fifth of the time side by side, a stated bound
DEVICES_TAKE_TURNS_RATIO = 1.2
# the device time that running the devices side by side could take off (their union less the busiest one's),
# % of the span: stated as exposed_comm's bar (3 %); no labeled trace of the kind
TAKE_TURNS_MIN_PCT = 3.0


@dataclass(kw_only=True, frozen=True)
class DeviceBusy:
    """The GPUs of one rank's window: each one's busy time and their union (µs)."""

    rows: np.ndarray       # the window's device rows (kernels, copies, memsets)
    busy_us: dict          # device index (the trace's pid of its events) -> time busy (union of its events)
    union_us: float        # time at least one of them is busy
    window_us: float       # first device event's start to last one's end

    @property
    def take_turns(self) -> bool:
        """Whether the devices' busy time barely overlaps (DEVICES_TAKE_TURNS_RATIO): they run one after another."""
        return len(self.busy_us) > 1 and 0 < sum(self.busy_us.values()) <= DEVICES_TAKE_TURNS_RATIO * self.union_us

    @property
    def side_by_side_saving_us(self) -> float:
        """Device time run side by side would take off: the union less the busiest device's time (µs)."""
        return max(self.union_us - max(self.busy_us.values()), 0.0)


def device_busy(f: RankFacts) -> DeviceBusy | None:
    """The busy time of each GPU of the rank's window (kernels, copies, memsets; not sync markers), None with fewer
    than two GPUs. Computed once per rank (the devices caveat and the finding both read it)."""
    return f.once("device_busy", lambda: _device_busy(f))


def _device_busy(f: RankFacts) -> DeviceBusy | None:
    t, w = f.table, f.window
    rows = w.device[t.kind[w.device] != GPU_SYNC]
    # device work recorded on a host thread runs on the host's own CPU device, not a GPU (XLA's CPU thunks,
    # trace/xplane.py: kernels whose stream is their host thread)
    host = np.isin(t.kind, HOST_KINDS)
    rows = rows[~np.isin(thread_key(t.pid[rows], t.tid[rows]), thread_key(t.pid[host], t.tid[host]))]
    devices = np.unique(t.pid[rows])
    if devices.size < 2:
        return None
    return DeviceBusy(rows=rows, busy_us={int(d): union_us(w, rows[t.pid[rows] == d]) for d in devices},
                      union_us=union_us(w, rows),
                      window_us=float(w.end_us[rows].max() - w.ts_us[rows].min()))


def pytorch_process_side_by_side(f: RankFacts) -> bool:
    """Whether one PyTorch process (its ATen operators: a JAX host drives its devices side by side by design) drives
    several GPUs side by side, as nn.DataParallel's replicas run: one host, its threads sharing one interpreter
    lock, for all of them."""
    d = device_busy(f)
    return d is not None and not d.take_turns and f.once(
        "aten_ops", lambda: f.table.ids_matching(lambda n: n.startswith("aten::")).size > 0)


def devices_take_turns(f: RankFacts) -> F.Finding | None:
    """The GPUs one process drives take turns (DeviceBusy.take_turns), and running them side by side would take
    TAKE_TURNS_MIN_PCT of the span or more off their work.

    Priced by replay as every device event of the window sped up by union / busiest device's time: the devices'
    work, a chain through them, then ends as soon as the busiest one's alone would. That is a pipeline fed with
    enough micro-batches to hide its fill and drain, or an even tensor-parallel split with free communication: an
    upper bound. The host stays as it is, so a host-bound loop gains nothing."""
    d = device_busy(f) if f.has_gpu else None
    if d is None or not d.take_turns:
        return None
    saving = d.side_by_side_saving_us
    if f.pct(saving) < TAKE_TURNS_MIN_PCT:
        return None
    t, w, rows = f.table, f.window, d.rows
    busiest = max(d.busy_us.values())
    factor = d.union_us / busiest
    metrics = {"gpus": (len(d.busy_us), "count"), "devices_union_busy": (d.union_us, "us"),
               "busiest_gpu_busy": (busiest, "us"), "sum_of_gpus_busy": (sum(d.busy_us.values()), "us")}
    events = [(f"GPU {k}: busy {v / 1e3:.2f} ms", float(w.ts_us[rows[t.pid[rows] == k]].min()), v)
              for k, v in sorted(d.busy_us.items(), key=lambda kv: -kv[1])[:3]]
    return F.rank_finding(f, "devices_take_turns", metrics, events,
                          (Change("speedup_rows", factor=factor, rows=tuple(int(r) for r in rows)),),
                          f"the {len(d.busy_us)} GPUs busy side by side: their work ends when the busiest one's "
                          f"would alone ({factor:.3g}x sooner)", evidence_pct=f.pct(saving), upper_bound=True)
