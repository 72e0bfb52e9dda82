"""Score `diagnose` on a labeled corpus: per-kind precision/recall/F1, top-1, healthy false findings,
what-if error.

A case folder holds `labels.json` ({kind, ranks, true_gain_pct, severity}) and `traces/` (one
Kineto file per rank). A finding counts as a prediction of its kind when its severity is at least
`min_severity`. Precision of kind K = cases labeled K where K was predicted / cases where K was
predicted (healthy cases included); recall = the same over cases labeled K. Top-1: the first
(highest-ranked) finding of a non-healthy case names its labeled kind. What-if error: |predicted
gain_pct - true_gain_pct| in percentage points, over cases whose labeled kind was predicted; and the same for the
gain of the labeled kind's fix alone (gain_alone_pct): the true gain is the fault's alone (the untouched trace's step),
while gain_pct is what the fix adds after the fixes ranked before it (a fault in a host-bound base can cost 1.1 % alone
and 23.9 % once the host's bound is taken).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainperf.corpus.build import KIND_LABELS
from trainperf.diagnose.advice import RECOMMENDATIONS
from trainperf.errors import TrainperfError

SEVERITIES = ("low", "medium", "high")
LABEL_KEYS = ("kind", "ranks", "true_gain_pct", "severity")
SCORED_FINDING_KEYS = ("kind", "severity", "ranks", "gain_pct", "gain_alone_pct", "gain_is_upper_bound", "fix_order")
# a label names any kind diagnose can find (a corpus measured elsewhere labels launch_bound, idle_gpu...), not
# only those `make corpus` plants
LABEL_KINDS = tuple(dict.fromkeys(KIND_LABELS + tuple(RECOMMENDATIONS)))


@dataclass(kw_only=True)
class CaseResult:
    """One case: its labels and diagnose's findings [{kind, severity, ranks, gain_pct}], ranked."""

    name: str
    kind: str
    ranks: list[int]
    true_gain_pct: float
    severity: str
    findings: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    base: str = ""  # the base trace set; its healthy case is the untouched twin
    also: list[str] = field(default_factory=list)  # other planted problems (labels' `also`): not false findings


def labeled_result(name: str, labels: dict, **measured) -> CaseResult:
    """A case's result: its truths read from its (checked) `labels`, with what was measured of it (`findings`,
    `seconds`)."""
    return CaseResult(name=name, kind=labels["kind"], ranks=list(labels["ranks"]),
                      true_gain_pct=float(labels["true_gain_pct"]), severity=str(labels["severity"]),
                      base=str(labels.get("base", "")), also=[a["kind"] for a in labels.get("also", [])], **measured)


def read_labels(case: Path) -> dict:
    """labels.json of a case folder, checked; a one-line TrainperfError naming the file otherwise."""
    path = case / "labels.json"
    if not path.is_file():
        raise TrainperfError(f"{case}: missing labels.json")
    try:
        labels = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TrainperfError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(labels, dict):
        raise TrainperfError(f"{path}: expected a JSON object with {', '.join(LABEL_KEYS)}")
    missing = [k for k in LABEL_KEYS if k not in labels]
    if missing:
        raise TrainperfError(f"{path}: missing key(s) {', '.join(missing)}")
    if labels["kind"] not in LABEL_KINDS:
        raise TrainperfError(f"{path}: unknown kind {labels['kind']!r}; known: {', '.join(LABEL_KINDS)}")
    if not isinstance(labels["true_gain_pct"], (int, float)) or not isinstance(labels["ranks"], list):
        raise TrainperfError(f"{path}: true_gain_pct must be a number and ranks a list")
    also = labels.get("also", [])
    if not isinstance(also, list) or not all(isinstance(a, dict) and a.get("kind") in LABEL_KINDS for a in also):
        raise TrainperfError(f"{path}: also must be a list of {{kind, true_gain_pct, ranks}} with known kinds")
    return labels


