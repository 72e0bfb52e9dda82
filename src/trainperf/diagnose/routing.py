"""What a rank's all-to-all collectives receive: the tokens routed to its experts, step by step.

Expert parallelism moves each token to the ranks holding the experts its router picked, by all-to-all collectives
(the dispatch, the combine, and their backward). A rank receives in the dispatch (and in the combine's backward) the
tokens routed to its experts: PyTorch >= 2.1 writes each collective's receive buffer ("Out msg nelems", "dtype") on
its record_param_comms and kernel, so a rank's trace says how much it received in each step without recorded shapes.
A rank that receives more than the others in the steps it is late computes more because its experts draw more tokens
(routing imbalance), not because its GPU is slower: its extra tokens account for its extra computation. The combine's
receive (each rank's own tokens back) is the same on every rank, so its all-to-all data grows by half its dispatch's.

One rank's trace alone says where its own tokens go: an all-to-all's "In split size" lists the elements it sends to
each rank of its group (empty for equal splits), so the ranks whose experts draw more than their share stand out
(send_split_skew).

Hand-written: no profiler tool reads the tokens routed per rank from a trace (HTA and TraceLens report collectives'
sizes and bandwidth, not who receives more); this is the straggler and load-imbalance findings' own evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.collectives import CommArgs
from trainperf.diagnose.crossrank import WHOLE_WINDOW_STEP, group_kind
from trainperf.diagnose.process_groups import collective_calls, int_list
from trainperf.diagnose.slow_work import WORK_KINDS
from trainperf.diagnose.window import Window
from trainperf.trace.categories import collective_type
from trainperf.trace.events import EventTable

# the late ranks' extra tokens account for at least this share of their extra computation for their lateness to be
# named routing's (routed_share): half, the larger part, as slow_work.CAUSE_MIN_SHARE. Stated, not fitted (no labeled
# MoE trace at hand); on simulated jobs (benchmarks/slow_ranks_jobs.py --collective all_to_all --routed) ranks whose
# work follows their tokens read ~1.0, a slower GPU receiving its fair share 0.0
ROUTED_MIN_SHARE = 0.5
# a dispatch's receive beside the combine's, which returns each rank its own tokens (the same on every rank): a rank's
# all-to-all data grows by half its dispatch's excess
DISPATCH_SHARE = 0.5
# one rank sends at least this many times its mean share of its all-to-all data to one rank of the group, over the
# window (send_split_skew), for the experts there to be named hot: half again as much. Stated, not fitted (no labeled
# MoE trace at hand); a router's noise over a window's thousands of tokens moves a share by a few percent
SPLIT_SKEW_MIN = 1.5


@dataclass(frozen=True, kw_only=True)
class SplitSkew:
    """Where one rank's all-to-all data goes over the window: the largest share over the mean, and to whom."""

    ratio: float   # the largest per-rank total of "In split size" over their mean (x)
    peer: int      # that rank (global where the group's ranks are recorded, else its place in the group)
    peers: int     # the ranks of the group
    carries: str   # "embeddings" where the window computes embedding lookups (slow_work.WORK_KINDS), else "experts"


def send_split_skew(t: EventTable, w: Window) -> SplitSkew | None:
    """The rank's all-to-all data to each rank of its group, summed over the window's all-to-all calls that record
    their "In split size" (a call and its kernel may both carry the list: counted twice alike, the shares unchanged;
    lists of the group's size only), as a SplitSkew; None where no call records uneven splits."""
    totals: dict[int, np.ndarray] = {}
    ranks: dict[int, tuple] = {}
    for _, a in collective_calls(t, lambda s: collective_type(s) == "all_to_all", w.keep):
        split = int_list(a.get("In split size"))
        if len(split) >= 2:
            totals[len(split)] = totals.get(len(split), 0) + np.asarray(split, dtype=float)
            ranks.setdefault(len(split), int_list(a.get("Process Group Ranks")))
    if not totals:
        return None
    n = max(totals, key=lambda k: float(totals[k].sum()))
    sent = totals[n]
    if sent.mean() <= 0:
        return None
    at = int(np.argmax(sent))
    lookups = WORK_KINDS["embeddings"]
    carries = "embeddings" if any(lookups.search(t.names[i]) for i in np.unique(t.name[w.device]).tolist()) \
        else "experts"
    return SplitSkew(ratio=float(sent[at] / sent.mean()), peer=ranks[n][at] if len(ranks[n]) == n else at, peers=n,
                     carries=carries)


