"""Where one factor of the metric tree sits: its loss segmented by job, host, version, configuration.

Each run is a leaf with its loss in GPU-hours and its allocated GPU-hours. The measure is the
derived ratio loss / allocated; a run is expected to lose the fleet's typical rate (the median
over runs), so a host or version that loses more per allocated GPU-hour stands out while one
that only ran more does not. Only the excess above the typical rate is searched (a run that
loses less than typical is no cause of the loss). trainperf.fleet.localize searches the
attribute combinations and returns the one that explains the excess most simply; when the
excess is under MIN_EXCESS_SHARE of the factor, the loss is spread across runs and no segment
is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.fleet.tree import LABELS, MetricTree

ATTRS = ("job", "host", "version", "config")
# Name a segment only when the loss above the typical rate is at least this share of the
# factor: below it, even removing the whole excess recovers under a tenth of the factor, and
# the factor is a property of every run (the layout, the kernels), not of a place.
MIN_EXCESS_SHARE = 0.1


@dataclass(kw_only=True)
class Segment:
    """One cause: an attribute combination, its loss rate and what it explains."""

    attrs: dict
    gpu_h: float  # the factor's GPU-hours in these runs
    excess_gpu_h: float  # above the typical rate
    rate: float  # loss per allocated GPU-hour in these runs
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
    typical_rate: float  # median over runs of loss / allocated GPU-hours
    excess_gpu_h: float  # sum over runs of max(loss - typical rate x allocated, 0)
    explained: float  # fraction of the leaf-level deviation the causes explain (localize)
    confident: bool = False  # localize's own verdict on its answer
    n_runs: int = 0
    segments: list[Segment] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """Return one sentence naming where the loss sits (or that it is spread out)."""
        if self.n_runs < 2:
            return f"{self.label}: {self.n_runs} run, nothing to segment"
        if not self.segments:
            return (f"{self.label}: spread across runs, no place holds it (typical {self.typical_rate:.1%} of "
                    f"allocated GPU-hours; {self.excess_gpu_h:.3g} GPU-h above that)")
        hedge = "" if self.confident else "no confident cause; best guess "
        where = " or ".join(s.where for s in self.segments)
        rates = ", ".join(f"{s.rate:.1%}" for s in self.segments)
        return (f"{self.label}: {hedge}sits in {where} ({rates} of their allocated GPU-hours vs {self.typical_rate:.1%} "
                f"typical; explains {self.explained:.0%} of the deviation across runs)")

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return {"factor": self.factor, "label": self.label, "gpu_h": self.gpu_h, "typical_rate": self.typical_rate,
                "excess_gpu_h": self.excess_gpu_h, "n_runs": self.n_runs, "explained": self.explained,
                "confident": self.confident, "verdict": self.verdict,
                "segments": [s.to_dict() for s in self.segments]}


def explain(tree: MetricTree, factor: str | None = None) -> Explanation:
    """Return where ``factor`` (a node key; default: the largest loss) sits among the runs."""
    from trainperf.fleet.localize import localize

    key = factor or tree.largest_loss().key
    node = tree.node(key)
    accts = [a for a in tree.accounts if a.parts.get("allocated", 0.0) > 0]
    loss = np.array([a.parts.get(key, 0.0) for a in accts])
    alloc = np.array([a.parts["allocated"] for a in accts])
    if not accts:
        return Explanation(factor=key, label=LABELS[key], gpu_h=node.gpu_h, typical_rate=0.0, excess_gpu_h=0.0,
                           explained=0.0)
    typical = float(np.median(loss / alloc))
    expected = alloc * typical
    above = np.maximum(loss, expected)  # only the excess over the typical rate is a cause
    out = Explanation(factor=key, label=LABELS[key], gpu_h=node.gpu_h, typical_rate=typical,
                      excess_gpu_h=float((above - expected).sum()), explained=0.0, n_runs=len(accts))
    if len(accts) < 2 or out.excess_gpu_h <= MIN_EXCESS_SHARE * abs(node.gpu_h):
        return out
    leaves = {k: np.array([a.attrs[k] for a in accts]) for k in ATTRS}
    # in GPU-seconds: localize's noise model is Poisson-like (variance ~ the expectation), so
    # the unit is the smallest a loss is measured in, not an hour
    sec = 3600.0
    loc = localize(leaves, above * sec, expected * sec, real_b=alloc * sec, expected_b=alloc * sec)
    out.explained = float(loc.explained)
    out.confident = bool(getattr(loc, "confident", loc.explained >= 0.3))
    for c in loc.causes:
        inside = np.ones(len(accts), bool)
        for k, v in c.attrs.items():
            inside &= leaves[k] == v
        g, al, ex = float(loss[inside].sum()), float(alloc[inside].sum()), float((above - expected)[inside].sum())
        out.segments.append(Segment(attrs=dict(c.attrs), gpu_h=g, excess_gpu_h=ex, rate=g / al if al else 0.0,
                                    share=ex / out.excess_gpu_h,
                                    run_ids=[a.run_id for a, x in zip(accts, inside) if x]))
    return out


def explain_largest(tree: MetricTree) -> list[Explanation]:
    """Return where the largest loss sits; when it is spread across runs, also where the loss with
    the most GPU-hours above its typical rate sits (the largest one a place holds)."""
    first = explain(tree)
    if first.segments:
        return [first]
    others = [explain(tree, n.key) for n in tree.root.walk() if n.kind == "loss" and n.key != first.factor]
    placed = [e for e in others if e.segments]
    return [first] + ([max(placed, key=lambda e: e.excess_gpu_h)] if placed else [])