def case_folders(corpus: str | Path) -> list[Path]:
    """The case folders of a corpus (sub-folders with labels.json or traces/), sorted by name."""
    corpus = Path(corpus)
    if not corpus.is_dir():
        raise TrainperfError(f"{corpus}: not a folder (expected a corpus built by `make corpus`)")
    cases = sorted(p for p in corpus.iterdir()
                   if p.is_dir() and ((p / "labels.json").exists() or (p / "traces").is_dir()))
    if not cases:
        raise TrainperfError(f"{corpus}: no case folders (each needs labels.json and traces/)")
    return cases


@dataclass(frozen=True, kw_only=True)
class CaseOutcome:
    """How diagnose did on one case: its top finding (of at least the severity floor), whether that names the labeled
    kind (top1; None on a healthy case) and does so among the kinds the untouched twin does not show (top1_vs_twin;
    None without a twin), and the gains (% of step time) of the labeled kind's finding, where found."""

    name: str
    kind: str
    base: str
    severity: str
    true_gain_pct: float
    top_kind: str | None
    top1: bool | None
    top1_vs_twin: bool | None
    found: bool
    found_severity: str | None  # the labeled kind's finding's severity, where found
    gain_pct: float | None
    gain_alone_pct: float | None

    def to_json(self) -> dict:
        """The outcome's fields that the case's own entry does not already hold (for the JSON's cases): top_kind, top1,
        top1_vs_twin, and the labeled kind's gains (null where it was not found)."""
        return {"top_kind": self.top_kind, "top1": self.top1, "top1_vs_twin": self.top1_vs_twin,
                "labeled_gain_pct": self.gain_pct, "labeled_gain_alone_pct": self.gain_alone_pct}


def case_outcomes(results: list[CaseResult], min_severity: str = "low") -> list[CaseOutcome]:
    """Each case's outcome (CaseOutcome), in the order of results: the one place a case is called right or wrong."""
    twin = _twin_kinds(results, min_severity)
    out = []
    for r in results:
        sick = r.kind != "healthy"
        top = _first(r, min_severity)
        f = next((f for f in r.findings if f["kind"] == r.kind and _at_least(f["severity"], min_severity)), None)
        gain = float(f["gain_pct"]) if f is not None else None
        out.append(CaseOutcome(
            name=r.name, kind=r.kind, base=r.base, severity=r.severity, true_gain_pct=r.true_gain_pct, top_kind=top,
            top1=(top == r.kind) if sick else None,
            top1_vs_twin=(_first(r, min_severity, skip=twin[r.base] - {r.kind}) == r.kind)
            if sick and r.base in twin else None,
            found=sick and f is not None, found_severity=f["severity"] if sick and f is not None else None,
            gain_pct=gain if sick else None,
            gain_alone_pct=_gain_alone_pct(f) if sick and f is not None else None))
    return out


def _gain_alone_pct(f: dict) -> float:
    """A finding's fix priced alone (%): its gain_alone_pct, or its gain where it has none (a scorer's own findings)."""
    alone = f.get("gain_alone_pct")
    return float(alone if alone is not None else f["gain_pct"])


def _twin_gains(results: list[CaseResult], min_severity: str) -> dict[str, dict[str, float]]:
    """base -> {kind: its fix's gain alone (%)} of the findings (at least min_severity) on its untouched twin, the
    base's healthy case."""
    return {r.base: {f["kind"]: _gain_alone_pct(f) for f in r.findings if _at_least(f["severity"], min_severity)}
            for r in results if r.kind == "healthy" and r.base}


def _twin_kinds(results: list[CaseResult], min_severity: str) -> dict[str, set[str]]:
    """base -> the kinds found (at least min_severity) on its untouched twin (_twin_gains' kinds)."""
    return {base: set(gains) for base, gains in _twin_gains(results, min_severity).items()}


def _at_least(severity: str, floor: str) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(floor) if severity in SEVERITIES else False


