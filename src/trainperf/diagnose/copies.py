"""Copies between host and device that the step waits for on the device, and the `exposed_memcpy` finding.

TraceLens splits the GPU timeline into computation, exposed communication, exposed memcpy and idle; a trace whose
exposed memcpy is large is one whose device spends the step moving data over PCIe (CPU offload of optimizer
states or parameters, activations swapped to the host, inputs copied in the step that needs them). Here: copies
over a host link (host to device, device to host, host to host, peer to peer; not device-to-device copies, which
run at HBM speed) that are not under computation kernels on another stream, and whose host call did not block on
them (a blocking copy is host_sync's or pageable_copy's: the host waits there, and their fixes differ).

Priced by replay with those copies off the device timeline: what prefetching them on a side stream (or keeping the
data on the device) gives when they overlap computation completely. An upper bound: the link's bandwidth and the
computation available to hide them are not in the trace.
"""

from __future__ import annotations

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.gpu_time import compute_mask
from trainperf.diagnose.replay import BLOCK_QUEUE, NOT_BLOCKING, Change
from trainperf.diagnose.window import covered_length, row_events
from trainperf.trace.categories import OFF_DEVICE_DIRECTIONS, copy_direction
from trainperf.trace.events import MEMCPY

# exposed host-link copy time, % of the span. 5 %, like fp32_matmul's: the what-if is an upper bound (a bound of
# 3-10 % rates low), and prefetching is a code change a user makes for a few percent, not for one
EXPOSED_MEMCPY_MIN_PCT = 5.0


def exposed_memcpy(f: RankFacts) -> F.Finding | None:
    """Host-link copies that no computation hides and no host call blocked on take a material share of the span
    (module docstring); priced with them off the device timeline (an upper bound)."""
    if not f.has_gpu:
        return None
    t, w, g = f.table, f.window, f.graph
    dev = np.flatnonzero(~g.is_host & ~g.before_window)
    rows = g.rows[dev]
    link = np.isin(t.name[rows], t.ids_matching(lambda s: copy_direction(s) in OFF_DEVICE_DIRECTIONS))
    blocked_on = np.zeros(g.rows.size, dtype=bool)
    blocking = (g.block_class != NOT_BLOCKING) & (g.block_class != BLOCK_QUEUE)  # a queue slot is no host read
    blocked_on[g.sync_on[blocking & (g.sync_on >= 0)]] = True
    copies = dev[(t.kind[rows] == MEMCPY) & link & ~blocked_on[dev]]
    if not copies.size:
        return None
    compute = dev[compute_mask(t, rows)]
    cs, ce = g.start[compute], g.start[compute] + g.dur[compute]
    ks, ke = g.start[copies], g.start[copies] + g.dur[copies]
    exposed = covered_length(np.r_[cs, ks], np.r_[ce, ke]) - covered_length(cs, ce)
    if f.pct(exposed) <= EXPOSED_MEMCPY_MIN_PCT:
        return None
    names = t.name[g.rows[copies]]
    top = sorted(row_events(t, w, g.rows[copies]), key=lambda e: -e[2])[:3]
    metrics = {"copies": (copies.size, "count"), "copy_time": (float(g.dur[copies].sum()), "us"),
               "exposed_copy_time": (exposed, "us"), "exposed_copy_share": (f.pct(exposed), "%"),
               "copy_kinds": (np.unique(names).size, "count")}
    x = F.make("exposed_memcpy", [f.rank], f.steps, metrics, top,
               changes=(Change("drop_rows", rows=tuple(int(r) for r in g.rows[copies])),),
               what_if="host-device copies hidden under computation (prefetched on a side stream; upper bound)",
               evidence_pct=f.pct(exposed), upper_bound=True)
    x.confidence = "medium"
    return x
