"""Score `trainperf diff` on the diagnosis corpus (issue 10): each case against the healthy trace of its base.

For every case folder (corpus/<case>/{traces/, labels.json}) whose base has a healthy case, the diff of
healthy -> case: the mean step-time change (what the decomposition adds up to), the label's change,
explained_pct (the share of the change outside ``idle: other``) and the bucket that moved most.

The label's change per step: for the injected cases, step_time_us_after - step_time_us_before (the
slowest rank's mean window step, trainperf.corpus.build.step_time); for the real trainer runs (two
separate runs, the fault on from step FAULT_FROM), true_gain_pct of the case's mean window step (a
known added time per faulty step, spread over the window) - the clean run itself differs from the
case's clean steps by the machine's load, so the real rows' step error is mostly noise.

    .venv/bin/python benchmarks/eval_diff.py [corpus] [--json OUT] [--cases SUBSTR] [--same-run]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from trainperf.corpus.real import FAULT_FROM, PROFILE, known_added_s
from trainperf.diagnose import diff as D
from trainperf.trace.load import load_trace

# where each fault kind's time is expected to land (the bucket prefixes; "host: x" on host-only traces)
FAULT_BUCKETS = {
    "data_loader_stall": ("idle: dataloader", "host: dataloader"),
    "checkpoint_stall": ("idle: checkpoint", "host: checkpoint"),
    "host_sync": ("idle: sync", "host: sync"),
    "allocator_stall": ("idle: allocator", "host: allocator"),
    "pageable_copy": ("memcpy",),
    "small_kernels": ("compute:", "idle: host", "idle: kernel gaps"),
    "straggler": ("communication", "idle: communication", "host: communication"),
    "exposed_comm": ("communication", "idle: communication", "idle: sync"),
}


def label_delta_us(labels: dict, case_profile) -> float:
    """The change per step the label says (µs), see the module docstring."""
    if "step_time_us_after" in labels:
        return float(labels["step_time_us_after"]) - float(labels["step_time_us_before"])
    return float(labels["true_gain_pct"]) / 100 * case_profile.mean_us


def steps_of(tables: dict, steps) -> dict:
    """The rows of the given ProfilerSteps (host rows by the step they fall in, device rows by their launch's)."""
    keep = list(steps)
    return {r: t.take(np.isin(t.step, keep)) for r, t in tables.items()}


def same_run_delta_us(labels: dict) -> float:
    """A real run's faulty steps against its clean ones (µs): the fault's known added time per step where it
    has one, else the measured twin difference (labels.json: rank 0's window steps)."""
    known = known_added_s(labels.get("fault"))
    return 1e6 * (known if known is not None else labels["faulty_step_s"] - labels["clean_step_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="?", default="corpus")
    ap.add_argument("--json", default="", help="write the per-pair rows here")
    ap.add_argument("--cases", default="", help="only cases whose name contains this")
    ap.add_argument("--same-run", action="store_true",
                    help="also diff each real run's clean steps against its faulty ones (the run's own twin)")
    a = ap.parse_args()
    root = Path(a.corpus)
    cases = {p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("*/labels.json"))}
    healthy = {lab["base"]: name for name, lab in cases.items() if lab["kind"] == "healthy"}
    tables: dict[str, dict] = {}

    def load(name: str) -> dict:
        if name not in tables:
            tables[name] = load_trace(root / name / "traces")
        return tables[name]

    rows = []
    t0 = time.perf_counter()
    pairs = []  # (row name, base name for the table, labels, baseline tables, candidate tables, label delta or None)
    for name, lab in cases.items():
        if lab["kind"] == "healthy" or a.cases not in name or lab["base"] not in healthy:
            continue
        pairs.append((name, lab["base"], lab, lambda h=healthy[lab["base"]]: load(h), lambda n=name: load(n), None))
        if a.same_run and "clean_step_s" in lab:  # a real run: its clean steps against its faulty ones
            pairs.append((name + " (same run)", lab["base"] + " (same run)", lab,
                          lambda n=name: steps_of(load(n), range(PROFILE[0], FAULT_FROM)),
                          lambda n=name: steps_of(load(n), range(FAULT_FROM, PROFILE[1])), same_run_delta_us(lab)))
    for name, base_name, lab, get_a, get_b, want in pairs:
        ta, tb = get_a(), get_b()
        if hasattr(D, "step_profiles"):
            base, cand = D.step_profiles(ta, tb, "baseline", name)
        else:  # before the waits one side explains in the other (commits before issue 10's HC)
            base, cand = D.step_profile(ta, "baseline"), D.step_profile(tb, name)
        case = name.removesuffix(" (same run)")
        if case != name or not (a.same_run and "clean_step_s" in lab):
            tables.pop(case, None)  # read once (its same-run pair right after it); the healthy tables stay
        d = D.diff_profiles(base, cand)
        dec = sorted(((n, c - b) for n, b, c in d.decomposition), key=lambda x: -abs(x[1]))
        want = label_delta_us(lab, cand) if want is None else want
        top = dec[0][0] if dec else ""
        rows.append({"case": name, "base": base_name, "kind": lab["kind"], "severity": lab.get("target_severity"),
                     "label_delta_us": round(want, 1), "delta_us": round(d.delta_mean_us, 1),
                     "delta_pct": round(100 * d.delta_mean_us / base.mean_us, 3),
                     "label_delta_pct": round(100 * want / base.mean_us, 3),
                     "explained_pct": round(d.explained_pct, 1),
                     "idle_other_us": round(dict(dec).get("idle: other", 0.0), 1),
                     "top_bucket": top, "top_is_fault": top.startswith(FAULT_BUCKETS.get(lab["kind"], ("?",))),
                     "headline": d.headline()})
        r = rows[-1]
        print(f"{name:48s} delta {r['delta_us']:>11.1f} us (label {r['label_delta_us']:>11.1f})  "
              f"explained {r['explained_pct']:>7.1f}%  other {r['idle_other_us']:>10.1f}  top {top}", flush=True)
    by = defaultdict(list)
    for r in rows:
        by[r["base"]].append(r)
    print(f"\n{len(rows)} pairs, {time.perf_counter() - t0:.0f} s\n")
    print("| base | pairs | step delta vs label, pp of the step (median / max error) | explained: median (min) "
          "| >= 90% | top bucket is the fault's |")
    print("|---|---|---|---|---|---|")
    for b, rs in sorted(by.items()):
        err = np.array([abs(r["delta_pct"] - r["label_delta_pct"]) for r in rs])
        ex = np.array([r["explained_pct"] for r in rs])
        print(f"| {b} | {len(rs)} | {np.median(err):.1f} / {err.max():.1f} | {np.median(ex):.1f}% ({ex.min():.1f}%) "
              f"| {int((ex >= 90).sum())}/{len(rs)} | {sum(r['top_is_fault'] for r in rs)}/{len(rs)} |")
    ex = np.array([r["explained_pct"] for r in rows])
    print(f"| all | {len(rows)} | | {np.median(ex):.1f}% ({ex.min():.1f}%) | {int((ex >= 90).sum())}/{len(rows)} "
          f"| {sum(r['top_is_fault'] for r in rows)}/{len(rows)} |")
    low = [r for r in rows if r["explained_pct"] < 90]
    if low:
        print("\nunder 90%: " + ", ".join(f"{r['case']} {r['explained_pct']}%" for r in low))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
