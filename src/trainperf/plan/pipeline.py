"""Pipeline parallelism: bubble of 1F1B / interleaved 1F1B and point-to-point exposure.

Narayanan et al. SC21: with ``p`` stages, ``m`` micro batches per step and ``v`` model
chunks per stage (interleaving), the pipeline is idle for a fraction ``(p-1)/(m v)`` of the
ideal time, i.e. a step takes ``(m + (p-1)/v) * t_mb`` where ``t_mb`` is one micro batch's
forward+backward on one stage.
"""

from __future__ import annotations

import numpy as np


def bubble_fraction(pp, grad_accum, vpp):
    """Return the pipeline bubble as a fraction of the ideal compute time, (p-1)/(m v)."""
    pp = np.asarray(pp, dtype=float)
    return (pp - 1.0) / (np.asarray(grad_accum, dtype=float) * np.asarray(vpp, dtype=float))


def bubble_s(pp, vpp, t_micro_stage):
    """Return seconds of pipeline fill + drain: (p-1)/v micro-batch times of one stage."""
    return (np.asarray(pp, dtype=float) - 1.0) / np.asarray(vpp, dtype=float) * t_micro_stage


def p2p_exposed_s(pp, grad_accum, vpp, t_send, overlapped):
    """Return seconds of exposed pipeline sends per step.

    Each micro batch crosses each of a stage's ``v`` chunk boundaries forward and backward
    (``2 m v`` sends per rank). Overlapped schedules (Megatron ``overlap_p2p_comm``) hide
    them behind compute except in the fill and drain, ``2 (p-1)`` sends on the critical path.
    """
    pp = np.asarray(pp, dtype=float)
    steady = 2.0 * np.asarray(grad_accum, dtype=float) * np.asarray(vpp, dtype=float) * t_send
    edge = 2.0 * (pp - 1.0) * t_send
    return np.where(pp > 1, np.where(overlapped, edge, steady + edge), 0.0)
