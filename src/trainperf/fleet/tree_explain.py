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
above the typical rate and its rate stands significantly above typical: a one-sided z test
against the runs' own spread, Bonferroni-corrected over every segment the search could have
named, aiming at noise alone naming a place for at most ALPHA of the factors explained (measured
over 150 synthetic fleets: 2.1% at ALPHA 0.01, run-to-run noise being lognormal; docs/benchmarks.md). The factor is "mostly spread across runs" when the named
segments hold less than MIN_EXCESS_SHARE of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.fleet.tree import LABELS, NODES, MetricTree

ATTRS = ("job", "host", "version", "config")
# A segment holds a loss when at least this share of what its runs lose is above the typical
# rate (0.1: its rate is >= 1.11x typical); a factor is a place's when the segments hold this
# share of it. Chosen by 5-fold cross-validation over synthetic fleets with faults of random size
# (benchmarks/eval_tree_explain.py; held-out F1 in docs/benchmarks.md).
MIN_EXCESS_SHARE = 0.1
# Family-wise false-alarm rate of the significance test: the chance that run-to-run noise alone
# names a place for one factor. The z a segment needs is the one-sided t quantile (runs - 1
# degrees of freedom) at ALPHA / (number of segments the search could name), so more hosts and
# jobs need a larger z and few runs a larger one still (critical_z).
ALPHA = 0.01
# Fewer runs than this give no estimate of their spread: segments are then named as best guesses
# (not confident) on the excess rule alone.
MIN_RUNS_FOR_SPREAD = 5
# the search's deepest attribute combination (localize's max_depth)
_MAX_DEPTH = 3


def critical_z(leaves: dict[str, np.ndarray], alpha: float = ALPHA, max_depth: int = _MAX_DEPTH) -> float:
    """Return the one-sided z a segment needs: Student's t quantile at alpha / m (Bonferroni), with
    runs - 1 degrees of freedom (the spread is estimated from the runs themselves); m = the distinct
    sets of runs that an attribute combination of up to ``max_depth`` attributes selects (every
    segment the search could name; combinations that select the same runs are one test)."""
    from itertools import combinations

    from scipy.stats import t as student_t

    sets: set = set()
    for depth in range(1, min(max_depth, len(leaves)) + 1):
        for cub in combinations(leaves, depth):
            groups: dict = {}
            for i, key in enumerate(zip(*(leaves[a] for a in cub))):
                groups.setdefault(key, []).append(i)
            sets.update(tuple(g) for g in groups.values())
    n_runs = len(next(iter(leaves.values()), ()))
    return float(student_t.isf(alpha / max(len(sets), 1), max(n_runs - 1, 1)))


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
    z_crit: float = 0.0  # the z a segment needed (critical_z)
    leaves: dict = field(default_factory=dict, repr=False)  # attribute -> value per run searched

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
                "explained": self.explained, "z_crit": self.z_crit,
                "confident": self.confident, "placed_share": self.placed_share, "verdict": self.verdict,
                "segments": [s.to_dict() for s in self.segments]}


@dataclass(frozen=True)
class Leaf:
    """What --explain segments: a run, or one host's piece of a multi-node run with per-rank hosts."""

    run_id: str  # "run" or "run@host"
    attrs: dict
    parts: dict


def leaves_of(tree: MetricTree) -> list[Leaf]:
    """Return the runs as leaves, a multi-node run with per-rank hosts as one leaf per host
    (RunAccount.host_parts), so a slow host inside multi-node jobs is placed on the host."""
    out = []
    for a in tree.accounts:
        if a.host_parts:
            out += [Leaf(run_id=f"{a.run_id}@{h}", attrs={**a.attrs, "host": h}, parts=hp)
                    for h, hp in a.host_parts.items()]
        else:
            out.append(Leaf(run_id=a.run_id, attrs=a.attrs, parts=a.parts))
    return out


def explain(tree: MetricTree, factor: str | None = None, *, min_excess_share: float = MIN_EXCESS_SHARE,
            alpha: float = ALPHA) -> Explanation:
    """Return where ``factor`` (a node key; default: the largest loss) sits among the runs.

    ``min_excess_share`` and ``alpha``: the thresholds of the module docstring (defaults: the
    module's constants; benchmarks sweep them).
    """
    out, candidates = explain_candidates(tree, factor)
    z_crit = out.z_crit if alpha == ALPHA else critical_z(out.leaves, alpha)
    out.z_crit = z_crit
    out.segments = [seg for seg, z in candidates if seg.excess_gpu_h >= min_excess_share * seg.gpu_h and z >= z_crit]
    return out


def explain_candidates(tree: MetricTree, factor: str | None = None) -> tuple[Explanation, list[tuple[Segment, float]]]:
    """Return the explanation without its segments, and localize's causes as (Segment, z) to filter.

    z: (segment rate - typical) x sqrt(runs in it) / the runs' spread (1.4826 x MAD of their
    rates); inf when fewer than MIN_RUNS_FOR_SPREAD runs give no spread.
    """
    from trainperf.fleet.localize import localize

    key = factor or tree.largest_loss().key
    node = tree.node(key)
    stage = stage_of(key)
    accts = [p for p in leaves_of(tree) if p.parts.get(stage, 0.0) > 0]
    loss = np.array([a.parts.get(key, 0.0) for a in accts])
    alloc = np.array([a.parts[stage] for a in accts])
    if not accts:
        return Explanation(factor=key, label=LABELS[key], gpu_h=node.gpu_h, typical_rate=0.0, excess_gpu_h=0.0,
                           explained=0.0, stage=stage), []
    typical = float(np.median(loss / alloc))
    expected = alloc * typical
    above = np.maximum(loss, expected)  # only the excess over the typical rate is a cause
    leaves = {k: np.array([a.attrs[k] for a in accts]) for k in ATTRS}
    out = Explanation(factor=key, label=LABELS[key], gpu_h=node.gpu_h, typical_rate=typical,
                      excess_gpu_h=float((above - expected).sum()), explained=0.0, n_runs=len(accts),
                      stage=stage, leaves=leaves, z_crit=critical_z(leaves))
    if len(accts) < 2 or out.excess_gpu_h <= 1e-9 * abs(node.gpu_h):
        return out, []
    # in GPU-seconds: localize's noise model is Poisson-like (variance ~ the expectation), so
    # the unit is the smallest a loss is measured in, not an hour
    sec = 3600.0
    loc = localize(leaves, above * sec, expected * sec, real_b=alloc * sec, expected_b=alloc * sec)
    out.explained = float(loc.explained)
    out.confident = bool(loc.confident)
    rates = loss / alloc
    sigma = 1.4826 * float(np.median(np.abs(rates - typical)))
    if len(accts) < MIN_RUNS_FOR_SPREAD:
        sigma, out.confident = 0.0, False
    candidates = []
    for c in loc.causes:
        inside = np.ones(len(accts), bool)
        for k, v in c.attrs.items():
            inside &= leaves[k] == v
        g, al, ex = float(loss[inside].sum()), float(alloc[inside].sum()), float((above - expected)[inside].sum())
        rate = g / al if al else 0.0
        z = (rate - typical) * np.sqrt(inside.sum()) / sigma if sigma > 0 else np.inf
        seg = Segment(attrs=dict(c.attrs), gpu_h=g, excess_gpu_h=ex, rate=rate, share=ex / out.excess_gpu_h,
                      run_ids=[a.run_id for a, x in zip(accts, inside) if x])
        candidates.append((seg, float(z)))
    return out, candidates


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
