"""Root-cause localisation: which attribute combinations (host, GPU, driver, NCCL, config, ...)
explain a change of a fleet measure.

Input: one row per leaf (a full combination of attribute values) with the measure now and a
forecast from history. For a derived measure M/N (failures per request, step time per token)
the expected numerator of a leaf is its current denominator times its historical ratio
(shrunk towards the fleet's ratio when the leaf has little history), so a traffic shift alone
is not a cause.

Search (the "ripple" principle of Squeeze, Li et al. 2019, scored differently): a candidate is a
set of elements of one cuboid (e.g. {nccl=2.21} or {host=a, host=b} or {bitrate=500 & cdn=7}),
built from the elements ranked by surprise (deviation / sqrt(expectation)). Inside each element
all leaves move together: a derived measure's ratio rises by the element's own amount (each leaf
by its denominator times it), a sum scales by the element's own factor; outside, leaves stay at
their expectation. The candidate's loss is the L1 distance between that model and the observed
leaves: a too-general candidate moves healthy leaves, a too-specific one leaves anomalous leaves
unexplained. The choice minimises (loss - best loss) / (no-cause loss - best loss) + ``penalty`` x
(attribute=value pairs), a description-length rule that prefers the most general combination;
"best loss" is the smallest over all candidates, so the penalty is a share of the deviation a
cause can explain, not of the leaf noise (the same setting then holds on quiet and noisy fleets).
Parsimony then replaces a combination by its parent unless the leaves it leaves out clearly did
not share the change.

Several faults (RiskLoc, Kalander 2022: iterative removal): the leaves of the causes found are
set aside and the search runs again on the rest, so a second fault of another size or in another
cuboid is found by its own evidence. Every cause element must be significant against the leaf
noise (one-sided z >= the Bonferroni bound for ``alpha`` over all elements searched; the noise
read on the leaves outside the causes, under both a Poisson-like and a relative-error law, the
stricter kept) and relevant (at least ``min_share`` of the total change, RiskLoc's 2%); a further
fault must also move most of its leaves (``_consistent``, RiskLoc's "risk"). When not
even the first element is significant, it is still given as the best guess, "not confident".
Hand-written: no maintained Python library implements multi-dimensional root-cause search.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np

from trainperf.errors import TrainperfError


@dataclass
class Cause:
    """One root-cause element with its evidence (before = expected, after = observed)."""

    attrs: dict  # {"attr": "value", ...}
    before: float  # the measure expected from history (ratio for a derived measure)
    after: float  # the measure observed at the change
    share: float  # share of the total change this element explains (0..1, may exceed 1)
    n_leaves: int
    confidence: float = 0.0  # fraction of the leaf-level deviation (L1) this element alone explains (0..1)

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return {"attrs": self.attrs, "before": self.before, "after": self.after, "share": self.share,
                "n_leaves": self.n_leaves, "confidence": self.confidence}


@dataclass
class Localization:
    """The root causes of a change and the evidence for them.

    ``causes``: the answer (the best candidate's elements), never empty when anything deviates;
    ``confident``: whether the answer explains at least ``min_explained`` of the deviation (if
    not, it is the best guess: "no confident cause"); ``alternatives``: the next candidates
    (other attribute combinations), ranked, each with its confidence.
    """

    causes: list[Cause] = field(default_factory=list)
    explained: float = 0.0  # fraction of the leaf-level deviation the answer explains (0..1)
    total_before: float = 0.0
    total_after: float = 0.0
    confident: bool = False
    alternatives: list[Cause] = field(default_factory=list)

    @property
    def root_causes(self) -> list[dict]:
        """Return the answer's causes as [{"attr": "value", ...}, ...] (the best guess when not confident)."""
        return [c.attrs for c in self.causes]

    @property
    def verdict(self) -> str:
        """Return one line: the causes, or "no confident cause" with the best guess."""
        names = ", ".join(" & ".join(f"{k}={v}" for k, v in c.attrs.items()) for c in self.causes)
        if not self.causes:
            return "no deviation to explain"
        if self.confident:
            return f"root cause: {names} (explains {self.explained:.0%} of the deviation)"
        return f"no confident cause; best guess {names} explains only {self.explained:.0%} of the deviation"

    def to_dict(self) -> dict:
        """Return JSON-able data (``root_causes`` first)."""
        return {"root_causes": self.root_causes, "confident": self.confident, "verdict": self.verdict,
                "explained": self.explained, "total_before": self.total_before, "total_after": self.total_after,
                "causes": [c.to_dict() for c in self.causes], "alternatives": [c.to_dict() for c in self.alternatives]}


@dataclass(kw_only=True, frozen=True, slots=True)
class LocalizeOptions:
    """Settings of the root-cause search (penalty and parsimony: the grid setting best on the hardest
    of the RS incidents and four synthetic sets, "maximin"; ``alpha`` and ``min_share``: stated
    rules, not fitted; docs/benchmarks.md).

    ``max_depth``: most attributes in one combination; ``max_elements``: most elements in one
    cause set; ``penalty``: the fraction of the deviation each attribute=value pair must explain
    (prefers general causes); ``parsimony_z``, ``parsimony_ratio``: a more specific combination keeps
    its place over its parent only when the leaves it leaves out clearly moved less than
    ``parsimony_ratio`` of its own change (``child_z`` at least this one-sided z; 2.33: p < 0.01);
    ``min_explained``: the answer is "confident" when its first element is significant and it
    explains at least this fraction of the leaf-level deviation (L1); ``max_causes``: most cause
    elements in all; ``alpha``: the family-wise false-cause rate of the significance test
    (Bonferroni over the elements searched); ``min_share``: the least share of the total change a
    cause element must carry (RiskLoc's 2% explanatory-power threshold).
    """

    max_depth: int = 3
    max_elements: int = 4
    penalty: float = 0.05
    parsimony_z: float = 1.645
    parsimony_ratio: float = 0.25
    min_explained: float = 0.3
    max_causes: int = 9  # the most the papers' generators inject: 3 faults x 3 elements
    alpha: float = 0.01
    min_share: float = 0.02

    def __post_init__(self):
        if self.max_depth < 1 or self.max_elements < 1:
            raise TrainperfError("localize options: max_depth and max_elements must be >= 1")
        if self.max_causes < 1 or not 0 < self.alpha < 1 or not 0 <= self.min_share <= 1:
            raise TrainperfError("localize options: max_causes must be >= 1, alpha in (0, 1), min_share in [0, 1]")
        if self.penalty < 0 or self.parsimony_z < 0 or not 0 <= self.min_explained <= 1:
            raise TrainperfError("localize options: penalty and parsimony_z must be >= 0, min_explained in [0, 1]")


def expected_values(real_a: np.ndarray, pred_a: np.ndarray, real_b: np.ndarray | None = None,
                    pred_b: np.ndarray | None = None) -> np.ndarray:
    """Return the expected numerator per leaf.

    Fundamental measure (no denominator): the forecast ``pred_a``. Derived measure a/b: the
    leaf's observed ``real_b`` times its historical ratio pred_a/pred_b; a leaf with no history
    (pred_b = 0, e.g. a host that just got a new NCCL) takes the ratio of the history of the
    leaves that share the most attribute values with it (see ``localize_rows``), else the fleet's.
    """
    if real_b is None:
        return pred_a.astype(float)
    tot_b = pred_b.sum()
    fleet = pred_a.sum() / tot_b if tot_b > 0 else 0.0
    rate = np.where(pred_b > 0, pred_a / np.where(pred_b > 0, pred_b, 1.0), fleet)
    return real_b * rate


def _fit(real: np.ndarray, exp: np.ndarray, weight: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The model "the leaves of each cause element move together, the rest stay at their expectation":
    its prediction.

    ``labels``: the cause element of each leaf (-1: outside every element). Inside element e, each
    leaf's expectation moves by ``weight * delta_e``, one delta per element fitted to its total:
    weight = the leaf's denominator for a derived measure (the ratio rises by the same amount,
    e.g. +2% of requests fail), weight = the expectation itself for a sum (it scales by the same
    factor). One delta per element, not one for the whole cause set: several faults (a bad host
    and a bad driver, or two CDNs) have their own sizes, as in the RiskLoc and Squeeze generators
    (each root cause draws its own severity).
    """
    inside = labels >= 0
    if not inside.any():
        return exp.copy()
    lab = np.where(inside, labels, 0)
    m = int(lab.max()) + 1
    w_e = np.bincount(lab[inside], weight[inside], m)
    d_e = np.bincount(lab[inside], real[inside] - exp[inside], m)
    delta = np.divide(d_e, w_e, out=np.zeros(m), where=w_e > 0)
    return np.where(inside, exp + weight * delta[lab], exp)


def _model_loss(real: np.ndarray, exp: np.ndarray, weight: np.ndarray, labels: np.ndarray) -> float:
    """L1 distance between the observed leaves and the model of ``_fit``."""
    return float(np.abs(real - _fit(real, exp, weight, labels)).sum())


def _labels(codes: np.ndarray, elems) -> np.ndarray:
    """Return per leaf the position of its element in ``elems`` (-1: none of them)."""
    lookup = np.full(int(codes.max()) + 1, -1)
    lookup[np.asarray(list(elems), int)] = np.arange(len(elems))
    return lookup[codes]


def _dispersion(real: np.ndarray, exp: np.ndarray, outside: np.ndarray) -> float:
    """Noise variance per unit of expectation, from the leaves outside the cause (Poisson-like
    counts: ~1; continuous measures: their own scale): median of (real - exp)^2 / exp over those
    leaves, divided by 0.4549 (the median of a chi-square with one degree of freedom)."""
    ok = outside & (np.abs(exp) > 0)
    if ok.sum() < 3:
        return 1.0
    r = (real[ok] - exp[ok]) ** 2 / np.abs(exp[ok])
    d = float(np.median(r)) / 0.4549
    return d if d > 0 else float(np.mean(r)) or 1.0


def child_z(real: np.ndarray, exp: np.ndarray, weight: np.ndarray, parent: np.ndarray, child: np.ndarray,
            sign: float, dispersion: float, min_ratio: float) -> float:
    """Return the one-sided z by which the child (a more specific cause) beats its parent.

    The siblings are the leaves in ``parent`` but not in ``child``. Under the parent they share the
    change: each moves by at least ``min_ratio`` of the child's change per unit of weight (a
    ratio's increment, a sum's relative change). z = (that least move - their observed move) /
    sqrt(dispersion x their expected total), an over-dispersed Poisson-like normal approximation:
    large when the siblings clearly did not share the change. No siblings: -inf (the same leaves).
    """
    sib = parent & ~child
    if not sib.any():
        return -np.inf
    dev_s = sign * float(real[sib].sum() - exp[sib].sum())
    dev_c = sign * float(real[child].sum() - exp[child].sum())
    w_s, w_c = float(weight[sib].sum()), float(weight[child].sum())
    least = min_ratio * dev_c / w_c * w_s if w_c > 0 else 0.0
    return float((least - dev_s) / np.sqrt(dispersion * max(float(np.abs(exp[sib]).sum()), 1e-12)))


def siblings_share(real: np.ndarray, exp: np.ndarray, weight: np.ndarray, codes: np.ndarray, parent: np.ndarray,
                   child: np.ndarray, sign: float) -> float:
    """Return how much of the child's change the typical sibling sub-population shared: the median,
    over the elements of the child's cuboid inside the parent but outside the child, of their change
    per unit of weight over the child's (1: moved alike, 0: did not move; nan: no siblings).

    Each sub-population counts once, whatever its traffic: a dominant value that carries most of the
    change cannot hide that the other values of its attribute moved too (``child_z`` pools them).
    """
    sib = parent & ~child
    w_c = float(weight[child].sum())
    dev_c = sign * float(real[child].sum() - exp[child].sum())
    if not sib.any() or w_c <= 0 or dev_c <= 0:
        return float("nan")
    groups = codes[sib]
    m = int(groups.max()) + 1
    w = np.bincount(groups, weight[sib], m)
    dev = sign * np.bincount(groups, real[sib] - exp[sib], m)
    ok = w > 0
    return float(np.median(dev[ok] / w[ok])) / (dev_c / w_c) if ok.any() else float("nan")


def localize(leaves: dict[str, np.ndarray], real: np.ndarray, expected: np.ndarray,
             options: LocalizeOptions | None = None, real_b: np.ndarray | None = None,
             expected_b: np.ndarray | None = None, **fields) -> Localization:
    """Return the root causes of real vs expected over the leaves, ranked, with a confidence each.

    ``leaves``: attribute name -> array of values (one per leaf). ``real``/``expected``: the
    numerator now and expected (see expected_values). ``real_b``: the denominator now for a
    derived measure (``expected_b`` is accepted for symmetry; the expectation already uses it).
    ``options`` (LocalizeOptions; keyword ``fields`` override its fields).
    Search: candidates are sets of elements of one cuboid; the best minimises
    (loss - best loss) / (no-cause loss - best loss) + penalty x pairs; then parsimony: while a parent (one attribute
    fewer) is not refuted (``_parsimony``), the parent replaces it.
    """
    opts = replace(options or LocalizeOptions(), **fields)
    return localize_each(leaves, real, expected, [opts], real_b=real_b)[0]


def localize_each(leaves: dict[str, np.ndarray], real: np.ndarray, expected: np.ndarray,
                  options: list[LocalizeOptions], real_b: np.ndarray | None = None) -> list[Localization]:
    """Return ``localize`` for each settings in ``options``, sharing one candidate search between
    settings with the same ``max_depth`` and ``max_elements`` (parameter sweeps)."""
    attrs = list(leaves)
    if not attrs:
        raise TrainperfError("localize: no attribute columns")
    real = np.asarray(real, float)
    expected = np.asarray(expected, float)
    total_dev = real.sum() - expected.sum()
    base_loss = float(np.abs(real - expected).sum())
    # how leaves inside a cause move together: a sum (or mean) scales by one factor (weight =
    # expectation); a derived ratio shifts by one increment (weight = the leaf's denominator)
    weight = np.abs(expected) if real_b is None else np.asarray(real_b, float)
    sign = 1.0 if total_dev >= 0 else -1.0
    enc = {a: np.unique(np.asarray(leaves[a]).astype(str), return_inverse=True) for a in attrs}
    cuboids: dict = {}  # cuboid -> (element code per leaf, unique element keys)
    searched: dict = {}
    results = []
    for opts in options:
        out = Localization(total_before=float(expected.sum()), total_after=float(real.sum()))
        results.append(out)
        if len(real) == 0 or base_loss == 0:
            continue
        key = (opts.max_depth, opts.max_elements)
        if key not in searched:
            searched[key] = _candidates(attrs, enc, cuboids, real, expected, weight, sign, *key)
        if not searched[key]:
            continue
        active = np.ones(len(real), bool)  # leaves no cause found so far covers
        found: list[tuple[tuple, list[int]]] = []
        ranked = _pick(searched[key], base_loss, opts.penalty)
        z_crit = None
        while True:
            cuboid, elems = ranked[0][2], ranked[0][3]
            r_real, r_exp, r_w = (np.where(active, v, 0.0) for v in (real, expected, weight))
            cuboid, elems, _ = _parsimony(cuboid, elems, cuboids, r_real, r_exp, r_w, sign, opts.parsimony_z,
                                          opts.parsimony_ratio)
            codes = cuboids[cuboid][0]
            # each cause element must be a fault of its own: significant against the leaf noise
            # (Bonferroni over every element searched) and relevant (``min_share`` of the change)
            if z_crit is None:
                z_crit = _bonferroni_z(opts.alpha, sum(len(u) for _, u in cuboids.values()))
            rest = active & ~np.isin(codes, elems)  # the noise is read on the leaves outside every cause
            noise = _noise_model(r_real[rest], r_exp[rest])
            passed = [i for i in elems if _element_z(r_real, r_exp, codes == i, sign, noise) >= z_crit
                      and sign * float(r_real[codes == i].sum() - r_exp[codes == i].sum())
                      >= opts.min_share * abs(total_dev)]
            if not found:
                significant = bool(passed)
                elems = passed or elems[:1]  # nothing significant: the first element, as the best guess
            else:  # a further fault must also move most of its leaves, not one big leaf (RiskLoc's risk)
                passed = [i for i in passed if _consistent(r_real, r_exp, codes == i, sign, noise)]
            if found and not passed:
                break
            if found:
                elems = passed
            labels = np.where(active, _labels(codes, elems), -1)
            found = _merge(found, cuboid, elems, cuboids)
            active &= labels < 0
            if not significant or sum(len(e) for _, e in found) >= opts.max_causes or not active.any():
                break
            r_real, r_exp, r_w = (np.where(active, v, 0.0) for v in (real, expected, weight))
            r_base = float(np.abs(r_real - r_exp).sum())
            cands = _candidates(attrs, enc, cuboids, r_real, r_exp, r_w, sign, *key) if r_base > 0 else []
            if not cands:
                break
            ranked = _pick(cands, r_base, opts.penalty)
        ranked = _pick(searched[key], base_loss, opts.penalty)
        # the final model: each cause element, in the order found, takes its leaves no earlier one took
        labels = np.full(len(real), -1)
        for n, (cb, i) in enumerate((cb, i) for cb, el in found for i in el):
            labels[(labels < 0) & (cuboids[cb][0] == i)] = n
        loss = _model_loss(real, expected, weight, labels)
        out.explained = max(0.0, 1.0 - loss / base_loss)
        out.confident = significant and out.explained >= opts.min_explained

        def describe(cb, i) -> Cause:
            codes, uniq = cuboids[cb]
            mask = codes == i
            attrs_i = {a: str(enc[a][0][uniq[i][j]]) for j, a in enumerate(cb)}
            before, after = float(expected[mask].sum()), float(real[mask].sum())
            if real_b is not None:
                rb = float(np.asarray(real_b)[mask].sum())
                before, after = (before / rb if rb else float("nan")), (after / rb if rb else float("nan"))
            share = float((real[mask].sum() - expected[mask].sum()) / total_dev) if total_dev else float("nan")
            conf = max(0.0, 1.0 - _model_loss(real, expected, weight, np.where(mask, 0, -1)) / base_loss)
            return Cause(attrs=attrs_i, before=before, after=after, share=share, n_leaves=int(mask.sum()),
                         confidence=conf)

        out.causes = sorted((describe(cb, i) for cb, el in found for i in el), key=lambda c: -c.confidence)
        seen = {cause_key_of(c.attrs) for c in out.causes}
        for _, _, cb, el in ranked[1:]:
            if len(out.alternatives) >= 5:
                break
            c = describe(cb, el[0])
            if cause_key_of(c.attrs) not in seen:
                seen.add(cause_key_of(c.attrs))
                out.alternatives.append(c)
        out.alternatives.sort(key=lambda c: -c.confidence)
    return results


def _merge(found: list, cuboid: tuple, elems: list[int], cuboids: dict) -> list:
    """Return the causes found with a new round's (cuboid, elements) added.

    A cause found earlier that a new element contains (e.g. bitrate=500 & device=C1, then
    bitrate=500 on the leaves left) is dropped: the new round shows that the rest of the general
    element moved too, so the fault is the general one (the parsimony rule, with evidence).
    """
    uniq = cuboids[cuboid][1]
    new = [{a: int(uniq[i][j]) for j, a in enumerate(cuboid)} for i in elems]
    kept = []
    for cb, el in found:
        u = cuboids[cb][1]
        el = [i for i in el if not any(all(a in cb and int(u[i][cb.index(a)]) == v for a, v in n.items()) for n in new)]
        if el:
            kept.append((cb, el))
    return kept + [(cuboid, list(elems))]


def _pick(candidates: list[tuple], base_loss: float, penalty: float) -> list[tuple]:
    """Return the candidates ranked by (loss - best loss) / (base loss - best loss) + penalty x pairs.

    The penalty is a fraction of the explainable deviation (base loss - the best candidate's loss),
    not of the whole L1, which noise dominates on many small leaves: the same penalty then means
    the same on a quiet and a noisy fleet.
    """
    floor = min(c[0] for c in candidates)
    span = max(base_loss - floor, 1e-12 * base_loss)
    return sorted(candidates, key=lambda c: ((c[0] - floor) / span + penalty * c[1], c[1]))


def _noise_model(real: np.ndarray, exp: np.ndarray) -> tuple[float, float]:
    """Return (phi_1, phi_2): the leaf noise read as var = phi_1 x exp (Poisson-like counts, e.g.
    failures) and as var = phi_2 x exp^2 (a relative forecast error, e.g. step times or traffic).

    Each is the median over the leaves of (real - exp)^2 / exp^p divided by 0.4549 (the median of a
    chi-square with one degree of freedom), so the few leaves under a cause barely move it.
    """
    ok = exp > 0
    if ok.sum() < 3:
        return 1.0, 0.0
    e, r2 = exp[ok], (real[ok] - exp[ok]) ** 2
    return float(np.median(r2 / e)) / 0.4549, float(np.median(r2 / e ** 2)) / 0.4549


def _element_z(real: np.ndarray, exp: np.ndarray, mask: np.ndarray, sign: float, noise: tuple[float, float]) -> float:
    """Return the one-sided z of an element's total deviation against the leaf noise, the smaller
    under the two noise laws of ``_noise_model``: which law a measure follows is not known (counts,
    relative forecast errors, or both), and each one alone over-states some elements' significance
    (the Poisson law for elements of large leaves of a relative-error measure, and vice versa)."""
    dev = sign * float(real[mask].sum() - exp[mask].sum())
    e = np.abs(exp[mask])
    var = max(noise[0] * float(e.sum()), noise[1] * float((e ** 2).sum()))
    if var <= 0:
        return np.inf if dev > 0 else -np.inf
    return dev / np.sqrt(var)


def _consistent(real: np.ndarray, exp: np.ndarray, mask: np.ndarray, sign: float, noise: tuple[float, float]) -> bool:
    """Return whether at least half of an element's expectation sits on leaves that moved in the
    change's direction by more than one noise sigma (the stricter law of ``_element_z``): a fault
    moves its leaves, while a pooled deviation can come from one leaf's outlier (RiskLoc's "high
    risk": the anomalous share of an element's leaves, at least 0.5)."""
    e = np.abs(exp[mask])
    if e.sum() <= 0:
        return False
    sd = np.sqrt(np.maximum(noise[0] * e, noise[1] * e ** 2))
    moved = sign * (real[mask] - exp[mask]) > sd
    return float(e[moved].sum()) >= 0.5 * float(e.sum())


def _bonferroni_z(alpha: float, n_tests: int) -> float:
    """Return the one-sided z an element needs when ``n_tests`` elements were searched (Bonferroni)."""
    from statistics import NormalDist  # the standard library's: importing scipy.stats costs ~1 s

    return -NormalDist().inv_cdf(alpha / max(n_tests, 1))


def _candidates(attrs, enc, cuboids, real, expected, weight, sign, max_depth, max_elements) -> list[tuple]:
    """Return [(loss, pairs, cuboid, element indices)]: for each cuboid of up to ``max_depth``
    attributes, the 1..``max_elements`` most surprising elements moving in the change's direction."""
    out = []
    for depth in range(1, min(max_depth, len(attrs)) + 1):
        for cuboid in itertools.combinations(attrs, depth):
            if cuboid not in cuboids:
                keys = np.stack([enc[a][1] for a in cuboid], axis=1)
                uniq, codes = np.unique(keys, axis=0, return_inverse=True)
                cuboids[cuboid] = (codes.ravel(), uniq)
            codes, uniq = cuboids[cuboid]
            m = len(uniq)
            agg_real = np.bincount(codes, real, m)
            agg_exp = np.bincount(codes, expected, m)
            dev = (agg_real - agg_exp) * sign
            # rank elements by how surprising they are: deviation relative to the Poisson-like
            # scale of their expectation (counts) or their size (continuous measures)
            score = dev / np.sqrt(np.abs(agg_exp) + 1.0)
            order = [int(i) for i in np.argsort(-score) if dev[i] > 0][:max_elements]
            for k in range(1, len(order) + 1):
                loss = _model_loss(real, expected, weight, _labels(codes, order[:k]))
                out.append((loss, depth * k, cuboid, order[:k]))
    return out


def cause_key_of(attrs: dict) -> str:
    """Return a cause as the canonical sorted "attr=value&attr=value" string."""
    return "&".join(sorted(f"{k}={v}" for k, v in attrs.items()))


def _parsimony(cuboid: tuple, elems: list[int], cuboids: dict, real, expected, weight, sign: float, z_crit: float,
               min_ratio: float):
    """Replace the cause by its parent (one attribute fewer) unless the child explains significantly more.

    The child (more specific) keeps its place only when, against every parent, the leaves it
    leaves out clearly did not share the change: pooled, ``child_z`` >= z_crit, and typically,
    the median sibling sub-population moved less than ``min_ratio`` of the child's change
    (``siblings_share``). Otherwise the parent
    with the smallest loss replaces it, so a dominant value of another attribute is never
    appended by default. Returns (cuboid, elements, loss) of the description kept.
    """
    loss = _model_loss(real, expected, weight, _labels(cuboids[cuboid][0], elems))
    while len(cuboid) > 1:
        codes, uniq = cuboids[cuboid]
        child = np.isin(codes, elems)
        disp = _dispersion(real, expected, ~child)
        best = None
        for drop in range(len(cuboid)):
            pc = tuple(a for j, a in enumerate(cuboid) if j != drop)
            p_codes, p_uniq = cuboids[pc]
            keep = [j for j in range(len(cuboid)) if j != drop]
            wanted = {tuple(uniq[i][keep]) for i in elems}
            p_elems = [i for i, u in enumerate(map(tuple, p_uniq)) if u in wanted]
            parent = np.isin(p_codes, p_elems)
            shared = siblings_share(real, expected, weight, codes, parent, child, sign)
            if not shared >= min_ratio and child_z(real, expected, weight, parent, child, sign, disp,
                                                   min_ratio) >= z_crit:
                continue  # the leaves the child leaves out clearly did not share the change
            p_loss = _model_loss(real, expected, weight, _labels(p_codes, p_elems))
            if best is None or p_loss < best[2]:
                best = (pc, p_elems, p_loss)
        if best is None:
            break
        cuboid, elems, loss = best
    return cuboid, elems, loss


@dataclass(kw_only=True)
class LeafTable:
    """One row per leaf at the change: attribute values, the numerator now and expected, the denominator."""

    leaves: dict[str, np.ndarray]
    real: np.ndarray
    expected: np.ndarray
    real_b: np.ndarray | None = None


def localize_rows(columns: dict[str, np.ndarray], time_col: str, measure: str, at=None, per: str | None = None,
                  attrs: list[str] | None = None, history: int | None = 4, before: tuple | None = None,
                  after: tuple | None = None, **params) -> Localization:
    """Localise a change in a table of one row per leaf and time (``leaf_table``, then ``localize``).

    ``params`` go to ``localize`` (LocalizeOptions fields, or ``options=``).
    """
    t = leaf_table(columns, time_col, measure, at=at, per=per, attrs=attrs, history=history, before=before, after=after)
    return localize(t.leaves, t.real, t.expected, real_b=t.real_b, **params)


def leaf_table(columns: dict[str, np.ndarray], time_col: str, measure: str, at=None, per: str | None = None,
               attrs: list[str] | None = None, history: int | None = 4, before: tuple | None = None,
               after: tuple | None = None) -> LeafTable:
    """Return the leaves of a table of one row per leaf and time, with their values now and expected.

    ``columns``: column name -> array. The measure is ``measure`` (or the ratio measure/per).
    Either ``at``: the changed time, with the rows before it as history (the last ``history``
    times: 4 by default, as RobustSpot; None = all); or two windows ``before=(t0, t1)`` and ``after=(t2, t3)`` (inclusive).
    Each leaf's value in a window is its mean over the window's rows. ``attrs``: attribute
    columns (default: every other column).
    """
    for c in [time_col, measure] + ([per] if per else []):
        if c not in columns:
            raise TrainperfError(f"localize: no column {c!r} (columns: {', '.join(columns)})")
    attrs = attrs or [c for c in columns if c not in (time_col, measure, per)]
    if not attrs:
        raise TrainperfError("localize: no attribute columns besides time and measure")
    missing = [a for a in attrs if a not in columns]
    if missing:
        raise TrainperfError(f"localize: no attribute column {missing[0]!r}")
    t = np.asarray(columns[time_col])
    numeric_time = np.issubdtype(t.dtype, np.number)

    def as_time(v):
        if not numeric_time:
            return str(v)
        try:
            return float(v)
        except (TypeError, ValueError):
            raise TrainperfError(f"localize: time {v!r} is not a number like the {time_col!r} column") from None

    if not numeric_time:
        t = t.astype(str)
    if at is not None:
        at = as_time(at)
        now = t == at
        if not now.any():
            raise TrainperfError(f"localize: no rows at {time_col} = {at}")
        past_times = np.unique(t[t < at])
        if history:
            past_times = past_times[-history:]
        past = np.isin(t, past_times)
    elif before is not None and after is not None:
        b0, b1, a0, a1 = (as_time(v) for v in (*before, *after))
        past, now = (t >= b0) & (t <= b1), (t >= a0) & (t <= a1)
        past_times = np.unique(t[past])
        if not now.any():
            raise TrainperfError(f"localize: no rows in the window {time_col} {a0}..{a1}")
    else:
        raise TrainperfError("localize: give the changed time (--at) or two windows")
    if not past.any():
        raise TrainperfError(f"localize: no rows before the change in {time_col!r} to forecast from")

    def numeric(name):
        try:
            v = np.asarray(columns[name], dtype=float)
        except (TypeError, ValueError):
            raise TrainperfError(f"localize: column {name!r} is not numeric") from None
        return np.nan_to_num(v)

    a_all = numeric(measure)
    b_all = numeric(per) if per else None
    keys = np.stack([np.asarray(columns[c]).astype(str) for c in attrs], axis=1)
    leaf_keys, leaf_idx = np.unique(keys, axis=0, return_inverse=True)
    leaf_idx = leaf_idx.ravel()
    m = len(leaf_keys)
    # a leaf's value in a window: the sum over its rows / the number of distinct times it has rows
    def window_mean(mask, v):
        times = np.unique(np.stack([leaf_idx[mask], np.unique(t[mask], return_inverse=True)[1].ravel()]), axis=1)
        n_times = np.maximum(np.bincount(times[0], minlength=m), 1)
        return np.bincount(leaf_idx[mask], v[mask], m) / n_times

    real_a, pred_a = window_mean(now, a_all), window_mean(past, a_all)
    if b_all is not None:
        real_b, pred_b = window_mean(now, b_all), window_mean(past, b_all)
    else:
        real_b = pred_b = None
    has_hist = np.bincount(leaf_idx[past], minlength=m) > 0
    pred_a, pred_b = _fill_new_leaves(leaf_keys, has_hist, pred_a, pred_b, keys[past], a_all[past],
                                      None if b_all is None else b_all[past])
    exp_a = expected_values(real_a, pred_a, real_b, pred_b)
    present = np.bincount(leaf_idx[now], minlength=m) > 0  # leaves observed at the change
    leaves = {a: leaf_keys[present, j] for j, a in enumerate(attrs)}
    rb = None if real_b is None else real_b[present]
    return LeafTable(leaves=leaves, real=real_a[present], expected=exp_a[present], real_b=rb)


def _fill_new_leaves(leaf_keys, has_hist, pred_a, pred_b, past_keys, past_a, past_b):
    """Give each leaf without history the history of its nearest ancestor (fewest attributes dropped).

    A host that just moved to a new NCCL has no history as (host, new NCCL); as (host) it has.
    When several ancestors at the same distance have history, their rows are pooled. Returns new
    (pred_a, pred_b): the ancestor's mean per row (fundamental) or its ratio with pred_b = 1 (derived).
    """
    new = np.flatnonzero(~has_hist)
    if len(new) == 0 or len(past_keys) == 0:
        return pred_a, pred_b
    pred_a = pred_a.copy()
    pred_b = None if pred_b is None else pred_b.copy()
    den = np.ones(len(past_a)) if past_b is None else past_b
    n_attr = leaf_keys.shape[1]
    cache: dict = {}

    def groups(subset):
        if subset not in cache:
            acc: dict = {}
            for row, a, b in zip(map(tuple, past_keys[:, list(subset)]), past_a, den):
                s = acc.setdefault(row, [0.0, 0.0])
                s[0] += a
                s[1] += b
            cache[subset] = acc
        return cache[subset]

    for i in new:
        for drop in range(1, n_attr + 1):
            sa = sb = 0.0
            for subset in itertools.combinations(range(n_attr), n_attr - drop):
                hit = groups(subset).get(tuple(leaf_keys[i, list(subset)]))
                if hit and hit[1] > 0:
                    sa, sb = sa + hit[0], sb + hit[1]
            if sb > 0:
                pred_a[i] = sa / sb
                if pred_b is not None:
                    pred_b[i] = 1.0
                break
    return pred_a, pred_b


def read_csv_columns(path: str) -> dict[str, np.ndarray]:
    """Return the columns of a CSV file as numpy arrays; raise TrainperfError when unreadable."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(path)
    except FileNotFoundError:
        raise TrainperfError(f"{path}: no such file") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise TrainperfError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    if table.num_rows == 0:
        raise TrainperfError(f"{path}: no rows")
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
