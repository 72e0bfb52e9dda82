"""The device work of a forward region of operators and of the backward nodes it made.

A region is one computation written out of several operators on one thread (an attention's products and softmax,
a loss's log-softmax and NLL): a thread key and a host span. Its backward is the autograd nodes whose sequence
number is one of its forward operators' (per process, as autograd_links links them); its device work is what the
region and those nodes launched. The rules that price a region as one fused kernel (attention.py, loss.py) read it
here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.autograd_links import backward_node_mask, node_function
from trainperf.diagnose.launch import launched_inside
from trainperf.diagnose.window import Window
from trainperf.trace.events import CPU_OP, EventTable
from trainperf.trace.nesting import enclosing_span, thread_key


# an autograd node's function, as PyTorch records it inside "autograd::engine::evaluate_function: XBackward0"
BACKWARD_FUNCTION_RE = re.compile(r"^\w+Backward\d+$")


@dataclass(frozen=True, kw_only=True)
class RegionWork:
    """The device kernels of a rank's regions, forward and backward."""

    host_us: float            # host time of the regions and of their backward nodes (µs)
    backward: bool            # some region's backward nodes are in the trace
    kernels: np.ndarray       # the window's device rows launched inside them


def region_spans(regions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thread key, start ns, end ns) arrays of regions: objects with key, start_ns and end_ns."""
    return tuple(np.array([getattr(r, a) for r in regions], dtype=np.int64) for a in ("key", "start_ns", "end_ns"))


def region_work(t: EventTable, w: Window, key: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> RegionWork:
    """The regions (thread key, start and end ns each) and the backward nodes their forward operators made (by
    sequence number, per process; the window's nodes), and the window's device rows launched inside them."""
    rkey, rstart, rend = (np.asarray(a, dtype=np.int64) for a in (key, start_ns, end_ns))
    ops = np.flatnonzero((t.kind == CPU_OP) & (t.seq >= 0))
    inside = ops[enclosing_span(rkey, rstart, rend, thread_key(t.pid[ops], t.tid[ops]), t.ts_ns[ops]) >= 0]
    seqs = set(zip(t.pid[inside].tolist(), t.seq[inside].tolist()))
    nodes = ops[w.keep[ops] & backward_node_mask(t, ops)]
    # a node whose evaluate_function records no sequence number (the first node of an FSDP2 backward, run inside its
    # pre-backward hook) is linked through its function, the XBackward0 op inside it, which records one
    numbered = set(zip(t.pid[nodes].tolist(), t.seq[nodes].tolist()))
    funcs = ops[w.keep[ops] & np.isin(t.name[ops], t.ids_matching(BACKWARD_FUNCTION_RE.match))]
    funcs = funcs[[(p, q) not in numbered for p, q in zip(t.pid[funcs].tolist(), t.seq[funcs].tolist())]] \
        if funcs.size else funcs
    nodes = np.concatenate([nodes, funcs])
    linked = nodes[[(p, s) in seqs for p, s in zip(t.pid[nodes].tolist(), t.seq[nodes].tolist())]] \
        if nodes.size else nodes
    key = np.concatenate([rkey, thread_key(t.pid[linked], t.tid[linked])]).astype(np.int64)
    start = np.concatenate([rstart, t.ts_ns[linked]]).astype(np.int64)
    end = np.concatenate([rend, t.ts_ns[linked] + t.dur_ns[linked]]).astype(np.int64)
    return RegionWork(host_us=float((end - start).sum()) / 1e3, backward=bool(linked.size),
                      kernels=launched_inside(t, w, key, start, end))


def own_function_spans(t: EventTable, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start ns, end ns) of each backward node's own function: the operator PyTorch records inside
    "autograd::engine::evaluate_function: XBackward0" as "XBackward0", where the trace has it, else the node's
    span. The node's span also holds the hooks the engine runs around the function (FSDP's pre-backward unshard on
    the first node of a backward: 6 ms around a 34-us NllLossBackward0 in a real FSDP2 profile), which are not the
    region's work."""
    nodes = np.asarray(nodes, dtype=np.int64)
    start, end = t.ts_ns[nodes].copy(), t.ts_ns[nodes] + t.dur_ns[nodes]
    of_node = {int(i): t.name_id(node_function(t.names[int(i)])) for i in np.unique(t.name[nodes])}
    function = np.array([of_node[int(i)] for i in t.name[nodes]], dtype=np.int64)
    inner = np.flatnonzero((t.kind == CPU_OP) & np.isin(t.name, function))
    for k, n in enumerate(nodes.tolist()):
        hit = inner[(t.name[inner] == function[k]) & (t.tid[inner] == t.tid[n]) & (t.pid[inner] == t.pid[n])
                    & (t.ts_ns[inner] >= start[k]) & (t.ts_ns[inner] <= end[k])]
        if hit.size:
            start[k], end[k] = t.ts_ns[hit[0]], t.ts_ns[hit[0]] + t.dur_ns[hit[0]]
    return start, end


def with_backward_spans(t: EventTable, w: Window, work: RegionWork, key: np.ndarray, start_ns: np.ndarray,
                        end_ns: np.ndarray) -> RegionWork:
    """work with the device rows launched inside the given backward spans (thread key, start and end ns each) added:
    a region's backward found by name where the trace records no sequence numbers (attention.py, loss.py)."""
    if not np.size(key):
        return work
    kernels = launched_inside(t, w, np.asarray(key, dtype=np.int64), np.asarray(start_ns, dtype=np.int64),
                              np.asarray(end_ns, dtype=np.int64))
    host_us = float((np.asarray(end_ns) - np.asarray(start_ns)).sum()) / 1e3
    return RegionWork(host_us=work.host_us + host_us, backward=True, kernels=np.union1d(work.kernels, kernels))
