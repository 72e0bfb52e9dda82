"""The `layout_transposes` finding: the convolution library converting tensors between NCHW and NHWC around each
convolution.

Tensor-core convolutions take NHWC (channels last). Given NCHW tensors, cuDNN transposes the input (and the filter)
to NHWC before the kernel and the output back after it (`cudnn::ops::nchwToNhwcKernel`, `nhwcToNchwKernel`);
MIOpen does the same with its batched transposes (`batched_transpose_*`, `transpose_NCHW2CNHW` for its 1x1
kernels). Each is a full read and write of the tensor in HBM, once per convolution, forward and backward: NVIDIA's
Deep Learning Performance guide ("Tensor Layouts in Memory: NCHW vs NHWC") names them and channels_last as their
fix, worth 8-35 % of a mixed-precision ResNet-50 step in PyTorch's channels-last tutorial. In HTA's A100 trace
of a CNN (nccl_parser_config) they hold 9.3 % of the kernel time (15 of 162 ms).

Priced by replay with those kernels not run and not launched (`remove_kernels`): with the model and its inputs in
channels_last the library calls the NHWC kernels directly. What that costs elsewhere (an op without an NHWC kernel
converting back) the trace does not show; the finding's events name the transposes so that one can check.
"""

from __future__ import annotations

import re

import numpy as np

from trainperf.diagnose import findings as F
from trainperf.diagnose.facts import RankFacts
from trainperf.diagnose.replay import Change
from trainperf.trace.events import KERNEL

# cuDNN's layout conversions (both directions, any data type) and MIOpen's (its batched transposes, used by its
# NHWC/NCHW convolution solvers, and the CNHW conversions of its 1x1 kernels)
LAYOUT_TRANSPOSE_RE = re.compile(r"nchwToNhwc|nhwcToNchw|batched_transpose_|transpose_(NCHW2CNHW|CNHW2NCHW)"
                                 r"|NCHW2NHWC|NHWC2NCHW", re.I)
# the transposes' device time, % of the window: 3 %, the medium level of findings. Their time is measured and the fix
# is a configuration (a memory format), not an estimate
LAYOUT_TRANSPOSE_MIN_PCT = 3.0


def layout_transposes(f: RankFacts) -> F.Finding | None:
    """NCHW <-> NHWC conversion kernels around the convolutions take >= LAYOUT_TRANSPOSE_MIN_PCT of the window
    (module docstring); priced by replay with them neither launched nor run."""
    if not f.has_gpu:
        return None
    t, w = f.table, f.window
    dev = w.device[t.kind[w.device] == KERNEL]
    rows = dev[np.isin(t.name[dev], t.ids_matching(LAYOUT_TRANSPOSE_RE.search))]
    dur = w.end_us[rows] - w.ts_us[rows]
    time_us = float(dur.sum())
    if not rows.size or f.pct(time_us) < LAYOUT_TRANSPOSE_MIN_PCT:
        return None
    kernels_us = float((w.end_us[dev] - w.ts_us[dev]).sum())
    ids, inverse = np.unique(t.name[rows], return_inverse=True)
    per_name = np.bincount(inverse, weights=dur)
    # each conversion kernel's first call, named with how many calls it stands for and their time
    top = [(f"{t.names[ids[k]]} ({int((inverse == k).sum())} calls, {per_name[k] / 1e3:.1f} ms)",
            float(w.ts_us[rows[inverse == k][0]]), float(dur[inverse == k][0]))
           for k in np.argsort(-per_name, kind="stable")[:3]]
    metrics = {"layout_transposes": (rows.size, "count"), "their_time": (time_us, "us"),
               "their_share": (f.pct(time_us), "%"),
               "share_of_kernel_time": (100.0 * time_us / kernels_us if kernels_us > 0 else 0.0, "%")}
    return F.make("layout_transposes", [f.rank], f.steps, metrics, top,
                  changes=(Change("remove_kernels", rows=tuple(int(r) for r in rows)),),
                  what_if="the layout transposes neither launched nor run (model and inputs in channels_last)",
                  evidence_pct=f.pct(time_us))
