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
Elements are searched in the change's direction: the fleet total's, unless the most significant
element moved the other way and passes the significance bound on its own (``_direction``): the
total also sums every leaf's forecast error, which can outweigh a fault in a small sub-population.

Parsimony, one test in both directions (``_child_explains_more``): a more specific combination
replaces its parent only when it explains significantly more of the change: at most half of the parent's
sub-populations along the extra attribute shared it (each counted once, the child's own counted as
moved; "shared": at least ``parsimony_ratio`` of the child's change per unit of weight), and the
leaves it leaves out, pooled, clearly did not (one-sided z >= ``parsimony_z``). So a chosen cause
climbs to its parent unless refuted (a dominant value of another attribute is never appended by
default) and descends to a child the search's penalty passed over when the child passes (``_descend``),
again until neither direction moves it (``_stable_description``); a child must be significant to
replace its parent, and a significant cause's parent must be too.
Sets of siblings: when several children of one parent changed, found in one round or one by one,
they are tested together (``_sibling_sets``): the parent is the cause when most of its
sub-populations moved, the children when one or a few explain it.

The first answer is the best-ranked candidate that holds a significant element (``_first_with_fault``):
the L1 loss, in the leaves' own units, can rank a large leaf's forecast error above a fault. Its cuboid
is the search's choice, its elements the test's (``_widen_first``): every significant element among the
cuboid's most surprising, each added one holding its own description and moving most of its leaves.

Several faults (RiskLoc, Kalander 2022: iterative removal): the leaves of the causes found are
set aside and the search runs again on the rest, so a second fault of another size or in another
cuboid is found by its own evidence. Every cause element must be significant against the leaf
noise: one-sided z >= the Bonferroni bound for ``alpha`` over all elements searched (Student's t
when the noise is read on few leaves), z the score test of a change that scales the element's
leaves, each leaf weighted by expectation / variance (``_element_z``), under the noise law
var = phi_1 x exp + phi_2 x exp^2 (Poisson-like counts plus a relative forecast error) fitted
jointly on the leaves outside the causes; and relevant: at least ``min_share`` of the total change
(RiskLoc's 2%). A further fault must also move most of its leaves, each weighed as the test weighs
it (``_consistent``, RiskLoc's "risk"); at the end every cause must still be significant on the
leaves no other cause claims (``_own_evidence``). When not even the first element is significant,
it is still given as the best guess, "not confident".
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
    share: float  # share of the total change this element explains (0..1, may exceed 1; < 0: against the total)
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
    of the four synthetic sets, "maximin", with the RS incidents left out and scored last as the
    held-out check; ``alpha`` and ``min_share``: stated rules, not fitted; docs/benchmarks.md).

    ``max_depth``: most attributes in one combination; ``max_elements``: most elements in one
    cause set; ``penalty``: the fraction of the deviation each attribute=value pair must explain
    (prefers general causes); ``parsimony_z``, ``parsimony_ratio``: a more specific combination
    replaces its parent only when at most half of the parent's sub-populations moved by
    ``parsimony_ratio`` of its change and the leaves it leaves out clearly moved less than that
    (``child_z`` at least this one-sided z; 1.645: p < 0.05);
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


_NO_NOISE = 1e-300  # the variance read where every leaf matched its forecast: a floor, so z stays finite


def _dispersion(real: np.ndarray, exp: np.ndarray, outside: np.ndarray) -> float:
    """Noise variance per unit of expectation, from the leaves outside the cause (Poisson-like
    counts: ~1; continuous measures: their own scale): median of (real - exp)^2 / exp over those
    leaves, divided by 0.4549 (the median of a chi-square with one degree of freedom); their mean
    when the median is 0 (most leaves exactly on forecast). Fewer than 3 leaves: 1 (Poisson, assumed).

    Leaves that all match their forecast: a count (every value a whole number: failures) still has
    Poisson noise, 1; a continuous measure has none (a tiny floor). Scale 1 in the units of a sum
    (5e5 requests a minute) made a clean child's untouched siblings (119 expected, 25% of the
    child's change = 6) look like noise (z 0.5), so the parsimony test climbed from the true
    cause to its parent (synthetic "uneven", 2026-12-02).
    """
    ok = outside & (np.abs(exp) > 0)
    if ok.sum() < 3:
        return 1.0
    r = (real[ok] - exp[ok]) ** 2 / np.abs(exp[ok])
    d = float(np.median(r)) / 0.4549
    if d > 0:
        return d
    counts = bool(np.all(real[ok] == np.round(real[ok])))
    return float(np.mean(r)) or (1.0 if counts else _NO_NOISE)


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


def moved_fraction(real: np.ndarray, exp: np.ndarray, weight: np.ndarray, codes: np.ndarray, parent: np.ndarray,
                   child: np.ndarray, sign: float, min_ratio: float) -> float:
    """Return the fraction of the parent's sub-populations that shared the change: the elements of the
    child's cuboid inside ``parent`` (each counted once, whatever its traffic), the child's own counted
    as moved, a sibling when its change per unit of weight is at least ``min_ratio`` of the child's
    (nan: no siblings, or the child did not move).

    More than half moved: the parent is the cause, a fault that hit its sub-populations unequally
    ("several children of one parent changed"); the child set's own members count, so children found
    one by one cannot make each other's siblings look still. A dominant value that carries most of
    the change cannot hide that the other values of its attribute moved too (``child_z`` pools them).
    """
    sib = parent & ~child
    w_c = float(weight[child].sum())
    dev_c = sign * float(real[child].sum() - exp[child].sum())
    if not sib.any() or w_c <= 0 or dev_c <= 0:
        return float("nan")
    m = int(codes[parent].max()) + 1
    w = np.bincount(codes[sib], weight[sib], m)
    dev = sign * np.bincount(codes[sib], real[sib] - exp[sib], m)
    ok = w > 0
    n_child = len(np.unique(codes[child]))
    moved = int((dev[ok] / w[ok] >= min_ratio * dev_c / w_c).sum())
    return (n_child + moved) / (n_child + int(ok.sum()))


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
    enc = {a: np.unique(np.asarray(leaves[a]).astype(str), return_inverse=True) for a in attrs}
    cuboids: dict = {}  # cuboid -> (element code per leaf, unique element keys)
    sign = _direction(attrs, enc, cuboids, real, expected, max(o.max_depth for o in options),
                      min(o.alpha for o in options))
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
        # every element searched (Bonferroni): the cuboids of up to max_depth attributes
        n_tests = sum(len(u) for cb, (_, u) in cuboids.items() if len(cb) <= opts.max_depth)
        found: list[tuple[tuple, list[int]]] = []
        # the first round's candidate: the best-ranked one that holds a significant element (the search's
        # loss is in the leaves' own units, where a large leaf's forecast error can outrank a fault)
        ranked, verdict = _first_with_fault(_pick(searched[key], base_loss, opts.penalty), cuboids, real, expected,
                                            active, sign, n_tests, total_dev, opts)
        if verdict[0]:  # a fault: its cuboid's other faults are the test's to name, not the penalty's
            ranked, verdict = _widen_first(ranked, verdict, cuboids, real, expected, weight, active, sign, n_tests,
                                           total_dev, opts)
        while True:
            cuboid, elems = ranked[0][2], ranked[0][3]
            r_real, r_exp, r_w = (np.where(active, v, 0.0) for v in (real, expected, weight))
            # significance first, so the parsimony tests see only the candidate's real faults (a noise
            # element in the set adds its parent's leaves to the siblings); none: the likeliest one
            pre, zs, law = verdict or _significant(cuboids[cuboid][0], elems, r_real, r_exp, active, sign, n_tests,
                                                   total_dev, opts)
            verdict = None  # the first round's, judged while choosing its candidate
            tested = (cuboid, elems)
            cuboid, elems = _stable_description(cuboid, pre or [elems[int(np.argmax(zs))]], ranked, cuboids, r_real,
                                                r_exp, r_w, sign, opts, law, bool(pre))
            codes = cuboids[cuboid][0]
            if pre == tested[1] and (cuboid, elems) == tested:  # all passed and the tests kept them: verdict stands
                passed, noise = elems, law[0]
            else:  # a description with other elements (other leaves, other noise outside them): tested once
                passed, _, (noise, _) = _significant(codes, elems, r_real, r_exp, active, sign, n_tests, total_dev,
                                                     opts)
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
            round_key = (key, active.tobytes())  # settings that set aside the same leaves share the search
            if round_key not in searched:
                searched[round_key] = (_candidates(attrs, enc, cuboids, r_real, r_exp, r_w, sign, *key)
                                       if r_base > 0 else [])
            cands = searched[round_key]
            if not cands:
                break
            ranked = _pick(cands, r_base, opts.penalty)
        found = _sibling_sets(found, cuboids, real, expected, weight, sign, opts)
        if significant:
            found = _own_evidence(found, cuboids, real, expected, sign, n_tests, total_dev, opts)
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


def cause_significance(leaves: dict[str, np.ndarray], real: np.ndarray, expected: np.ndarray, causes: list[dict],
                       options: LocalizeOptions | None = None) -> tuple[list[float], float]:
    """Return (per cause its signed z, positive when it rose; the bound a cause element must reach)
    as ``localize`` judges an element (``_element_z``; Bonferroni over every element of every cuboid
    of up to ``max_depth`` attributes, ``alpha``), the noise law read on the leaves outside every
    one of ``causes``. For benchmarks: how visible given causes (the true ones) are to the test."""
    opts = options or LocalizeOptions()
    real, expected = np.asarray(real, float), np.asarray(expected, float)
    attrs = list(leaves)
    enc = {a: np.unique(np.asarray(leaves[a]).astype(str), return_inverse=True) for a in attrs}
    cuboids: dict = {}
    n_tests = sum(len(_cuboid(cb, enc, cuboids)[1]) for depth in range(1, min(opts.max_depth, len(attrs)) + 1)
                  for cb in itertools.combinations(attrs, depth))
    masks = [np.all([np.asarray(leaves[a]).astype(str) == str(v) for a, v in c.items()], axis=0) for c in causes]
    outside = ~np.any(masks, axis=0) if masks else np.ones(len(real), bool)
    noise = _noise_model(real[outside], expected[outside])
    return [_element_z(real, expected, m, 1.0, noise) for m in masks], _bonferroni_z(opts.alpha, n_tests, noise[2])


def _first_with_fault(ranked: list[tuple], cuboids: dict, real, exp, active: np.ndarray, sign: float, n_tests: int,
                      total_dev: float, opts: LocalizeOptions) -> tuple[list[tuple], tuple]:
    """Return (the ranked candidates with the best-ranked one that holds a significant element moved
    first, its ``_significant`` verdict); unchanged when none does (the first stays, as the best guess,
    with its verdict).

    The search ranks by the L1 loss in the leaves' own units, where the forecast errors of large leaves
    can reduce the loss more than a fault elsewhere does; when the first candidate is that noise, nothing
    in it was significant and the answer was a best guess although a fault passed the bound ("uneven"
    seed 23, incident 45: failures at noise 20%, a0=v3 ranked first, the true a5=v3 at z 4.9 against a
    bound of 4.6). The bound already counts every element of every cuboid searched (Bonferroni), so
    looking past the first candidate adds no test. First round only: in the later rounds (a new family
    of tests on the leaves left each time) the same rule added 3-15 false causes on the "derived" set
    (docs/benchmarks.md).
    """
    first = None
    for k, cand in enumerate(ranked):
        verdict = _significant(cuboids[cand[2]][0], cand[3], real, exp, active, sign, n_tests, total_dev, opts)
        first = first or verdict
        if verdict[0]:
            return [cand] + ranked[:k] + ranked[k + 1:], verdict
    return ranked, first


def _widen_first(ranked: list[tuple], verdict: tuple, cuboids: dict, real, exp, weight, active: np.ndarray,
                 sign: float, n_tests: int, total_dev: float, opts: LocalizeOptions) -> tuple[list[tuple], tuple]:
    """Return (ranked, verdict) with the first round's candidate, which holds a fault, widened to the
    faults of its cuboid that the search ranked: the cuboid's widest candidate (its ``max_elements``
    most surprising elements), the significant ones kept (``_significant``), each added element only
    when it holds its place as iterative removal would judge it; unchanged when none is added.

    The search's penalty per attribute=value pair decided how many elements of the cuboid the answer
    held, so a second fault of the same cuboid that did not pay for its pair was left to a later round,
    whose first candidate can be a part of it or noise ("uneven" seed 3 #82: a3=v0 chosen alone, a3=v3
    then named as a1=v8 & a3=v3 & a4=v5). The Bonferroni bound already counts every element of every
    cuboid searched, so the test, not the penalty, names the cuboid's faults.

    An added element must (1) keep its own description with the other elements' leaves set aside (the
    parsimony climb, ``_parsimony``, does not move it to a parent): a part of a fault of a more general
    cuboid (a0=v3 & a4=v4 under the layer-1 fault a4=v4) is left to that fault's own round, where a
    widened set of such parts climbed together to the wrong parent ("riskloc" seed 4 #8: five true
    causes, two found); and (2) move most of its leaves (``_consistent``, RiskLoc's risk, as every
    further fault must): the parent of another cuboid's faults (a1=v9 & a3=v4 over a1=v9 & a2=v2 & a3=v4
    and a1=v9 & a2=v3 & a3=v4, "riskloc" #7) moved only on their leaves. Unguarded, riskloc fell
    0.866 -> 0.803 (seed 4); with (2) alone 0.855; with both 0.872 (docs/benchmarks.md).
    """
    cuboid, chosen = ranked[0][2], ranked[0][3]
    wide = max((c for c in ranked if c[2] == cuboid), key=lambda c: len(c[3]))
    if len(wide[3]) == len(chosen):  # no other element of the cuboid moved in the change's direction
        return ranked, verdict
    codes = cuboids[cuboid][0]
    passed, _, law = _significant(codes, wide[3], real, exp, active, sign, n_tests, total_dev, opts)
    keep = []
    for e in passed:
        if e not in chosen:
            aside = active & ~np.isin(codes, [i for i in passed if i != e])
            a_real, a_exp, a_w = (np.where(aside, v, 0.0) for v in (real, exp, weight))
            held = _parsimony(cuboid, [e], cuboids, a_real, a_exp, a_w, sign, opts.parsimony_z, opts.parsimony_ratio,
                              significance=law)[:2] == (cuboid, [e])
            if not held or not _consistent(real, exp, (codes == e) & active, sign, law[0]):
                continue
        keep.append(e)
    if len(keep) <= len(verdict[0]):
        return ranked, verdict
    return [(wide[0], wide[1], cuboid, keep)] + ranked[1:], _significant(codes, keep, real, exp, active, sign,
                                                                          n_tests, total_dev, opts)


def _significant(codes: np.ndarray, elems: list[int], real, exp, active: np.ndarray, sign: float, n_tests: int,
                 total_dev: float, opts: LocalizeOptions) -> tuple[list[int], list[float], tuple]:
    """Return (the elements that are faults of their own, every element's z, (noise law, bound)):
    significant against the leaf noise (one-sided z >= the Bonferroni bound for ``opts.alpha`` over
    ``n_tests``) and relevant (at least ``opts.min_share`` of the total change); the noise is read on
    the active leaves outside the elements (``_noise_model``). The one place an element's verdict
    is computed: ``localize_each`` calls it once per description (the search's candidate, and the
    parsimony tests' description when they moved it)."""
    rest = active & ~np.isin(codes, elems)
    noise = _noise_model(real[rest], exp[rest])
    z_crit = _bonferroni_z(opts.alpha, n_tests, noise[2])
    zs = [_element_z(real, exp, codes == i, sign, noise) for i in elems]
    passed = [i for i, z in zip(elems, zs) if z >= z_crit
              and sign * float(real[codes == i].sum() - exp[codes == i].sum()) >= opts.min_share * abs(total_dev)]
    return passed, zs, (noise, z_crit)


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


def _sibling_sets(found: list, cuboids: dict, real, expected, weight, sign: float, opts: LocalizeOptions) -> list:
    """Return the causes found with each set of elements of one cuboid, gathered over all rounds,
    put to the parsimony test together (``_parsimony``): when several children of one parent changed,
    found one by one (the first round's siblings still held the later ones), the parent is the cause
    unless the set explains significantly more. The leaves of the causes in other cuboids are set aside.
    """
    by_cuboid: dict = {}
    for cb, el in found:
        by_cuboid.setdefault(cb, []).extend(el)
    out = [(cb, el) for cb, el in found]
    for cb, el in by_cuboid.items():
        if len(cb) < 2 or len(el) < 2:
            continue
        others = np.zeros(len(real), bool)
        for ocb, oel in out:
            if ocb != cb:
                others |= np.isin(cuboids[ocb][0], oel)
        r_real, r_exp, r_w = (np.where(others, 0.0, v) for v in (real, expected, weight))
        p_cb, p_el, _ = _parsimony(cb, list(el), cuboids, r_real, r_exp, r_w, sign, opts.parsimony_z,
                                   opts.parsimony_ratio)
        if p_cb != cb:
            out = _merge([(ocb, oel) for ocb, oel in out if ocb != cb], p_cb, p_el, cuboids)
    return out


def _own_evidence(found: list, cuboids: dict, real, expected, sign: float, n_tests: int, total_dev: float,
                  opts: LocalizeOptions) -> list:
    """Return the causes found less those not significant on their own evidence: each element's
    leaves that no other cause claims must still pass ``_significant``'s two rules (z >= the
    Bonferroni bound, noise read on the leaves outside every cause; share >= ``min_share``).
    The weakest failing element goes first, then the rest are tested again.

    Causes found in different rounds and cuboids can overlap: a description of the worst-hit part
    of a fault (a0=v1 & a1=v0 & a5=v3) found before the fault itself (a0=v1 & a3=v0 & a5=v3)
    keeps its place although the later cause explains its deviation (backward elimination, each
    cause tested given the others).
    """
    while True:
        flat = [(cb, i) for cb, el in found for i in el]
        if len(flat) < 2:
            return found
        masks = [cuboids[cb][0] == i for cb, i in flat]
        claimed = np.count_nonzero(masks, axis=0)
        noise = _noise_model(real[claimed == 0], expected[claimed == 0])
        z_crit = _bonferroni_z(opts.alpha, n_tests, noise[2])
        worst = None
        for k, m in enumerate(masks):
            own = m & (claimed == 1)
            z = _element_z(real, expected, own, sign, noise) if own.any() else -np.inf
            dev = sign * float(real[own].sum() - expected[own].sum())
            if (z < z_crit or dev < opts.min_share * abs(total_dev)) and (worst is None or z < worst[1]):
                worst = (k, z)
        if worst is None:
            return found
        gone = flat[worst[0]]
        found = [(cb, [i for i in el if (cb, i) != gone]) for cb, el in found]
        found = [(cb, el) for cb, el in found if el]


def _pick(candidates: list[tuple], base_loss: float, penalty: float) -> list[tuple]:
    """Return the candidates ranked by (loss - best loss) / (base loss - best loss) + penalty x pairs.

    The penalty is a fraction of the explainable deviation (base loss - the best candidate's loss),
    not of the whole L1, which noise dominates on many small leaves: the same penalty then means
    the same on a quiet and a noisy fleet.
    """
    floor = min(c[0] for c in candidates)
    span = max(base_loss - floor, 1e-12 * base_loss)
    return sorted(candidates, key=lambda c: ((c[0] - floor) / span + penalty * c[1], c[1]))


def _noise_model(real: np.ndarray, exp: np.ndarray) -> tuple[float, float, float]:
    """Return (phi_1, phi_2, dof) of the leaf noise law var = phi_1 x exp + phi_2 x exp^2: Poisson-like
    counts (failures: phi_1 ~ 1) plus a relative forecast error (step times, traffic: phi_2 = its
    squared relative sigma), the quasi-likelihood variance of a negative binomial, both >= 0.

    Fitted jointly, by iteratively reweighted least squares of (real - exp)^2 on exp and exp^2 (each
    leaf weighted by 1 / its variance, as the squared deviation of a normal has variance 2 var^2),
    three rounds from var = exp. A moment fit, not a median: the median of a small count's squared
    deviation is far below its variance (a leaf expecting 0.05 failures mostly shows 0), which
    under-reads the Poisson part of a sparse table. Each law fitted alone absorbs the other's part
    and over-states the noise of the elements it does not fit (the previous rule, the larger of two
    separate fits, left 37% of the "uneven" synthetic causes below the significance bound, 22% with
    the joint law; docs/benchmarks.md). Leaves of undiscovered faults inflate it: conservative.
    ``dof``: the degrees of freedom of the fit (leaves - 2); fewer than 3 leaves: the Poisson law
    (1, 0) is assumed, not read, dof infinite.
    """
    ok = exp > 0
    if ok.sum() < 3:
        return 1.0, 0.0, np.inf
    e, r2 = exp[ok], (real[ok] - exp[ok]) ** 2
    var = e.copy()
    for _ in range(3):
        coef = _nonneg_lsq(np.stack([e, e * e], axis=1) / var[:, None], r2 / var)
        var = np.maximum(coef[0] * e + coef[1] * e * e, 1e-12 * float(e.max()))
    return float(coef[0]), float(coef[1]), float(len(e) - 2)


def _nonneg_lsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Return the least-squares coefficients (2) of y on the two columns of x, each >= 0.

    Hand-written: with two columns the constrained optimum is the unconstrained one or a one-column
    fit, and scipy.optimize costs ~0.3 s to import for it.
    """
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    if (coef >= 0).all():
        return coef
    single = [np.array([max(float(x[:, 0] @ y) / max(float(x[:, 0] @ x[:, 0]), 1e-300), 0.0), 0.0]),
              np.array([0.0, max(float(x[:, 1] @ y) / max(float(x[:, 1] @ x[:, 1]), 1e-300), 0.0)])]
    return min(single, key=lambda c: float(((x @ c - y) ** 2).sum()))


def _element_z(real: np.ndarray, exp: np.ndarray, mask: np.ndarray, sign: float, noise: tuple[float, float]) -> float:
    """Return the one-sided z of an element's change against the leaf noise law of ``_noise_model``
    (var = phi_1 x exp + phi_2 x exp^2 per leaf): the score test of a shift that scales the element's
    leaves (each leaf expected to move in proportion to its expectation), each leaf's deviation
    weighted by expectation / variance = 1 / (phi_1 + phi_2 x exp):
    z = sum(w x dev) / sqrt(sum(w^2 x var)).

    The efficient (generalised least squares) test of that shift, where the plain sum of deviations
    over sqrt(sum of variances) lets the largest leaves' relative forecast error drown a change that
    all the others show: with a relative error (phi_2 > 0) a leaf 10x larger has 100x the variance
    and 10x the expected shift. Without a relative part (phi_2 = 0, Poisson-like counts) the weights
    are equal and it is that plain sum. On the "uneven" synthetic sums, 65 -> 75 of 90 true causes reach the
    Bonferroni bound, against 80 whose expected z knowing every leaf's true shift does (docs/benchmarks.md).
    No noise read (phi_1 = phi_2 = 0): +-inf by the direction of the element's deviation.
    """
    return sign * float(_shift_z(real[mask], exp[mask], np.zeros(int(mask.sum()), int), 1, noise)[0])


def _shift_z(real: np.ndarray, exp: np.ndarray, codes: np.ndarray, m: int, noise: tuple) -> np.ndarray:
    """Return per element (``codes``: element per leaf, ``m`` elements) the signed z of ``_element_z``
    (positive: the element rose); the one place it is computed (``_element_z``, ``_direction``)."""
    e = np.abs(exp)
    dev = np.bincount(codes, real - exp, m)
    phi1, phi2 = float(noise[0]), float(noise[1])
    if phi1 <= 0 and phi2 <= 0 or not (e > 0).any():
        return np.where(dev > 0, np.inf, np.where(dev < 0, -np.inf, 0.0))
    per_unit = phi1 + phi2 * e  # variance per unit of expectation
    # a leaf expecting 0 under a law with no Poisson part: floored as _noise_model floors the variance
    w = 1.0 / np.maximum(per_unit, 1e-12 * float(per_unit.max()))
    num = np.bincount(codes, w * (real - exp), m)
    var = np.bincount(codes, w * w * per_unit * e, m)
    z = np.divide(num, np.sqrt(var), out=np.zeros(m), where=var > 0)
    return np.where(var > 0, z, np.where(num > 0, np.inf, np.where(num < 0, -np.inf, 0.0)))


def _consistent(real: np.ndarray, exp: np.ndarray, mask: np.ndarray, sign: float, noise: tuple[float, float]) -> bool:
    """Return whether at least half of an element's evidence sits on leaves that moved in the
    change's direction by more than one noise sigma (the law of ``_noise_model``): a fault
    moves its leaves, while a pooled deviation can come from one leaf's outlier (RiskLoc's "high
    risk": the anomalous share of an element's leaves, at least 0.5).

    Each leaf counts by its weight in the significance test (``_element_z``): its information
    exp / (phi_1 + phi_2 x exp), the share of the test's variance it carries. Counted by expectation,
    one large leaf a fault hardly touched (a sub-population with a low susceptibility) outvoted the
    many that moved, although the test that found the element gave it little weight: on the
    synthetic sets riskloc 0.857 / 0.847 / 0.860 -> 0.866 / 0.849 / 0.855, RS 0.658 -> 0.673
    (docs/benchmarks.md). Without a relative noise part (phi_2 = 0) it is the expectation."""
    e = np.abs(exp[mask])
    if e.sum() <= 0:
        return False
    per_unit = noise[0] + noise[1] * e  # variance per unit of expectation
    sd = np.sqrt(per_unit * e)
    moved = sign * (real[mask] - exp[mask]) > sd
    info = e / np.maximum(per_unit, 1e-300) if per_unit.max() > 0 else e
    return float(info[moved].sum()) >= 0.5 * float(info.sum())


def _bonferroni_z(alpha: float, n_tests: int, dof: float = np.inf) -> float:
    """Return the one-sided z an element needs when ``n_tests`` elements were searched (Bonferroni):
    the normal's quantile, or Student's t with ``dof`` degrees of freedom when the noise law was read
    on few leaves (its own error then widens the tail: 12 leaves, 2 fitted parameters, 10 dof)."""
    if np.isfinite(dof):
        from scipy.special import stdtrit  # scipy.special, not scipy.stats: ~1 s less to import

        return float(stdtrit(max(dof, 1.0), 1 - alpha / max(n_tests, 1)))
    from statistics import NormalDist

    return -NormalDist().inv_cdf(alpha / max(n_tests, 1))


def _cuboid(attrs_of: tuple, enc: dict, cuboids: dict) -> tuple[np.ndarray, np.ndarray]:
    """Return (element code per leaf, unique element keys) of a cuboid, built once."""
    if attrs_of not in cuboids:
        keys = np.stack([enc[a][1] for a in attrs_of], axis=1)
        uniq, codes = np.unique(keys, axis=0, return_inverse=True)
        cuboids[attrs_of] = (codes.ravel(), uniq)
    return cuboids[attrs_of]


def _direction(attrs, enc, cuboids, real: np.ndarray, expected: np.ndarray, max_depth: int, alpha: float) -> float:
    """Return the direction of the change (+1 up, -1 down): the sign of the fleet's total deviation,
    unless the most significant element moved the other way and is itself significant (|z| against
    the noise law read on every leaf, ``_noise_model``, at least the Bonferroni bound for ``alpha``
    over every element of every cuboid of up to ``max_depth`` attributes).

    The total sums the forecast error of every leaf: on "uneven" synthetic incidents a fault whose
    rate rose (z +5.2 against a bound of 4.4) sat in a total that fell by noise (-2.9 failures), so
    the search looked only for elements that fell and gave a wrong best guess. An element that is
    not significant does not overrule the total (a noise element's z 3.0 against a fault that fell).
    """
    total = float(real.sum() - expected.sum())
    noise = _noise_model(real, expected)
    best, n_tests = (0.0, 0.0), 0
    for depth in range(1, min(max_depth, len(attrs)) + 1):
        for cb in itertools.combinations(attrs, depth):
            codes, uniq = _cuboid(cb, enc, cuboids)
            n_tests += len(uniq)
            z = _shift_z(real, expected, codes, len(uniq), noise)
            i = int(np.argmax(np.abs(z)))
            if abs(z[i]) > best[0]:
                best = (float(abs(z[i])), float(np.sign(z[i])))
    if best[1] and best[0] >= _bonferroni_z(alpha, n_tests, noise[2]):
        return best[1]
    return 1.0 if total >= 0 else -1.0


def _candidates(attrs, enc, cuboids, real, expected, weight, sign, max_depth, max_elements) -> list[tuple]:
    """Return [(loss, pairs, cuboid, element indices)]: for each cuboid of up to ``max_depth``
    attributes, the 1..``max_elements`` most surprising elements moving in the change's direction."""
    out = []
    for depth in range(1, min(max_depth, len(attrs)) + 1):
        for cuboid in itertools.combinations(attrs, depth):
            codes, uniq = _cuboid(cuboid, enc, cuboids)
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
               min_ratio: float, significance: tuple | None = None):
    """Replace the cause by its parent (one attribute fewer) unless the child explains significantly more.

    The child (more specific) keeps its place only when it explains more against every parent
    (``_child_explains_more``: at most half of the parent's sub-populations shared the change, and
    the leaves it leaves out, pooled, clearly did not). Otherwise the parent with the smallest loss
    replaces it, so a dominant value of another attribute is never appended by default.
    ``significance``: (noise law, bound) of a significant cause: a parent must be significant too
    (each element's z >= the bound), so a fault is never traded for a description the noise can
    explain. A child with no change of its own in the change's direction (on the leaves given: the
    sibling-set test sets the other causes' leaves aside) is kept as it is: there is no change for its
    parent to share and nothing for the test to weigh (``moved_fraction`` nan, ``child_z`` from the
    siblings alone), and a climb there replaced a found fault by a parent that contains it ("uneven"
    seed 23 #60: two parts of a2=v2 & a3=v0 & a4=v0 found first climbed to a3=v0, which swallowed the
    fault; ``_own_evidence`` drops such parts instead). Returns (cuboid, elements, loss) of the
    description kept.
    """
    loss = _model_loss(real, expected, weight, _labels(cuboids[cuboid][0], elems))
    while len(cuboid) > 1:
        codes, uniq = cuboids[cuboid]
        child = np.isin(codes, elems)
        if sign * float(real[child].sum() - expected[child].sum()) <= 0:
            break  # no change of its own: nothing the parent could share, nothing to test
        best = None
        for drop in range(len(cuboid)):
            pc = tuple(a for j, a in enumerate(cuboid) if j != drop)
            p_codes, p_uniq = cuboids[pc]
            keep = [j for j in range(len(cuboid)) if j != drop]
            wanted = {tuple(uniq[i][keep]) for i in elems}
            p_elems = [i for i, u in enumerate(map(tuple, p_uniq)) if u in wanted]
            parent = np.isin(p_codes, p_elems)
            if _child_explains_more(real, expected, weight, codes, parent, child, sign, z_crit, min_ratio):
                continue  # the leaves the child leaves out clearly did not share the change
            if significance and any(_element_z(real, expected, p_codes == i, sign, significance[0]) < significance[1]
                                    for i in p_elems):
                continue  # the parent would not be a significant fault: the child explains more
            p_loss = _model_loss(real, expected, weight, _labels(p_codes, p_elems))
            if best is None or p_loss < best[2]:
                best = (pc, p_elems, p_loss)
        if best is None:
            break
        cuboid, elems, loss = best
    return cuboid, elems, loss


def _child_explains_more(real, expected, weight, codes, parent, child, sign, z_crit: float, min_ratio: float) -> bool:
    """Return whether the child (a more specific cause) explains significantly more of the change than
    its parent: at most half of the parent's sub-populations shared the change (``moved_fraction``)
    and the leaves the child leaves out, pooled, clearly did not (``child_z`` >= ``z_crit``)."""
    if moved_fraction(real, expected, weight, codes, parent, child, sign, min_ratio) > 0.5:
        return False
    disp = _dispersion(real, expected, ~child)
    return child_z(real, expected, weight, parent, child, sign, disp, min_ratio) >= z_crit


def _stable_description(cuboid: tuple, elems: list[int], candidates: list[tuple], cuboids: dict, real, expected,
                        weight, sign: float, opts: LocalizeOptions, significance: tuple, significant: bool):
    """Return (cuboid, elements): the description the parsimony test keeps in both directions.

    Descend (``_descend``) then climb (``_parsimony``), again until neither moves it (or a
    description comes back: the test cannot choose, the last one stays). One pass stopped where a
    climb landed: a cause climbs from the worst-hit part of a fault (a1 & a2 & a3, the a3 value hit
    hardest) to a1 & a2 and is never tested against the true child a0 & a1 & a2 the search did not
    propose. At most 2 x ``max_depth`` passes (each moves by one attribute).
    ``significance``: (noise law, bound): a more specific description must be significant (its
    elements' z >= the bound), and, when the cause is ``significant``, so must a more general one.
    """
    seen = {(cuboid, tuple(sorted(elems)))}
    for _ in range(2 * opts.max_depth):
        cuboid, elems = _descend(cuboid, elems, candidates, cuboids, real, expected, weight, sign, opts.parsimony_z,
                                 opts.parsimony_ratio, significance)
        cuboid, elems, _ = _parsimony(cuboid, elems, cuboids, real, expected, weight, sign, opts.parsimony_z,
                                      opts.parsimony_ratio, significance=significance if significant else None)
        key = (cuboid, tuple(sorted(elems)))
        if key in seen:
            break
        seen.add(key)
    return cuboid, elems


def _descend(cuboid: tuple, elems: list[int], candidates: list[tuple], cuboids: dict, real, expected, weight,
             sign: float, z_crit: float, min_ratio: float, significance: tuple | None = None) -> tuple[tuple, list[int]]:
    """Replace the cause by a more specific candidate (one attribute more, each of its elements inside
    one of the cause's, every cause element keeping at least one) when that child explains
    significantly more (``_child_explains_more``), the child of least loss first, repeatedly.

    The search's penalty per attribute=value pair can pick a parent whose child fits almost as well;
    the parsimony rule is one test in both directions, so the test, not the penalty, decides.
    ``significance``: (noise law, bound): a child must be significant (each element's z >= the
    bound), as a significant cause's parent must be in ``_parsimony``: a description is made more
    specific only on evidence, never into the noise (a best guess that is itself not significant
    stays general).
    """
    while True:
        codes = cuboids[cuboid][0]
        parent = np.isin(codes, elems)
        best = None
        for loss, _, cb, el in candidates:
            if len(cb) != len(cuboid) + 1 or not set(cuboid) <= set(cb) or (best and loss >= best[0]):
                continue
            c_codes = cuboids[cb][0]
            child = np.isin(c_codes, el)
            if (child & ~parent).any() or len(np.unique(codes[child])) < len(elems):
                continue
            if significance and any(_element_z(real, expected, c_codes == i, sign, significance[0]) < significance[1]
                                    for i in el):
                continue  # not a significant fault: the more general description stays
            if _child_explains_more(real, expected, weight, c_codes, parent, child, sign, z_crit, min_ratio):
                best = (loss, cb, el)
        if best is None:
            return cuboid, elems
        cuboid, elems = best[1], list(best[2])


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