def score(results: list[CaseResult], min_severity: str = "low") -> dict:
    """The evaluation JSON: {kinds: {K: {precision, recall, f1, n, tp, fp, fn, precision_vs_twin}}, top1_accuracy,
    healthy_false_findings: {high, medium, low}, whatif_median_abs_error_pct, ...}; precision
    is null for a kind never predicted."""
    if min_severity not in SEVERITIES:
        raise TrainperfError(f"min severity {min_severity!r}: expected one of {', '.join(SEVERITIES)}")
    predicted = [{f["kind"] for f in r.findings if _at_least(f["severity"], min_severity)} for r in results]
    labeled = sorted({r.kind for r in results} - {"healthy"})
    healthy = [r for r in results if r.kind == "healthy"]
    twin_gain = _twin_gains(results, min_severity)
    kinds = {}
    for k in labeled:
        tp = sum(1 for r, p in zip(results, predicted) if r.kind == k and k in p)
        fp = sum(1 for r, p in zip(results, predicted) if r.kind != k and k in p and k not in r.also)
        # a base's own finding, which its untouched twin shows (a false finding there), counted there only, not
        # again on every case injected into that base
        fp_twin = sum(1 for r, p in zip(results, predicted) if r.kind != k and k in p and k not in r.also
                      and (r.kind == "healthy" or k not in twin_gain.get(r.base, {})))
        n = sum(1 for r in results if r.kind == k)
        prec = tp / (tp + fp) if tp + fp else None
        rec = tp / n
        f1 = 2 * prec * rec / (prec + rec) if prec and rec else 0.0
        kinds[k] = {"precision": _r(prec), "recall": _r(rec), "f1": _r(f1), "n": n, "tp": tp, "fp": fp, "fn": n - tp,
                    "precision_vs_twin": _r(tp / (tp + fp_twin)) if tp + fp_twin else None}
    seen = [o for o in case_outcomes(results, min_severity) if o.kind != "healthy"]
    false = {s: sum(1 for r in healthy for f in r.findings if f["severity"] == s) for s in ("high", "medium", "low")}
    found = [o for o in seen if o.found]
    errs = [abs(o.gain_pct - o.true_gain_pct) for o in found]
    alone = [abs(o.gain_alone_pct - o.true_gain_pct) for o in found]
    # a base with a cost of the labeled kind of its own (its twin shows it: a launch-bound base's launches) is priced
    # with it, while the truth is the planted part alone: that part is what the fix alone gains beyond the twin's
    beyond = [abs(o.gain_alone_pct - twin_gain[o.base].get(o.kind, 0.0) - o.true_gain_pct)
              for o in found if o.base in twin_gain]
    rel = [abs(o.gain_pct - o.true_gain_pct) / o.true_gain_pct * 100 for o in found if o.true_gain_pct > 0]
    twinned = [o for o in seen if o.top1_vs_twin is not None]
    other: dict[str, int] = {}
    for r, p in zip(results, predicted):
        for k in p - set(labeled):
            other[k] = other.get(k, 0) + 1
    by_sev = {}
    for s in SEVERITIES:
        sel = [o for o in seen if o.severity == s]
        by_sev[s] = {"n": len(sel), "recall": _r(sum(o.found for o in sel) / len(sel)) if sel else None}
    return {
        "kinds": kinds,
        "top1_accuracy": _r(sum(o.top1 for o in seen) / len(seen)) if seen else None,
        # top-1 among the kinds its untouched twin (the base's healthy case) does not show
        "top1_accuracy_vs_twin": _r(sum(o.top1_vs_twin for o in twinned) / len(twinned)) if twinned else None,
        "healthy_false_findings": false,
        "whatif_median_abs_error_pct": _r(statistics.median(errs)) if errs else None,
        "whatif_max_abs_error_pct": _r(max(errs)) if errs else None,
        "whatif_median_rel_error_pct": _r(statistics.median(rel)) if rel else None,
        "whatif_n": len(errs),
        # the labeled kind's fix priced alone, as its truth is
        "whatif_alone_median_abs_error_pct": _r(statistics.median(alone)) if alone else None,
        "whatif_alone_max_abs_error_pct": _r(max(alone)) if alone else None,
        # ... less what the same kind's fix gains on the base's untouched twin, over the cases with a twin
        "whatif_beyond_twin_median_abs_error_pct": _r(statistics.median(beyond)) if beyond else None,
        "whatif_beyond_twin_max_abs_error_pct": _r(max(beyond)) if beyond else None,
        "n_cases": len(results), "n_healthy": len(healthy), "min_severity": min_severity,
        "recall_by_true_severity": by_sev,
        # labeled severity -> {severity of the labeled kind's finding, or "none": cases}
        "severity_confusion": {s: {got: sum(1 for o in seen if o.severity == s and (o.found_severity or "none") == got)
                                   for got in (*reversed(SEVERITIES), "none")}
                               for s in reversed(SEVERITIES) if any(o.severity == s for o in seen)},
        "severity_agreement": _r(sum(o.found_severity == o.severity for o in found) / len(found)) if found else None,
        "other_predicted_kinds": dict(sorted(other.items())),
        "top1_misses": _misses(seen),
        "top1_by_base": _by_base(seen),
    }


