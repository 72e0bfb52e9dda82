"""Where one factor of the metric tree sits: its loss segmented by job, host, version and config.

Each run is a leaf with its loss in GPU-hours and the GPU-hours of the stage the loss comes out
of (its parent in the tree: allocated for start-up, restarts and lost work; running for data
wait, checkpoint stalls and evaluation; productive for below plan; the layout overhead for its
terms). The measure is the derived ratio loss / stage; a run is expected to lose the fleet's
typical rate (the median over runs), so a host or version that loses more per GPU-hour stands
out while one that only ran more, or lost more elsewhere, does not. Only the excess above the
typical rate is searched (a run that loses less than typical is no cause of the loss).
trainperf.fleet.localize searches the attribute combinations and returns the one that explains
the excess most simply.

A segment is named only when at least MIN_EXCESS_SHARE of what its runs lose on the factor is
above the typical rate and its rate stands MIN_Z standard errors above typical (the spread of
the runs' own rates); the factor is "mostly spread across runs" when the named segments hold
less than MIN_EXCESS_SHARE of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.fleet.tree import LABELS, NODES, MetricTree

ATTRS = ("job", "host", "version", "config")
# A segment holds a loss when at least a tenth of what its runs lose is above the typical rate
# (its rate is >= 1.11x typical); a factor is a place's when the segments hold a tenth of it.
# Below that, removing the whole excess recovers under a tenth: the loss belongs to every run.
MIN_EXCESS_SHARE = 0.1
# ... and when its rate is above typical by this many standard errors, the runs' own spread
# (1.4826 x the median absolute deviation of their rates, over sqrt(runs in the segment)):
# one-sided p < 0.0013 for normal run-to-run noise, so noise alone rarely names a place.
MIN_Z = 3.0
# Fewer runs than this give no estimate of their spread: segments are then named as best guesses
# (not confident) on the excess rule alone.
MIN_RUNS_FOR_SPREAD = 5


_PARENT = {k: parent for k, _, _, parent in NODES}


def stage_of(key: str) -> str:
    """Return the stage whose GPU-hours factor ``key`` comes out of: its parent in the tree.

    Start-up, restarts and lost work come out of allocated; data wait, checkpoints and evaluation
    out of running; below plan out of productive; the layout's terms out of the layout overhead
    (so a run that does more work per hour is not "more overhead").
    """
    return _PARENT.get(key) or "allocated"


@dataclass(kw_only=True)
class Segment:
    """One cause: an attribute combination, its loss rate and what it explains."""

    attrs: dict
    gpu_h: float  # the factor's GPU-hours in these runs
    excess_gpu_h: float  # above the typical rate
    rate: float  # loss per GPU-hour of the stage it comes out of, in these runs
    share: float  # of the factor's excess over the typical rate (fraction)
    run_ids: list

    @property
    def where(self) -> str:
        """Return the segment as text: attribute=value pairs, and the run id when it is one run."""
        text = " & ".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{text} (run {self.run_ids[0]})" if len(self.run_ids) == 1 else text

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return {"attrs": self.attrs, "gpu_h": self.gpu_h, "excess_gpu_h": self.excess_gpu_h, "rate": self.rate,
                "share": self.share, "run_ids": self.run_ids}


@dataclass(kw_only=True)
class Explanation:
    """Where the loss of one factor sits."""

    factor: str
    label: str
    gpu_h: float
    typical_rate: float  # median over runs of loss / stage GPU-hours
    excess_gpu_h: float  # sum over runs of max(loss - typical rate x stage, 0)
    stage: str = "allocated"  # the stage the loss comes out of (the rate's denominator)
    explained: float  # fraction of the leaf-level deviation the causes explain (localize)
    confident: bool = False  # localize's own verdict on its answer
    n_runs: int = 0
    segments: list[Segment] = field(default_factory=list)

    @property
    def placed_share(self) -> float:
        """Return the share of the factor's GPU-hours the named segments hold above the typical rate."""
        return sum(s.excess_gpu_h for s in self.segments) / self.gpu_h if self.gpu_h > 0 else 0.0

    @property
    def verdict(self) -> str:
        """Return one sentence naming where the loss sits (or that it is spread out)."""
        if self.n_runs < 2:
            return f"{self.label}: {self.n_runs} run, nothing to segment"
        typical = f"typical {self.typical_rate:.1%} of {self.stage} GPU-hours"
        if not self.segments:
            return f"{self.label}: spread across runs, no place holds it ({typical})"
        hedge = "" if self.confident else "no confident cause; best guess "
        where = " or ".join(s.where for s in self.segments)
        rates = ", ".join(f"{s.rate:.1%}" for s in self.segments)
        held = sum(s.excess_gpu_h for s in self.segments)
        head = f"{self.label}: " if self.placed_share >= MIN_EXCESS_SHARE else \
            f"{self.label}: mostly spread across runs ({typical}); above that, "
        return (f"{head}{hedge}{held:.3g} GPU-h sits in {where} ({rates} of their {self.stage} GPU-hours vs "
                f"{self.typical_rate:.1%} typical; explains {self.explained:.0%} of the deviation across runs)")

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return {"factor": self.factor, "label": self.label, "gpu_h": self.gpu_h, "typical_rate": self.typical_rate,
                "excess_gpu_h": self.excess_gpu_h, "stage": self.stage, "n_runs": self.n_runs,
                "explained": self.explained,
                "confident": self.confident, "placed_share": self.placed_share, "verdict": self.verdict,
                "segments": [s.to_dict() for s in self.segments]}


