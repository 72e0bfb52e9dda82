"""Synthetic multi-dimensional root-cause incidents, after the Squeeze and RiskLoc papers' designs.

Squeeze (Li et al., ISSRE 2019) and RiskLoc (Kalander, 2022) evaluate root-cause localisation
on incidents built from a table of leaves (full attribute combinations) with a forecast and a
real value per leaf, anomalies injected into the leaves under 1-3 root causes that sit in one
cuboid of layer 1-3 (a combination of 1-3 attributes), under increasing forecast noise, for
fundamental measures (a sum) and derived ones (a ratio of two sums). This module follows that
description with its own code and choices:

- attributes: ``n_attrs`` (4-6) with 3-12 values each; each value has a popularity (Zipf-like
  weights, so a few values dominate the traffic, as devices and CDNs do in real data); a leaf's
  size is the product of its values' popularities times a log-normal factor; only a random
  subset of the combinations exists (real tables are sparse).
- noise: the real value of a normal leaf is its forecast times (1 + N(0, noise)) (fundamental),
  or, for a derived measure (failures / requests), requests vary by that noise and failures are
  Poisson around requests x the leaf's historical failure rate.
- anomaly: 1-3 root causes, disjoint elements of one cuboid of layer 1-3, each covering at least
  1% of the total; every leaf under a cause moves by the cause's own magnitude (a sum by a factor
  of 1 +- U(0.2, 0.9); a failure rate by a factor of U(1.5, 4)), leaf by leaf with the same noise.
- uneven impact (our extension, set "uneven"): the papers' leaves under a cause all move by the
  same magnitude; a real fault hits the sub-populations of another attribute (devices, clients)
  unequally, some hardly at all. With ``uneven`` u, each value of one other attribute gets a
  susceptibility s ~ U(1 - u, 1) and its leaves under the cause move by 1 + (magnitude - 1) x s;
  the true cause is still the element (the place of the fault), not its worst-hit part.

- faults in several cuboids (set "riskloc", after RiskLoc's generator): 1-3 faults, each in its own
  cuboid of layer 1-3 with 1-3 elements (not overlapping an earlier fault's elements) and its own
  severity U(0.2, 1.0) + the noise level (so no fault hides in the noise); each leaf under a fault
  draws r ~ N(severity, U(0, 0.1)) and drops to (1 - r) of its forecast (r <= 0.95), or, upwards,
  rises to 1 / (1 - r); noise U(0, 0.25). A sum (RiskLoc's generator has fundamental measures only).

``Incident`` carries what ``trainperf.fleet.localize.localize`` takes, and the true causes, with
each leaf's noise-free change and noise variance: ``cause_visibility`` says from them how visible
each true cause is to the most powerful test there is (one that knows every leaf's change).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(kw_only=True)
class Incident:
    """One synthetic incident: leaves, real and expected numerators (and denominators), true causes."""

    leaves: dict[str, np.ndarray]  # attribute -> value per leaf (strings)
    real: np.ndarray  # numerator now (a sum, or failures)
    expected: np.ndarray  # numerator expected (forecast; derived: real_b x historical rate)
    real_b: np.ndarray | None  # denominator now (derived measures), else None
    causes: list[dict]  # [{"attr": "value", ...}, ...]
    setting: dict  # n_causes, layer, noise, derived
    # what the generator knows and a method cannot: per leaf, the faults' change of real - expected
    # without noise (the numerator's units) and the variance of real - expected its noise gives
    # (an oracle for how visible each cause is: ``cause_visibility``)
    shift: np.ndarray | None = None
    noise_var: np.ndarray | None = None


def _popularity(k: int, rng: np.random.Generator) -> np.ndarray:
    w = 1.0 / np.arange(1, k + 1) ** rng.uniform(0.5, 1.5)  # Zipf-like: the first value dominates
    return rng.permutation(w / w.sum())


def synthetic_incident(rng: np.random.Generator, *, n_causes: int | None = None, layer: int | None = None,
                       noise: float | None = None, derived: bool = False, n_leaves: int = 600,
                       uneven: float = 0.0) -> Incident:
    """Return one synthetic incident (see the module docstring); unset choices are drawn from ``rng``.

    ``n_causes`` 1-3, ``layer`` 1-3 (attributes per cause), ``noise``: relative forecast noise
    (0-0.2), ``derived``: failures / requests instead of a sum, ``n_leaves``: combinations drawn,
    ``uneven``: 0-1, how unequally the sub-populations under a cause are hit (0: all alike).
    """
    n_causes = int(rng.integers(1, 4)) if n_causes is None else n_causes
    layer = int(rng.integers(1, 4)) if layer is None else layer
    noise = float(rng.choice([0.0, 0.05, 0.1, 0.2])) if noise is None else noise
    for _ in range(100):
        inc = _try_incident(rng, n_causes, layer, noise, derived, n_leaves, uneven)
        if inc is not None:
            return inc
    raise RuntimeError("could not place the root causes")  # a bug: 100 draws always suffice in practice


def _leaf_table(rng: np.random.Generator, n_leaves: int) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Return (attribute names, values per attribute, value codes per leaf [leaf, attr], leaf sizes):
    4-6 attributes of 3-12 Zipf-popular values, ``n_leaves`` combinations drawn (duplicates merged),
    sizes = the product of the values' popularities x a log-normal factor, 5e5 in all."""
    n_attrs = int(rng.integers(4, 7))
    names = [f"a{i}" for i in range(n_attrs)]
    sizes = rng.integers(3, 13, n_attrs)
    pops = [_popularity(int(k), rng) for k in sizes]
    codes = np.unique(np.stack([rng.choice(int(k), size=n_leaves, p=p) for k, p in zip(sizes, pops)], axis=1), axis=0)
    size = np.prod([pops[j][codes[:, j]] for j in range(n_attrs)], axis=0) * rng.lognormal(0, 0.5, len(codes))
    return names, sizes, codes, 5e5 * size / size.sum()  # total per minute, as the RS incidents' requests (~5e5)