def received_by_step(t: EventTable, groups: dict[str, np.ndarray], sizes: dict[int, CommArgs]) -> dict[int, float]:
    """step -> bytes the rank's all-to-all kernels received in it (their "Out msg nelems" x the dtype's size, sizes:
    collectives.comm_args; a kernel's step is its launch's), over the collective groups' all-to-all rows
    (crossrank.collective_rows, the window's); a trace without steps is one step, WHOLE_WINDOW_STEP. Empty where no
    all-to-all records its size."""
    rows = [r for key, r in groups.items() if group_kind(key) == "all_to_all"]
    rows = np.concatenate(rows) if rows else np.array([], dtype=np.int64)
    if not rows.size:
        return {}
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


@dataclass(frozen=True, kw_only=True)
class Routed:
    """What slow or late ranks received in their all-to-alls against the other ranks, over the steps compared."""

    ratio: float           # their received bytes over the others' median, the mean over those steps (x)
    routed_share: float    # the share (0-1, capped) of their extra computation their extra tokens account for


@dataclass(frozen=True, kw_only=True)
class RoutingEvidence:
    """Each rank's all-to-all receive and computation per step, and each step's laggard, to compare late or slow ranks'
    received tokens against the other ranks' (received: {rank: received_by_step}; compute: {rank: step -> µs};
    last: step -> (laggard, wait))."""

    received: dict
    compute: dict
    last: dict

    def in_late_steps(self, ranks=None) -> Routed | None:
        """Over the steps whose laggard is one of `ranks` (None: every laggard), the laggard against the others in
        that step: for ranks late in turn, each late because of what it drew in its step."""
        pairs = [self._step(step, [rank]) for step, (rank, _) in self.last.items() if ranks is None or rank in ranks]
        return _as_routed([p for p in pairs if p is not None])

    def across_steps(self, ranks) -> Routed | None:
        """Over every step all ranks have, `ranks` (their mean) against the others: for ranks slow step after step, a
        comparison that each step's laggard among them, the one that drew the most in that step, would bias."""
        steps = set.intersection(*(set(v) for v in self.received.values())) if self.received else set()
        return _as_routed([p for p in (self._step(step, list(ranks)) for step in sorted(steps)) if p is not None])

    def _step(self, step, ranks: list[int]) -> tuple[float, float] | None:
        """(`ranks`' mean received over the other ranks' median, their mean computation over the others' median less
        1) in one step; None where some rank lacks the step or the others received or computed nothing."""
        everyone = list(self.received)
        if (len(everyone) < 2 or not set(ranks) <= set(everyone) or len(ranks) >= len(everyone)
                or not all(step in self.received[r] and step in self.compute.get(r, {}) for r in everyone)):
            return None
        others = [r for r in everyone if r not in ranks]
        got, work = (float(np.median([src[r][step] for r in others])) for src in (self.received, self.compute))
        if got <= 0 or work <= 0:
            return None
        mine = [float(np.mean([src[r][step] for r in ranks])) for src in (self.received, self.compute)]
        return mine[0] / got, mine[1] / work - 1.0


def _as_routed(pairs: list[tuple[float, float]]) -> Routed | None:
    """(received ratio, computation excess) pairs as a Routed: routed_share is the mean received excess, over
    DISPATCH_SHARE (the dispatch's part), against the mean computation excess; near 1 where the ranks' work grew with
    their tokens, 0 where they received their fair share. None without pairs or extra computation to explain."""
    if not pairs or float(np.mean([e for _, e in pairs])) <= 0:
        return None
    ratio = float(np.mean([r for r, _ in pairs]))
    share = (ratio - 1.0) / DISPATCH_SHARE / float(np.mean([e for _, e in pairs]))
    return Routed(ratio=ratio, routed_share=float(min(max(share, 0.0), 1.0)))


def routing_evidence(last: dict, received: dict[int, dict], compute: dict[int, dict]) -> RoutingEvidence | None:
    """RoutingEvidence of the ranks whose all-to-alls record what they received and that computed in some step; None
    where fewer than two do."""
    ranks = [r for r, v in received.items() if v and compute.get(r)]
    if len(ranks) < 2:
        return None
    return RoutingEvidence(received={r: received[r] for r in ranks}, compute={r: compute[r] for r in ranks}, last=last)
