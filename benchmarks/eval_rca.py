"""Score trainperf's root-cause localisation on the RobustSpot (RS) incidents beside Adtributor.

Each incident CSV holds one row per leaf and minute (attributes, ``value`` = failures,
``cnt`` = requests); the measure is the derived ratio value/cnt, the forecast each leaf's mean
over the minutes before the anomalous one (RobustSpot/RiskLoc use the 4 previous minutes; so
do we here). Scoring as the riskloc/Squeeze harness (utils/evaluation.py): a predicted root
cause counts only when its attribute=value set equals a true one; TP/FP/FN summed over
incidents, micro-F1 = 2TP / (2TP + FP + FN). Partial credit: per incident, soft precision and
recall from the best Jaccard overlap of attribute=value pairs between predicted and true causes,
summed like TP.

Baseline: Adtributor (Bhagwan et al., NSDI 2014) for derived measures, as in riskloc: per
attribute, elements sorted by surprise (Jensen-Shannon of numerator and denominator shares),
added while each explains >= 10% (T_EEP) until 67% (T_EP) is explained; top 3 attributes.

    .venv/bin/python benchmarks/eval_rca.py [--data ../shared/data/rca/rs]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import yaml

from trainperf.fleet.evaluate import cause_key, adtributor, score


PARAMS: dict = {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "../shared/data/rca/rs"))
    ap.add_argument("--history", type=int, default=4)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    from trainperf.fleet.localize import localize_rows, read_csv_columns

    data = Path(args.data)
    incidents = yaml.safe_load((data / "anomaly.yaml").read_text())
    tot = {m: np.zeros(5) for m in ("trainperf", "adtributor")}
    secs = {m: 0.0 for m in tot}
    for inc in incidents:
        path = data / f"{inc['data']}.csv"
        if not path.exists():
            continue
        truth = inc["cause"] if isinstance(inc["cause"], list) else [inc["cause"]]
        truth = [{k: str(v) for k, v in c.items()} for c in truth]
        cols = read_csv_columns(str(path))
        t0 = time.perf_counter()
        res = localize_rows(cols, "min", "value", inc["timestamp"], per="cnt", history=args.history, **PARAMS)
        secs["trainperf"] += time.perf_counter() - t0
        pred = res.root_causes
        s = score(pred, truth)
        tot["trainperf"] += s
        # Adtributor on the same leaves and forecasts
        t0 = time.perf_counter()
        attrs = [c for c in cols if c not in ("min", "value", "cnt")]
        t = cols["min"]
        now = t == inc["timestamp"]
        past_t = np.unique(t[t < inc["timestamp"]])[-args.history:]
        keys = np.stack([cols[a].astype(str) for a in attrs], 1)
        lk, li = np.unique(keys, axis=0, return_inverse=True)
        li = li.ravel()
        m = len(lk)
        past = np.isin(t, past_t)
        npast = np.maximum(np.bincount(li[past], minlength=m), 1)
        ra = np.bincount(li[now], cols["value"][now].astype(float), m)
        rb = np.bincount(li[now], cols["cnt"][now].astype(float), m)
        pa = np.bincount(li[past], cols["value"][past].astype(float), m) / npast
        pb = np.bincount(li[past], cols["cnt"][past].astype(float), m) / npast
        apred = adtributor({a: lk[:, j] for j, a in enumerate(attrs)}, ra, pa, rb, pb)
        secs["adtributor"] += time.perf_counter() - t0
        tot["adtributor"] += score(apred, truth)
        if args.verbose:
            print(inc["data"], "truth", [cause_key(c) for c in truth], "ours", [cause_key(c) for c in pred],
                  f"expl={res.explained:.2f}", "adt", [cause_key(c) for c in apred][:4])
    print(f"{'method':<11} {'TP':>4} {'FP':>4} {'FN':>4} {'micro-F1':>9} {'partial-F1':>11} {'seconds':>8}")
    for mth, (tp, fp, fn, sp, sr) in tot.items():
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
        prec, rec = sp / max(tp + fp, 1), sr / max(tp + fn, 1)
        pf1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        print(f"{mth:<11} {int(tp):>4} {int(fp):>4} {int(fn):>4} {f1:>9.3f} {pf1:>11.3f} {secs[mth]:>8.2f}")


if __name__ == "__main__":
    main()