def _try_incident(rng, n_causes, layer, noise, derived, n_leaves, uneven) -> Incident | None:
    names, sizes, codes, size = _leaf_table(rng, n_leaves)
    n_attrs = len(names)
    # the root causes: disjoint elements of one cuboid, each at least 1% of the total
    cuboid = sorted(rng.choice(n_attrs, size=layer, replace=False).tolist())
    elems, inv = np.unique(codes[:, cuboid], axis=0, return_inverse=True)
    inv = inv.ravel()
    share = np.bincount(inv, size, len(elems)) / size.sum()
    eligible = np.flatnonzero((share >= 0.01) & (share <= 0.5))
    if len(eligible) < n_causes:
        return None
    chosen = rng.choice(eligible, size=n_causes, replace=False)
    up = rng.random() < 0.5 or derived  # a derived measure: failure rates rise
    factor = np.ones(len(codes))
    others = [j for j in range(n_attrs) if j not in cuboid]
    for e in chosen:
        mag = rng.uniform(1.5, 4.0) if derived else 1 + (1 if up else -1) * rng.uniform(0.2, 0.9)
        under = inv == e
        factor[under] = mag
        if uneven > 0:
            # uneven impact: the sub-populations of one other attribute (devices, clients) are hit
            # to different degrees, each keeping a susceptibility s ~ U(1 - uneven, 1) of the change
            j = int(rng.choice(others))
            sus = 1 - uneven * rng.random(int(sizes[j]))
            factor[under] = 1 + (mag - 1) * sus[codes[under, j]]
    causes = [{names[j]: f"v{elems[e][i]}" for i, j in enumerate(cuboid)} for e in chosen]
    leaves = {names[j]: np.array([f"v{c}" for c in codes[:, j]]) for j in range(n_attrs)}
    jitter = 1 + noise * rng.standard_normal(len(codes))
    if not derived:
        real = np.maximum(size * factor * jitter, 0.0)
        return Incident(leaves=leaves, real=real, expected=size, real_b=None, causes=causes,
                        setting={"n_causes": n_causes, "layer": layer, "noise": noise, "derived": False, "uneven": uneven},
                        shift=size * (factor - 1), noise_var=(noise * size * factor) ** 2)
    rate = 0.02 * rng.lognormal(0, 0.5, len(codes))  # historical failure rate per leaf (RS: ~2%)
    requests = np.maximum(np.round(size * jitter), 1.0)
    failures = rng.poisson(requests * np.minimum(rate * factor, 1.0)).astype(float)
    rate_hist = rate * np.maximum(1 + noise * rng.standard_normal(len(codes)), 0.1)  # the forecast's own error
    # given the requests: Poisson failures around the faulty rate, and the forecast rate's own error
    faulty = requests * np.minimum(rate * factor, 1.0)
    return Incident(leaves=leaves, real=failures, expected=requests * rate_hist, real_b=requests, causes=causes,
                    setting={"n_causes": n_causes, "layer": layer, "noise": noise, "derived": True, "uneven": uneven},
                    shift=faulty - requests * rate, noise_var=faulty + (requests * rate * noise) ** 2)


