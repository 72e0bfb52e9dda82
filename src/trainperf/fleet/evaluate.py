"""Scoring against labelled benchmarks: TCPD change points and RiskLoc/Squeeze root causes.

Change points: the TCPD benchmark's own metrics (van den Burg & Williams 2020, TCPD
``metrics.py``): F1 with a margin, index 0 counted as a change point in every set, precision
against the union of annotators and recall averaged over annotators; cover averaged over
annotators. Root causes: micro-F1 over exact attribute=value sets (riskloc utils/evaluation.py)
plus a partial-credit score; Adtributor (Bhagwan et al., NSDI 2014) is the baseline method.
"""

from __future__ import annotations

import numpy as np


def true_positives(T: set, X: set, margin: int = 5) -> set:
    """TCPD's matching: each annotation claims the closest unclaimed prediction within margin."""
    X = set(X)
    TP = set()
    for tau in sorted(T):
        close = sorted((abs(tau - x), x) for x in X if abs(tau - x) <= margin)
        if not close:
            continue
        TP.add(tau)
        X.remove(close[0][1])
    return TP


def f_measure(annotations: dict, predictions, margin: int = 5) -> float:
    """TCPD F1: precision against the union of annotators, recall averaged over annotators."""
    Tks = [set(v) | {0} for v in annotations.values()]
    X = set(predictions) | {0}
    Tstar = set().union(*Tks)
    P = len(true_positives(Tstar, X, margin)) / len(X)
    R = sum(len(true_positives(Tk, X, margin)) / len(Tk) for Tk in Tks) / len(Tks)
    return 0.0 if P + R == 0 else 2 * P * R / (P + R)


def _partition(cps, n: int) -> list[set]:
    bounds = sorted({0, *[c for c in cps if 0 < c < n], n})
    return [set(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]


def covering(annotations: dict, predictions, n: int) -> float:
    """TCPD cover: each annotator's segmentation covered by the prediction, averaged."""
    pX = _partition(predictions, n)
    out = []
    for ann in annotations.values():
        S = _partition(ann, n)
        c = sum(len(R) * max(len(R & Rp) / len(R | Rp) for Rp in pX) for R in S) / n
        out.append(c)
    return sum(out) / len(out)


def _js(p, q):
    p, q = np.asarray(p, float), np.asarray(q, float)
    m = (p + q) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p > 0, p * np.log2(p / m), 0.0)
        b = np.where(q > 0, q * np.log2(q / m), 0.0)
    return 0.5 * (a + b)


def adtributor(leaves: dict, ra, pa, rb, pb, t_eep=0.1, t_ep=0.67, k=3) -> list[dict]:
    """Adtributor for a derived measure a/b; return root causes as [{"attr": value}, ...]."""
    RA, PA, RB, PB = ra.sum(), pa.sum(), rb.sum(), pb.sum()
    total = RA / RB - PA / PB if RB and PB else 0.0
    if total == 0:
        return []
    found = []
    for attr, vals in leaves.items():
        u, codes = np.unique(vals, return_inverse=True)
        ea, fa = np.bincount(codes, ra, len(u)), np.bincount(codes, pa, len(u))
        eb, fb = np.bincount(codes, rb, len(u)), np.bincount(codes, pb, len(u))
        # explanatory power of each element for a ratio (Adtributor, section 3.3)
        with np.errstate(divide="ignore", invalid="ignore"):
            ep = ((ea - fa) * PB - (eb - fb) * PA) / (PB * (PB + eb - fb)) / total
        ep = np.nan_to_num(ep)
        sur = _js(fa / PA if PA else fa * 0, ea / RA if RA else ea * 0) + _js(fb / PB, eb / RB)
        chosen, cum = [], 0.0
        for i in np.argsort(-sur):
            if ep[i] >= t_eep:
                chosen.append(i)
                cum += ep[i]
                if cum >= t_ep:
                    break
        if cum >= t_ep:
            found.append((float(sur[chosen].sum()), attr, [str(u[i]) for i in chosen]))
    found.sort(key=lambda x: -x[0])
    return [{attr: v} for _, attr, elems in found[:k] for v in elems]


def cause_key(c: dict) -> str:
    """Return a root cause as the canonical sorted "attr=value&attr=value" string."""
    return "&".join(sorted(f"{k}={v}" for k, v in c.items()))


def score(pred: list[dict], truth: list[dict]) -> tuple[int, int, int, float, float]:
    """Return TP, FP, FN (exact sets, as riskloc) and soft precision/recall credit sums."""
    P, T = {cause_key(p) for p in pred}, {cause_key(t) for t in truth}
    tp = len(P & T)
    ps = [set(cause_key(p).split("&")) for p in pred]
    ts = [set(cause_key(t).split("&")) for t in truth]
    jac = lambda a, b: len(a & b) / len(a | b)  # noqa: E731
    soft_r = sum(max((jac(t, p) for p in ps), default=0.0) for t in ts)
    soft_p = sum(max((jac(p, t) for t in ts), default=0.0) for p in ps)
    return tp, len(P) - tp, len(T) - tp, soft_p, soft_r