def explain(tree: MetricTree, factor: str | None = None) -> Explanation:
    """Return where ``factor`` (a node key; default: the largest loss) sits among the runs."""
    from trainperf.fleet.localize import localize

    key = factor or tree.largest_loss().key
    node = tree.node(key)
    stage = stage_of(key)
    accts = [a for a in tree.accounts if a.parts.get(stage, 0.0) > 0]
    loss = np.array([a.parts.get(key, 0.0) for a in accts])
    alloc = np.array([a.parts[stage] for a in accts])
    if not accts:
        return Explanation(factor=key, label=LABELS[key], gpu_h=node.gpu_h, typical_rate=0.0, excess_gpu_h=0.0,
                           explained=0.0, stage=stage)
    typical = float(np.median(loss / alloc))
    expected = alloc * typical
    above = np.maximum(loss, expected)  # only the excess over the typical rate is a cause
    out = Explanation(factor=key, label=LABELS[key], gpu_h=node.gpu_h, typical_rate=typical,
                      excess_gpu_h=float((above - expected).sum()), explained=0.0, n_runs=len(accts),
                      stage=stage)
    if len(accts) < 2 or out.excess_gpu_h <= 1e-9 * abs(node.gpu_h):
        return out
    leaves = {k: np.array([a.attrs[k] for a in accts]) for k in ATTRS}
    # in GPU-seconds: localize's noise model is Poisson-like (variance ~ the expectation), so
    # the unit is the smallest a loss is measured in, not an hour
    sec = 3600.0
    loc = localize(leaves, above * sec, expected * sec, real_b=alloc * sec, expected_b=alloc * sec)
    out.explained = float(loc.explained)
    out.confident = bool(getattr(loc, "confident", loc.explained >= 0.3))
    rates = loss / alloc
    sigma = 1.4826 * float(np.median(np.abs(rates - typical)))
    if len(accts) < MIN_RUNS_FOR_SPREAD:
        sigma, out.confident = 0.0, False
    for c in loc.causes:
        inside = np.ones(len(accts), bool)
        for k, v in c.attrs.items():
            inside &= leaves[k] == v
        g, al, ex = float(loss[inside].sum()), float(alloc[inside].sum()), float((above - expected)[inside].sum())
        rate = g / al if al else 0.0
        z = (rate - typical) * np.sqrt(inside.sum()) / sigma if sigma > 0 else np.inf
        if ex < MIN_EXCESS_SHARE * g or z < MIN_Z:  # about the typical rate, or within the runs' noise
            continue
        out.segments.append(Segment(attrs=dict(c.attrs), gpu_h=g, excess_gpu_h=ex, rate=rate,
                                    share=ex / out.excess_gpu_h,
                                    run_ids=[a.run_id for a, x in zip(accts, inside) if x]))
    return out


def explain_largest(tree: MetricTree) -> list[Explanation]:
    """Return where the largest loss sits; when it is mostly spread across runs, also the loss whose
    named segments hold the most GPU-hours above the typical rate (the largest one a place holds)."""
    first = explain(tree)
    if first.placed_share >= MIN_EXCESS_SHARE:
        return [first]
    others = [explain(tree, n.key) for n in tree.root.walk() if n.kind == "loss" and n.key != first.factor]
    placed = [e for e in others if e.segments and e.confident]
    held = {id(e): sum(s.excess_gpu_h for s in e.segments) for e in placed}
    return [first] + ([max(placed, key=lambda e: held[id(e)])] if placed else [])