def riskloc_incident(rng: np.random.Generator, *, n_faults: int | None = None, n_leaves: int = 600) -> Incident:
    """Return one incident with 1-3 faults in different cuboids (the "riskloc" set of the module
    docstring); unset choices are drawn from ``rng``."""
    n_faults = int(rng.integers(1, 4)) if n_faults is None else n_faults
    for _ in range(100):
        names, sizes, codes, size = _leaf_table(rng, n_leaves)
        n_attrs = len(names)
        noise = float(rng.uniform(0, 0.25))
        up = rng.random() < 0.5
        factor = np.ones(len(codes))
        under_any = np.zeros(len(codes), bool)
        causes, used = [], []
        for _f in range(n_faults):
            layer = int(rng.integers(1, 4))
            cuboid = sorted(rng.choice(n_attrs, size=layer, replace=False).tolist())
            if cuboid in used:
                break
            elems, inv = np.unique(codes[:, cuboid], axis=0, return_inverse=True)
            inv = inv.ravel()
            free = np.bincount(inv, ~under_any, len(elems)) == np.bincount(inv, minlength=len(elems))
            share = np.bincount(inv, size, len(elems)) / size.sum()
            eligible = np.flatnonzero(free & (share >= 0.01) & (share <= 0.5))
            k = int(rng.integers(1, 4))
            if len(eligible) < k:
                break
            chosen = rng.choice(eligible, size=k, replace=False)
            severity, spread = rng.uniform(0.2, 1.0) + noise, rng.uniform(0, 0.1)
            under = np.isin(inv, chosen)
            r = np.minimum(rng.normal(severity, spread, under.sum()), 0.95)
            factor[under] = 1 / (1 - r) if up else 1 - r
            under_any |= under
            used.append(cuboid)
            causes += [{names[j]: f"v{elems[e][i]}" for i, j in enumerate(cuboid)} for e in chosen]
        else:
            leaves = {names[j]: np.array([f"v{c}" for c in codes[:, j]]) for j in range(n_attrs)}
            real = np.maximum(size * factor * (1 + noise * rng.standard_normal(len(codes))), 0.0)
            return Incident(leaves=leaves, real=real, expected=size, real_b=None, causes=causes,
                            setting={"n_causes": len(causes), "layer": len(used[0]), "noise": noise, "derived": False,
                                     "uneven": 0.0, "n_faults": n_faults},
                            shift=size * (factor - 1), noise_var=(noise * size * factor) ** 2)
    raise RuntimeError("could not place the faults")  # a bug: 100 draws always suffice in practice


def incident_set(name: str, n: int, seed: int) -> list[Incident]:
    """Return ``n`` seeded incidents of one named set: "fundamental" (sums, noise 0-0.2), "derived"
    (failures / requests, noise 0-0.2), or "uneven" (alternately both, with uneven impact 1); layers
    and cause counts 1-3 drawn evenly; or "riskloc" (1-3 faults in different cuboids, ``riskloc_incident``)."""
    if name not in ("fundamental", "derived", "uneven", "riskloc"):
        raise ValueError(f"unknown incident set {name!r}")
    rng = np.random.default_rng(seed)
    if name == "riskloc":
        return [riskloc_incident(rng, n_faults=1 + i % 3) for i in range(n)]
    if name == "uneven":
        return [synthetic_incident(rng, n_causes=1 + i % 3, layer=1 + (i // 3) % 3, derived=i % 2 == 1, uneven=1.0)
                for i in range(n)]
    return [synthetic_incident(rng, n_causes=1 + i % 3, layer=1 + (i // 3) % 3, derived=name == "derived")
            for i in range(n)]


def cause_visibility(inc: Incident) -> list[float]:
    """Return per true cause of ``inc`` the z the most powerful test of it would expect: a test that
    knows every leaf's change (``shift``) and noise variance (``noise_var``) weights each leaf by
    shift / variance, and its z then has mean sqrt(sum(shift^2 / variance)) over the cause's leaves
    (its noncentrality; inf without noise). Below a significance bound, even that test finds the
    cause less than half the time: the cause is within the noise for any method at that
    false-alarm rate."""
    if inc.shift is None or inc.noise_var is None:
        raise ValueError("incident without the generator's shift and noise variance")
    out = []
    for cause in inc.causes:
        mask = np.all([inc.leaves[a] == v for a, v in cause.items()], axis=0)
        s2, var = inc.shift[mask] ** 2, inc.noise_var[mask]
        if (var <= 0).any() and (s2[var <= 0] > 0).any():
            out.append(float("inf"))
            continue
        ok = var > 0
        out.append(float(np.sqrt((s2[ok] / var[ok]).sum())))
    return out