def _first(r: CaseResult, floor: str, skip=frozenset()) -> str | None:
    return next((f["kind"] for f in r.findings if _at_least(f["severity"], floor) and f["kind"] not in skip), None)


def _misses(seen: list[CaseOutcome]) -> dict:
    """labeled kind -> {top finding's kind (or 'none'): count} over cases whose top-1 was wrong."""
    out: dict = {}
    for o in seen:
        if not o.top1:
            got = o.top_kind or "none"
            out.setdefault(o.kind, {})
            out[o.kind][got] = out[o.kind].get(got, 0) + 1
    return out


def _by_base(seen: list[CaseOutcome]) -> dict:
    """base -> {n, top1_accuracy, top1_accuracy_vs_twin} over its problem cases (null without a twin)."""
    out = {}
    for base in sorted({o.base for o in seen}):
        mine = [o for o in seen if o.base == base]
        twinned = [o for o in mine if o.top1_vs_twin is not None]
        out[base] = {"n": len(mine), "top1_accuracy": _r(sum(o.top1 for o in mine) / len(mine)),
                     "top1_accuracy_vs_twin": _r(sum(o.top1_vs_twin for o in twinned) / len(twinned))
                     if twinned else None}
    return out


def _r(x):
    return None if x is None else round(float(x), 4)


def run_cases(corpus: str | Path, progress: bool = True, unprofiled: bool = False) -> list[CaseResult]:
    """Diagnose every case of the corpus (labels checked first, all of them); return the results. unprofiled: give
    diagnose each case's step time measured without the profiler (labels' faulty_step_ms, ms) where it has one."""
    from trainperf.diagnose.api import diagnose

    cases = case_folders(corpus)
    labels = {c: read_labels(c) for c in cases}
    for c in cases:
        if not (c / "traces").is_dir():
            raise TrainperfError(f"{c}: missing traces/ folder")
    results = []
    bar = _progress(progress)
    with bar:
        task = bar.add_task("diagnosing", total=len(cases))
        for c in cases:
            bar.update(task, description=f"diagnosing {c.name}")
            t = time.perf_counter()
            lab = labels[c]
            step_ms = lab.get("faulty_step_ms") if unprofiled else None
            found = diagnose(c / "traces", top=10_000, unprofiled_step_ms=step_ms).to_json()["findings"]
            kept = [{k: f.get(k) for k in SCORED_FINDING_KEYS} for f in found]
            results.append(labeled_result(c.name, lab, findings=kept, seconds=time.perf_counter() - t))
            bar.advance(task)
    return results


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled, transient=True)
