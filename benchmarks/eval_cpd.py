"""Score trainperf's change-point detector on the TCPD benchmark, beside baselines.

Metrics are the benchmark's own (van den Burg & Williams 2020, TCPD `metrics.py`): F1 with a
5-point margin, index 0 counted as a change point in every set, precision over the union of
annotations and recall averaged over annotators; cover averaged over annotators. Baselines:
zero (no change points) and ruptures binseg / pelt (L2 cost, penalty 3 log n: our closest
equivalent of TCPD's default R changepoint binseg/pelt with the MBIC penalty).

    .venv/bin/python benchmarks/eval_cpd.py [--data ../shared/data/tcpd] [--json out.json]
        [--impl OLD_changepoints.py] [--generalisation] [--synthetic [--reps 100]]

``--impl`` scores another version of the detector module (e.g. ``git show
9ea27ed:src/trainperf/fleet/changepoints.py > /tmp/cp_before.py``) in place of the installed one.
``--generalisation``: leave-one-series-out and split-half choice of (alpha, min_trend_share) on a
grid, scored on the held-out series, beside the defaults. ``--synthetic``: false alarms and
detection on synthetic fleet series (trainperf.fleet.synth and heavy-tailed noise models).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from trainperf.fleet.evaluate import covering, f_measure


def load_series(path: Path) -> tuple[str, np.ndarray]:
    """Return (name, values) of a univariate TCPD series; missing values are NaN."""
    d = json.loads(path.read_text())
    raw = d["series"][0]["raw"]
    return d["name"], np.array([np.nan if v is None else float(v) for v in raw])


def _interp(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    bad = np.isnan(x)
    if bad.any():
        x[bad] = np.interp(np.flatnonzero(bad), np.flatnonzero(~bad), x[~bad])
    return x


def detect_zero(x):
    return []


def detect_ruptures(x, algo: str):
    """ruptures binseg/pelt, L2 (mean-shift) cost on the standardised series, penalty 3 log n.

    TCPD's default experiment ran R changepoint's binseg/pelt with the MBIC penalty (about
    3 log n); of ruptures' settings we tried (normal cost, L2 cost scaled by the robust noise
    level), this one scores best, so it is the baseline shown.
    """
    import warnings

    import ruptures as rpt

    warnings.filterwarnings("ignore", module="ruptures")
    y = _interp(x)
    y = (y - np.mean(y)) / (np.std(y) or 1.0)
    n = len(y)
    cls = rpt.Binseg if algo == "binseg" else rpt.Pelt
    bkps = cls(model="l2", min_size=3, jump=1).fit(y).predict(pen=3 * math.log(n))
    return [b for b in bkps if b < n]


_IMPL = {"module": None}


def _cp_module():
    """Return the change-point module under test: the installed one, or the file given by --impl."""
    if _IMPL["module"] is None:
        import trainperf.fleet.changepoints as cp

        _IMPL["module"] = cp
    return _IMPL["module"]


def _load_impl(path: str) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("cp_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    _IMPL["module"] = mod


def detect_trainperf(x, **params):
    return [c.index for c in _cp_module().detect_changes(x, **params).changes]


METHODS = {"zero": detect_zero, "binseg": lambda x: detect_ruptures(x, "binseg"),
           "pelt": lambda x: detect_ruptures(x, "pelt"), "trainperf": detect_trainperf}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "../shared/data/tcpd"))
    ap.add_argument("--json", default=None, help="write per-series scores here")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--impl", default=None, help="score this changepoints.py instead of the installed one")
    ap.add_argument("--generalisation", action="store_true", help="leave-one-out / split-half parameter check")
    ap.add_argument("--synthetic", action="store_true", help="synthetic fleet false alarms and detection")
    ap.add_argument("--reps", type=int, default=100, help="series per synthetic case")
    args = ap.parse_args()
    if args.impl:
        _load_impl(args.impl)
    data = Path(args.data)
    ann = json.loads((data / "annotations.json").read_text())
    methods = args.methods.split(",")
    rows, secs = [], {m: 0.0 for m in methods}
    for path in sorted((data / "datasets").glob("*.json")):
        name, x = load_series(path)
        row = {"series": name, "n": len(x)}
        for m in methods:
            t0 = time.perf_counter()
            cps = METHODS[m](x)
            secs[m] += time.perf_counter() - t0
            row[m] = {"f1": f_measure(ann[name], cps), "cover": covering(ann[name], cps, len(x)), "cps": list(map(int, cps))}
        rows.append(row)
    w = max(len(r["series"]) for r in rows)
    print(f"{'series':<{w}} {'n':>4} " + " ".join(f"{m + ' F1':>13} {'cover':>6}" for m in methods))
    for r in rows:
        print(f"{r['series']:<{w}} {r['n']:>4} " + " ".join(f"{r[m]['f1']:>13.3f} {r[m]['cover']:>6.3f}" for m in methods))
    print(f"{'MEAN':<{w}} {'':>4} " + " ".join(
        f"{np.mean([r[m]['f1'] for r in rows]):>13.3f} {np.mean([r[m]['cover'] for r in rows]):>6.3f}" for m in methods))
    print(f"{'min F1':<{w}} {'':>4} " + " ".join(f"{min(r[m]['f1'] for r in rows):>13.3f} {'':>6}" for m in methods))
    print("seconds total: " + ", ".join(f"{m} {secs[m]:.3f}" for m in methods))
    # speed: 1,000 points of heavy-tailed noise with two level shifts, median of 20 runs
    detect_changes, ChangeDetector = _cp_module().detect_changes, _cp_module().ChangeDetector
    rng = np.random.default_rng(0)
    x = 1.0 + 0.01 * rng.standard_t(3, 1000)
    x[300:700] += 0.05
    ts = []
    for _ in range(20):
        t0 = time.perf_counter()
        detect_changes(x)
        ts.append(time.perf_counter() - t0)
    det, ti = ChangeDetector(), []
    for k in range(0, 1000, 50):
        t0 = time.perf_counter()
        det.update(x[k:k + 50])
        ti.append(time.perf_counter() - t0)
    print(f"speed: detect_changes on 1,000 points median {np.median(ts):.4f} s; incremental, 20 updates of 50 "
          f"points: total {sum(ti):.4f} s, found {det.result.change_points}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.generalisation:
        generalisation(data, ann)
    if args.synthetic:
        synthetic(args.reps)


def _series(data: Path) -> list[tuple[str, np.ndarray]]:
    return [load_series(p) for p in sorted((data / "datasets").glob("*.json"))]


def generalisation(data: Path, ann: dict) -> None:
    """Print F1 on held-out series when (alpha, min_trend_share) is chosen on the other series.

    Leave-one-series-out: for each series, the grid point with the best mean F1 on the other 19
    (ties: the one nearest the defaults) scores the held-out one. Split-half: 200 random halves,
    chosen on one half, scored on the other, beside the defaults on the same half.
    """
    import inspect

    series = _series(data)
    alphas, shares = [0.001, 0.005, 0.01, 0.02, 0.05], [0.3, 0.4, 0.5, 0.6, 0.7, 2.0]
    takes_share = "min_trend_share" in inspect.signature(_cp_module().detect_changes).parameters
    grid = [(a, sh) for a in alphas for sh in (shares if takes_share else [None])]
    f1 = np.zeros((len(grid), len(series)))
    for g, (a, sh) in enumerate(grid):
        params = {"alpha": a} | ({"min_trend_share": sh} if sh is not None else {})
        for i, (name, x) in enumerate(series):
            f1[g, i] = f_measure(ann[name], detect_trainperf(x, **params))
    default = grid.index((0.01, 0.5 if takes_share else None))
    dist = np.array([abs(math.log(a / 0.01)) + (abs(sh - 0.5) if sh is not None else 0) for a, sh in grid])
    print("\ngeneralisation: mean F1 over the grid (rows alpha, columns min_trend_share; 2.0 = jump test off)")
    for a in alphas:
        print(f"  alpha {a:<6}" + " ".join(f"{f1[grid.index((a, sh))].mean():.3f}" for sh in (shares if takes_share else [None])))

    def pick(cols) -> int:
        m = f1[:, cols].mean(axis=1)
        best = np.flatnonzero(m >= m.max() - 1e-12)
        return int(best[np.argmin(dist[best])])

    n = len(series)
    loo = [f1[pick([j for j in range(n) if j != i]), i] for i in range(n)]
    print(f"leave-one-series-out: held-out mean F1 {np.mean(loo):.4f} (defaults, same series: {f1[default].mean():.4f};"
          f" best grid point in-sample: {f1.mean(axis=1).max():.4f})")
    rng = np.random.default_rng(0)
    chosen, dflt = [], []
    for _ in range(200):
        perm = rng.permutation(n)
        a_half, b_half = perm[: n // 2], perm[n // 2:]
        chosen.append(f1[pick(list(a_half)), b_half].mean())
        dflt.append(f1[default, b_half].mean())
    print(f"split-half (200 random halves): chosen on one half, scored on the other: {np.mean(chosen):.4f};"
          f" defaults on the same halves: {np.mean(dflt):.4f}")


def synthetic(reps: int) -> None:
    """Print false-alarm and detection rates on synthetic performance series (seeded)."""
    from trainperf.fleet.synth import synthetic_fleet

    rng = np.random.default_rng(1)
    detect = detect_trainperf

    def noise(n, kind):
        if kind == "normal":
            return 0.01 * rng.standard_normal(n)
        if kind == "t3":
            return 0.01 * rng.standard_t(3, n)
        if kind == "t3+outliers":  # 2% of steps 10-30% slow (stalls)
            e = 0.01 * rng.standard_t(3, n)
            m = rng.random(n) < 0.02
            e[m] += rng.choice([0.1, 0.3], m.sum())
            return e
        e, z = np.zeros(n), 0.01 * rng.standard_t(5, n)  # AR(1) 0.5, t5 innovations
        for i in range(1, n):
            e[i] = 0.5 * e[i - 1] + z[i]
        return e

    rows = []
    for kind in ("normal", "t3", "t3+outliers", "ar1"):
        rows.append((f"stationary {kind} noise (100-1000 points): any change", np.mean(
            [bool(detect(1.0 + noise(int(rng.integers(100, 1000)), kind))) for _ in range(reps)])))
    t5 = np.arange(500)
    rows.append(("warm-up (exp decay, 30%, tau 3) + t3: change after 30", np.mean(
        [any(c > 30 for c in detect(1.0 + 0.3 * np.exp(-t5 / 3) + noise(500, "t3"))) for _ in range(reps)])))
    rows.append(("slow drift 10% over 500 points + t3: any change", np.mean(
        [bool(detect(1.0 + 2e-4 * t5 + noise(500, "t3"))) for _ in range(reps)])))
    rows.append(("periodic stalls (3x every 50 steps) + t3: any change", np.mean(
        [bool(detect(np.where(np.arange(600) % 50 == 0, 3.0, 1.0) * (1 + noise(600, "t3")))) for _ in range(reps)])))
    t6 = np.arange(600)
    rows.append(("sawtooth (8% creep, reset every 40) + t3/3: > 2 changes", np.mean(
        [len(detect(1.0 + 0.002 * (t6 % 40) + noise(600, "t3") / 3)) > 2 for _ in range(reps)])))
    for size in (0.03, 0.05):
        for kind in ("normal", "t3+outliers"):
            hits = 0
            for _ in range(reps):
                n = int(rng.integers(200, 800))
                at = int(rng.integers(50, n - 50))
                x = 1.0 + noise(n, kind)
                x[at:] *= 1 + size
                cps = detect(x)
                hits += any(abs(c - at) <= 5 for c in cps) and len(cps) <= 2
            rows.append((f"{size:.0%} step in 1% {kind} noise: found within 5, <= 2 changes", hits / reps))
    hits = only = 0
    for _ in range(reps):
        at = int(rng.integers(100, 300))
        x = 1.0 + 3e-4 * np.arange(400) + noise(400, "t3")
        x[at:] *= 1.05
        cps = detect(x)
        hits += any(abs(c - at) <= 5 for c in cps)
        only += len(cps) == 1 and abs(cps[0] - at) <= 5
    rows.append(("5% step on a 12% drift (400 points, t3): found within 5", hits / reps))
    rows.append(("5% step on a 12% drift (400 points, t3): found, and the only change", only / reps))
    # trainperf's own synthetic fleet: each host's run series, one run per period
    for slow in (0.03, 0.05):
        found, alarms, healthy = 0, 0, 0
        for seed in range(reps // 4):
            f = synthetic_fleet(n_periods=100, causes=("bad_host",), bad_host_slowdown=slow, seed=seed)
            found += any(abs(c - 20) <= 5 for c in detect(f.series(host="node03")))
            for h in ("node00", "node01", "node02", "node04", "node05", "node06"):
                healthy += 1
                alarms += bool(detect(f.series(host=h)))
        rows.append((f"synth fleet: bad host +{slow:.0%} at period 20 (cv 1%, 100 periods): found within 5", found / (reps // 4)))
        rows.append((f"synth fleet: healthy hosts, same fleets: any change", alarms / healthy))
    f_all = [synthetic_fleet(n_periods=100, seed=s) for s in range(reps // 4)]
    rows.append(("synth fleet, all four causes: NCCL-upgraded host node00 found within 5 of 30 (+8%)", np.mean(
        [any(abs(c - 30) <= 5 for c in detect(f.series(host="node00"))) for f in f_all])))
    rows.append(("synth fleet, all four causes: thermal-drift host node07, a change within 45..55", np.mean(
        [any(45 <= c <= 55 for c in detect(f.series(host="node07"))) for f in f_all])))
    print("\nsynthetic performance series (rates over seeded draws):")
    for name, v in rows:
        print(f"  {v:6.3f}  {name}")


if __name__ == "__main__":
    main()
