"""What fusing a rank's memory-bound kernels would remove: runs of elementwise and reduction kernels back to back on
one stream, each of which a fusing compiler (torch.compile's Inductor) or a hand-fused kernel (Liger's RMSNorm,
SwiGLU, cross-entropy; Apex's fused LayerNorm) would run as one.

Each kernel of such a run reads its inputs from HBM and writes its output back; fused, the intermediates stay in
registers and the run reads its inputs and writes its outputs once. Without the tensors' identities (the trace has
none) the fused run's time is taken as that of the kernels it cannot do without: its reductions, each of which keeps
its own pass over the data with the elementwise work before and after it folded in (Inductor fuses pointwise
prologues and epilogues into a reduction), or, with no reduction, its longest kernel (a chain of pointwise ops reads
and writes about what its widest op does). The others are removed, launch and all. This is an estimate, an upper
bound on what fusion gains: a run's kernels on unrelated tensors (independent ops that happen to follow each other)
do not fuse vertically, and a fused backward may keep several outputs.

A run of the same ops applied tensor after tensor (the update of each parameter, the same layer's ops again) is cut
into one chain per tensor where its first kernel's name comes again (_chains): ops on independent tensors fuse only
horizontally (foreach kernels), which saves launches, not traffic. A run is broken by any other device work on the
stream (a GEMM, a collective, a copy: fusing across those needs epilogue fusion into the GEMM, which is not assumed)
and by the end of a step. Kernels a compiler already fused, a convolution's layout conversions (layout_transposes')
and an optimizer's multi-tensor kernels (optimizer_slow's) are no part of a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.layout import LAYOUT_TRANSPOSE_RE
from trainperf.trace.categories import base_name
from trainperf.trace.events import ELEMENTWISE, KERNEL, REDUCTION

CHAINS_SHOWN = 3  # the chains a finding names as its evidence
# Inductor's (torch.compile) own output: pointwise, reduction and persistent-reduction kernels it already fused
# (triton_poi_fused_*, triton_red_fused_*, triton_per_fused_*). Recommending to fuse them recommends what was done.
COMPILER_FUSED_PREFIXES = ("triton_poi_fused", "triton_red_fused", "triton_per_fused")


def not_fusable(name: str) -> bool:
    """Whether an elementwise kernel is no fusion's to remove: a compiler already fused it (COMPILER_FUSED_PREFIXES),
    or it converts a convolution's layout (layout.LAYOUT_TRANSPOSE_RE: layout_transposes', whose fix is a memory
    format)."""
    return name.startswith(COMPILER_FUSED_PREFIXES) or LAYOUT_TRANSPOSE_RE.search(name) is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class FusionChains:
    """The rank's chains of fusable kernels and what fusing each removes."""

    chains: int             # chains of 2 or more fusable kernels
    kernels: int            # the kernels in those chains
    removed: np.ndarray     # trace rows of the kernels fusion would remove (int64)
    removed_us: float       # their device time (µs)
    largest: list           # the CHAINS_SHOWN kinds of chain with the most time removed: (label, the first one's
    #                         start and length, µs)


def fusion_chains(f: RankFacts) -> FusionChains:
    """The window's chains of 2 or more fusable kernels (elementwise or reduction, not_fusable(name) false) back to
    back on one stream (module docstring), and the kernels fusing each chain would remove: all but its reductions, or
    all but its longest kernel when it has none. Once per rank (RankFacts.once), not on every re-run of the rules."""
    return f.once("fusion_chains", lambda: _fusion_chains(f))


def _fusion_chains(f: RankFacts) -> FusionChains:
    t, w = f.table, f.window
    dev = w.device
    if not dev.size:
        return FusionChains(chains=0, kernels=0, removed=np.zeros(0, np.int64), removed_us=0.0, largest=[])
    fusable = (t.kind[dev] == KERNEL) & np.isin(t.category[dev], (ELEMENTWISE, REDUCTION)) & \
        ~np.isin(t.name[dev], t.ids_matching(not_fusable))
    dur = w.end_us[dev] - w.ts_us[dev]
    # each lane (process, stream) in device order; a run is a stretch of fusable kernels no other work interrupts
    order = np.lexsort((w.ts_us[dev], t.stream[dev], t.pid[dev]))
    lane = np.stack([t.pid[dev][order], t.stream[dev][order]], axis=1)
    new_lane = np.r_[True, (lane[1:] != lane[:-1]).any(axis=1)]
    step = t.step[dev][order]
    new_step = np.r_[True, step[1:] != step[:-1]]  # no fusion reaches across a step's end
    fus = fusable[order]
    starts = fus & (new_lane | new_step | ~np.r_[False, fus[:-1]])
    run_id = np.cumsum(starts) - 1
    removed, n_chains, n_kernels, each = [], 0, 0, []
    idx = np.flatnonzero(fus)
    for members in np.split(idx, np.flatnonzero(np.diff(run_id[idx])) + 1) if idx.size else ():
        for chain in _chains(t.name[dev[order[members]]]):
            if chain.size < 2:
                continue
            rows, d = dev[order[members[chain]]], dur[order[members[chain]]]
            reductions = t.category[rows] == REDUCTION
            keep = reductions if reductions.any() else np.arange(rows.size) == int(np.argmax(d))
            removed.append(rows[~keep])
            each.append((float(d[~keep].sum()), rows))
            n_chains += 1
            n_kernels += rows.size
    gone = np.concatenate(removed) if removed else np.zeros(0, np.int64)
    op = f.launching_op()
    # the same chain (each step's, each layer's) named once: [times, µs removed, its first one's start and length]
    by_label: dict[str, list] = {}
    for us, rows in each:
        first = [0, 0.0, float(w.ts_us[rows[0]]), float(w.end_us[rows[-1]] - w.ts_us[rows[0]])]
        x = by_label.setdefault(_label(t, op, rows), first)
        x[0], x[1] = x[0] + 1, x[1] + us
    largest = [(f"{us / 1e3:.2f} ms folded in {n} chains: {label}", start, length)
               for label, (n, us, start, length) in sorted(by_label.items(), key=lambda x: -x[1][1])[:CHAINS_SHOWN]]
    return FusionChains(chains=n_chains, kernels=n_kernels, removed=gone.astype(np.int64),
                        removed_us=float((w.end_us[gone] - w.ts_us[gone]).sum()), largest=largest)


def _label(t, op: np.ndarray, rows: np.ndarray) -> str:
    """A chain named by the operators that launched its kernels ("add > native_batch_norm > relu_"), or by the
    kernels' own names where no operator encloses the launch."""
    return " > ".join(t.names[int(t.name[o])].removeprefix("aten::") if o >= 0 else base_name(t.names[int(t.name[r])])
                      for r, o in zip(rows, op[rows]))


def _chains(names: np.ndarray) -> list[np.ndarray]:
    """A run's kernels (their name ids, in order) cut into chains where the run's first kernel's name comes again: the
    same sequence of ops applied tensor after tensor (a per-parameter update, a clipping loop) is work on independent
    tensors, fused across them only horizontally (foreach, multi-tensor kernels: fewer launches, the same bytes); each
    repetition is one chain of dependent ops. Returns index arrays into `names`."""
    return np.split(np.arange(names.size), np.flatnonzero(names == names[0])[1:]) if names.size else []
