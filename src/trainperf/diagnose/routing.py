"""What a rank's all-to-all collectives receive: the tokens routed to its experts, step by step.

Expert parallelism moves each token to the ranks holding the experts its router picked, by all-to-all collectives
(the dispatch, the combine, and their backward). A rank receives in the dispatch (and in the combine's backward) the
tokens routed to its experts: PyTorch >= 2.1 writes each collective's receive buffer ("Out msg nelems", "dtype") on
its record_param_comms and kernel, so a rank's trace says how much it received in each step without recorded shapes.
A rank that receives more than the others in the steps it is late computes more because its experts draw more tokens
(routing imbalance), not because its GPU is slower. The combine's receive (each rank's own tokens back) is the same on
every rank, so the ratio understates the dispatch's.

Hand-written: no profiler tool reads the tokens routed per rank from a trace (HTA and TraceLens report collectives'
sizes and bandwidth, not who receives more); this is the straggler and load-imbalance findings' own evidence.
"""

from __future__ import annotations

import numpy as np

from trainperf.diagnose.collectives import comm_args
from trainperf.diagnose.crossrank import WHOLE_WINDOW_STEP, group_kind
from trainperf.diagnose.window import Window
from trainperf.trace.events import EventTable

# a late rank received at least this many times the other ranks' all-to-all data, on average over the steps it was
# late, for its lateness to be named routing's: a tenth more. Stated, not fitted (no labeled MoE trace at hand): the
# combine's equal share halves the dispatch's excess, and a slow GPU beside routing noise reads ~1.0 over the steps
ROUTED_MIN_RATIO = 1.1


def received_by_step(t: EventTable, w: Window, groups: dict[str, np.ndarray]) -> dict[int, float]:
    """step -> bytes the rank's all-to-all kernels received in it (their "Out msg nelems" x the dtype's size; a
    kernel's step is its launch's), over the collective groups' all-to-all rows (crossrank.collective_rows); a trace
    without steps is one step, WHOLE_WINDOW_STEP. Empty where no all-to-all records its size."""
    rows = [r for key, r in groups.items() if group_kind(key) == "all_to_all"]
    rows = np.concatenate(rows) if rows else np.array([], dtype=np.int64)
    if not rows.size:
        return {}
    sizes = comm_args(t)
    received = np.array([sizes[c].received_bytes if c in sizes else 0 for c in t.correlation[rows].tolist()],
                        dtype=float)
    if not received.any():
        return {}
    steps = t.step[rows] if (t.step >= 0).any() else np.full(rows.size, WHOLE_WINDOW_STEP)
    keep = (steps >= 0) | ~(t.step >= 0).any()
    out: dict[int, float] = {}
    for step, b in zip(steps[keep].tolist(), received[keep].tolist()):
        out[step] = out.get(step, 0.0) + b
    return out


def late_received_ratio(last: dict, per_step: dict[int, dict]) -> float | None:
    """How many times the other ranks' all-to-all data the late ranks received in the steps they were late: the mean,
    over the steps of `last` (laggards: step -> (rank, wait)) in which every rank of per_step ({rank: received_by_step})
    has a figure, of the laggard's received bytes over the other ranks' median. None where no such step, or the others
    received nothing."""
    per = {r: v for r, v in per_step.items() if v}
    ratios = []
    for step, (rank, _) in last.items():
        if len(per) < 2 or rank not in per or not all(step in v for v in per.values()):
            continue
        others = float(np.median([v[step] for r, v in per.items() if r != rank]))
        if others > 0:
            ratios.append(per[rank][step] / others)
    return float(np.mean(ratios)) if ratios else None
