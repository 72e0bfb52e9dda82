"""Choose diagnose's thresholds by nested, leave-one-base-out cross-validation on the labeled corpus.

    nice -n 10 .venv/bin/python benchmarks/cv_diagnose.py [CORPUS] [--json out.json] [--sweeps 3]
        [--speedups] [--one-sided] [--healthy-weight W] [--cache FILE] [--only NAME,NAME] [--no-progress]

Every case is diagnosed once through `trainperf.diagnose.api.diagnose` (as `trainperf evaluate`
does); its per-rank RankFacts are kept, with the what-if replays they have cached. A set of
thresholds is then scored by re-running only the finding rules and the marginal-gain ranking
(rules.run_rules, findings.rank_by_marginal_gain, findings.merge_across_ranks) with the values set on
the modules the rules read them from (setattr), and scoring the findings with `corpus.evaluate.score`.

Folds group the cases by their base trace set (labels.json `base`: the HTA trace an injection was
made into, or the real-run configuration): a threshold is never scored on a trace it was tuned on.
Outer loop: each base held out once; inside, the thresholds are tuned on the other bases only, by
coordinate descent over a grid per threshold (from the current values; ties keep the middle of the
widest optimal plateau, and a threshold with no effect on the training cases keeps its value); the
held-out base is then diagnosed with them. The pooled held-out findings give the out-of-sample
figures; tuning on all bases gives the in-sample figures and the recommended values.

Objective (higher is better): top-1 accuracy + mean per-kind F1 + 0.1 x severity agreement (a
detected case's severity equals its labeled severity) - 1.0 x (high + medium findings on healthy
cases) / healthy cases: the issue's goals (top-1, precision/recall per kind, no high or medium finding
on a healthy case). A healthy case's finding counts there only when the corpus has cases of its kind:
the untouched HTA traces are host-bound, and whether their launch_bound is false the corpus cannot
tell (counting it let the tuning hide it behind small_kernels' marginal gain, at small_kernels'
precision). The table still shows every kind's false findings, as `trainperf evaluate` does.

Thresholds tuned: every UPPER_CASE int/float of diagnose/rules.py (the *_SPEEDUP what-if factors
only with --speedups: they are assumed speed-ups, not detection thresholds), those a rule defined in a module of
its own reads (stragglers.py's, host_bound.py's, layout.py's LAYOUT_TRANSPOSE_MIN_PCT, grad_sync.py's, ...; a
number read only where the facts are collected, once per rank, is not re-run and not tuned) and every number
diagnose/findings.py assigns (severity, dismissal and ranking cut-offs). A rule's threshold is tuned only when the corpus has
cases of its kind (the rule that reads it, from its code): for a kind without positives (launch_bound,
memory_bound_unfused, optimizer_slow, idle_gpu on today's corpus) only false findings can be scored, so
tuning would just switch it off; --one-sided tunes them anyway. The straggler's STRAGGLER_MIN_WAIT_PCT is applied by
api._straggler_facts (it reads stragglers.STRAGGLER_MIN_WAIT_PCT when called): that function is called again, per
value, on the cross-rank facts it was given.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import pickle
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from trainperf.corpus.evaluate import CaseResult, case_folders, labeled_result, read_labels, score
from trainperf.diagnose import api
from trainperf.diagnose import findings as F
from trainperf.diagnose import rules as R
from trainperf.diagnose import stragglers
from trainperf.errors import TrainperfError

FINDINGS_CUTOFFS = ("HIGH_GAIN_PCT", "MEDIUM_GAIN_PCT", "MIN_GAIN_PCT")  # kept ordered (_valid)
STEPS = tuple(2 ** (k / 2) for k in range(-4, 5))  # 0.25x .. 4x the current value, 9 points
HEALTHY_WEIGHT = 1.0
SEVERITY_WEIGHT = 0.1


def _rule_modules() -> dict:
    """The modules whose constants the rules read, by short name: rules.py, findings.py (the severity, dismissal and
    ranking cut-offs) and each module that defines a rule of rules.RULES (layout.py's, grad_sync.py's, ...)."""
    mods = {"rules": R, "findings": F}
    for fn in R.RULES:
        mods.setdefault(fn.__module__.rsplit(".", 1)[-1], sys.modules[fn.__module__])
    return mods


_MODULES = _rule_modules()
# the straggler's wait threshold is applied in api._straggler_facts (it reads stragglers.STRAGGLER_MIN_WAIT_PCT when
# called): the job's straggler is decided again per value from the cross-rank facts that function was given
_GATE = hasattr(api, "_straggler_facts")


@dataclass(kw_only=True)
class Param:
    """One tunable module-level constant: where it lives, its current value and the grid tried."""

    module: str
    name: str
    default: float
    grid: list[float]
    kind: str = "*"  # the finding kinds whose rules read it, comma-separated; "*" for the severity cut-offs (every kind)

    def judged_by(self, labeled: set[str]) -> bool:
        """Whether the corpus has cases of a kind whose rule reads it (every kind for "*")."""
        return self.kind == "*" or any(k in labeled for k in self.kind.split(","))


def _grid(name: str, default: float) -> list[float]:
    """Candidate values around the current one: x0.25 .. x4 (geometric), clipped to the quantity's range."""
    if name.endswith("_RATIO"):  # a ratio >= 1: scale its excess over 1
        vals = [1.0 + (default - 1.0) * m for m in STEPS]
    elif default == 0:
        vals = [0.0, 0.25, 0.5, 1.0, 2.0, 5.0]
    else:
        vals = [default * m for m in STEPS]
    if name.endswith("_SHARE"):
        vals = [min(v, 0.95) for v in vals]
    elif name.endswith("_PCT"):
        vals = [min(v, 100.0) for v in vals]
    if isinstance(default, int) and not isinstance(default, bool):
        vals = [float(round(v)) for v in vals]
    return sorted({round(v, 4) for v in vals} | {float(default)})


def discover_params(speedups: bool = False) -> list[Param]:
    """The tunable constants as they are now (re-read each run): every number rules.py assigns, those a rule of
    another module (_rule_modules) reads, and findings.py's cut-offs. A name is one constant: the first module's."""
    readers: dict[str, str] = {}
    for fn in (*R.RULES, R.idle_gpu):
        for n in sorted(_names_read(fn)):
            readers[n] = f"{readers[n]},{fn.__name__}" if n in readers else fn.__name__
    if _GATE:
        readers.setdefault("STRAGGLER_MIN_WAIT_PCT", "straggler")
    out, seen = [], set()
    for key, module in _MODULES.items():
        if key == "findings":
            continue
        for name in _assigned_numbers(module):
            if name in seen or (name.endswith("_SPEEDUP") and not speedups) or (key != "rules" and name not in readers):
                continue
            seen.add(name)
            v = getattr(module, name)
            out.append(Param(module=key, name=name, default=v, grid=_grid(name, v), kind=readers.get(name, "?")))
    for name in _assigned_numbers(F):  # severity, dismissal and ranking cut-offs: every kind
        out.append(Param(module="findings", name=name, default=getattr(F, name), grid=_grid(name, getattr(F, name))))
    return out


def _names_read(fn) -> set[str]:
    """Global names a rule reads, with those read by the functions of its own module it calls (a threshold a rule
    reads through a helper, host_bound.host_work_min_gap_us, is still that rule's)."""
    seen, todo, names = set(), [fn], set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        names |= set(f.__code__.co_names)
        todo += [g for n in f.__code__.co_names if callable(g := getattr(sys.modules[f.__module__], n, None))
                 and getattr(g, "__module__", None) == f.__module__ and hasattr(g, "__code__")]
    return names


def _assigned_numbers(module) -> list[str]:
    """UPPER_CASE names a module assigns a number literal to itself (not imported constants)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Name) and t.id.isupper() and not t.id.startswith("_"):
                v = getattr(module, t.id, None)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    names.append(t.id)
    return sorted(names)


def _valid(values: dict) -> bool:
    """Severity cut-offs stay ordered: dismissal <= medium < high."""
    hi, med, lo = (values.get(k) for k in FINDINGS_CUTOFFS)
    return not (hi is not None and med is not None and med >= hi) and not (med is not None and lo is not None and lo > med)


# --- capture: each case diagnosed once ---------------------------------------------------------

@dataclass(kw_only=True)
class Case:
    """One corpus case: its labels, its ranks' facts, the ungated straggler and diagnose's own findings."""

    result: CaseResult                 # labels; findings filled per scoring
    facts: list                        # RankFacts per rank, in diagnose's order
    straggler_args: tuple | None = None  # (CrossRank, facts by rank) api._straggler_facts got (GPU jobs)
    stragglers: dict = field(default_factory=dict)  # STRAGGLER_MIN_WAIT_PCT -> its StragglerFacts
    expected: list = field(default_factory=list)  # diagnose()'s findings at the current values
    seconds: float = 0.0


def capture(folder: Path) -> Case:
    """Diagnose one case folder, keeping what a re-run of the rules needs."""
    labels = read_labels(folder)
    seen: list = []
    gate: dict = {}
    orig_rank, orig_strag = api.analyse_rank, getattr(api, "_straggler_facts", None)

    def analyse_rank(f, *a, **k):
        seen.append(f)
        return orig_rank(f, *a, **k)

    def straggler_facts(xr, facts):  # transparent: kept to call again with other STRAGGLER_MIN_WAIT_PCT values
        gate.update(args=(xr, dict(facts)))
        return orig_strag(xr, facts)

    t = time.perf_counter()
    api.analyse_rank = analyse_rank
    if _GATE:
        api._straggler_facts = straggler_facts
    try:
        d = api.diagnose(folder / "traces", top=10_000)
    finally:
        api.analyse_rank = orig_rank
        if _GATE:
            api._straggler_facts = orig_strag
    if not seen:
        raise TrainperfError(f"{folder}: api.diagnose no longer calls api.analyse_rank(facts, ...): "
                             "cv_diagnose cannot capture the per-rank facts")
    return Case(result=labeled_result(folder.name, labels), facts=seen, straggler_args=gate.get("args"),
                expected=[_row(x.to_json()) for x in d.findings], seconds=time.perf_counter() - t)


def straggler_at(c: "Case", wait_pct: float):
    """api._straggler_facts of the case's job with STRAGGLER_MIN_WAIT_PCT = wait_pct (memoised per case)."""
    if wait_pct not in c.stragglers:
        keep = stragglers.STRAGGLER_MIN_WAIT_PCT
        stragglers.STRAGGLER_MIN_WAIT_PCT = wait_pct
        try:
            c.stragglers[wait_pct] = api._straggler_facts(*c.straggler_args)
        finally:
            stragglers.STRAGGLER_MIN_WAIT_PCT = keep
    return c.stragglers[wait_pct]


def _row(f) -> dict:
    """The fields `trainperf evaluate` scores, from a Finding or its JSON."""
    if isinstance(f, dict):
        return {k: f.get(k) for k in ("kind", "severity", "ranks", "gain_pct")}
    return {"kind": f.kind, "severity": f.severity, "ranks": list(f.ranks), "gain_pct": f.gain_pct}


# --- re-running the rules ----------------------------------------------------------------------

class Scorer:
    """Findings of cases under a set of thresholds (memoised per case and values), and their scores."""

    def __init__(self, cases: list[Case], params: list[Param]):
        self.cases = {c.result.name: c for c in cases}
        self.params = params
        self.memo: dict = {}
        self.evaluations = 0
        # kinds the corpus has cases of: only their findings on healthy cases can be called false
        self.judged = frozenset(c.result.kind for c in cases) - {"healthy"}

    def _key(self, values: dict) -> tuple:
        return tuple(values[p.name] for p in self.params)

    def findings(self, name: str, values: dict) -> list[dict]:
        """The merged findings of one case with these threshold values."""
        key = (name, self._key(values))
        if key not in self.memo:
            self.memo[key] = self._rerun(self.cases[name], values)
        return self.memo[key]

    def _rerun(self, c: Case, values: dict) -> list[dict]:
        saved = {p.name: getattr(_MODULES[p.module], p.name) for p in self.params}
        try:
            for p in self.params:
                if p.name != "STRAGGLER_MIN_WAIT_PCT" or not _GATE:
                    setattr(_MODULES[p.module], p.name, values[p.name])
            wait_pct = values.get("STRAGGLER_MIN_WAIT_PCT", stragglers.STRAGGLER_MIN_WAIT_PCT)
            found = []
            for f in c.facts:
                if _GATE and f.has_gpu and c.straggler_args is not None:
                    f.straggler = straggler_at(c, wait_pct)
                found += F.rank_by_marginal_gain(R.run_rules(f), f.gain)[0]
            return [_row(x) for x in F.merge_across_ranks(found)]
        finally:
            for p in self.params:
                setattr(_MODULES[p.module], p.name, saved[p.name])

    def results(self, names: list[str], values: dict) -> list[CaseResult]:
        return [replace(self.cases[n].result, findings=self.findings(n, values)) for n in names]

    def objective(self, names: list[str], values: dict) -> float:
        self.evaluations += 1
        return objective(self.results(names, values), self.judged)


def healthy_high_medium(results: list[CaseResult], judged=None) -> int:
    """High and medium findings on healthy cases, of the kinds in judged (None: every kind)."""
    return sum(1 for r in results if r.kind == "healthy" for f in r.findings
               if f["severity"] in ("high", "medium") and (judged is None or f["kind"] in judged))


def objective(results: list[CaseResult], judged=None) -> float:
    """top-1 + mean per-kind F1 + SEVERITY_WEIGHT x severity agreement - HEALTHY_WEIGHT x high/medium
    findings (of the judged kinds) per healthy case (see the module docstring)."""
    s = score(results)
    f1 = [k["f1"] for k in s["kinds"].values()]
    n_h = s["n_healthy"]
    bad = healthy_high_medium(results, judged) / n_h if n_h else 0.0
    return ((s["top1_accuracy"] or 0.0) + (statistics.mean(f1) if f1 else 0.0)
            + SEVERITY_WEIGHT * (s["severity_agreement"] or 0.0) - HEALTHY_WEIGHT * bad)


# --- tuning ------------------------------------------------------------------------------------

def choose(grid: list[float], scores: list[float], current: float) -> float:
    """The grid value to keep: the middle of the widest run of adjacent optimal values (the run holding
    the current value on a tie); the current value when no value scores differently."""
    best = max(scores)
    if min(scores) >= best - 1e-9 and current in grid:
        return current
    runs, run = [], []
    for i, s in enumerate(scores):
        if s >= best - 1e-9:
            run.append(i)
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    widest = max(len(r) for r in runs)
    cands = [r for r in runs if len(r) == widest]
    pick = next((r for r in cands if current in [grid[i] for i in r]), cands[0])
    return grid[pick[(len(pick) - 1) // 2]]


def tune(scorer: Scorer, names: list[str], params: list[Param], sweeps: int, margin: float,
         tick=None) -> tuple[dict, float]:
    """Coordinate descent from the current values over the grid of each of params (the scorer's other
    parameters stay at their current values); a parameter moves only when that improves the training
    objective by more than margin. Returns (values, training objective)."""
    values = {p.name: p.default for p in scorer.params}
    best = scorer.objective(names, values)
    if math.isinf(margin):
        return values, best
    for _ in range(sweeps):
        changed = False
        for p in params:
            scores = []
            for v in p.grid:
                trial = {**values, p.name: v}
                scores.append(scorer.objective(names, trial) if _valid(trial) else -math.inf)
            here = scores[p.grid.index(values[p.name])] if values[p.name] in p.grid else -math.inf
            pick = choose(p.grid, scores, values[p.name]) if max(scores) > here + margin + 1e-9 else values[p.name]
            if pick != values[p.name]:
                changed = True
                values[p.name] = pick
            best = max(best, scores[p.grid.index(pick)]) if pick in p.grid else best
            if tick is not None:
                tick(f"{p.name}={pick:g} J={best:.3f}")
        if not changed:
            break
    return values, scorer.objective(names, values)


class NestedCV:
    """Leave-one-base-out tuning at two levels: the margin (how much a threshold must improve the training
    objective to move from its current value) is chosen by LOBO inside the training bases, the thresholds
    by coordinate descent on all of them. Fits are memoised per (training bases, margin)."""

    def __init__(self, scorer: Scorer, params: list[Param], sweeps: int, margins: tuple, tick=None):
        self.scorer, self.params, self.sweeps, self.margins, self.tick = scorer, params, sweeps, margins, tick
        self.by_base: dict[str, list[str]] = {}
        for n, c in scorer.cases.items():
            self.by_base.setdefault(c.result.base, []).append(n)
        self._fits: dict = {}

    def fit(self, bases: frozenset, margin: float) -> dict:
        key = (bases, margin)
        if key not in self._fits:
            names = [n for b in sorted(bases) for n in self.by_base[b]]
            label = f"tune on {len(bases)} bases, margin {margin:g}:"
            tick = (lambda what: self.tick(f"{label} {what}")) if self.tick else None
            self._fits[key] = tune(self.scorer, names, self.params, self.sweeps, margin, tick)[0]
        return self._fits[key]

    def lobo(self, bases: frozenset, margin: float) -> list[CaseResult]:
        """The cases of every base in bases, each diagnosed with the values tuned on the others (pooled)."""
        out = []
        for b in sorted(bases):
            out += self.scorer.results(self.by_base[b], self.fit(bases - {b}, margin))
        return out

    def choose_margin(self, bases: frozenset) -> tuple[float, dict]:
        """The margin whose LOBO objective inside bases is best (ties: the larger, more conservative)."""
        scores = {m: objective(self.lobo(bases, m), self.scorer.judged) for m in self.margins}
        best = max(scores.values())
        return max(m for m, v in scores.items() if v >= best - 1e-9), scores


# --- report ------------------------------------------------------------------------------------

def summary(results: list[CaseResult], judged=None) -> dict:
    """The evaluate scores plus the objective's own terms."""
    s = score(results)
    f1 = [k["f1"] for k in s["kinds"].values()]
    s["mean_f1"] = round(statistics.mean(f1), 4) if f1 else None
    s["healthy_high_medium_judged_kinds"] = healthy_high_medium(results, judged)
    s["objective"] = round(objective(results, judged), 4)
    return s


def per_base_scores(results: list[CaseResult]) -> dict:
    """The figures of one base's cases: top-1, precision/recall per labeled kind, healthy false findings by
    severity, what-if median and max |error| (pp), case count."""
    s = score(results)
    return {"n": s["n_cases"], "top1_accuracy": s["top1_accuracy"],
            "kinds": {k: [v["precision"], v["recall"], v["n"]] for k, v in s["kinds"].items()},
            "healthy_false_findings": s["healthy_false_findings"],
            "whatif_median_abs_error_pct": s["whatif_median_abs_error_pct"],
            "whatif_max_abs_error_pct": s["whatif_max_abs_error_pct"]}


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src/trainperf/diagnose"], capture_output=True,
                               text=True, cwd=Path(__file__).parent).stdout.strip()
        return sha + ("+uncommitted diagnose changes" if dirty else "")
    except OSError:
        return "unknown"


def _print(report: dict, console) -> None:
    from rich.table import Table

    m = report["metrics"]
    cols = ("current_values", "in_sample", "out_of_sample")
    t = Table(title="diagnose on the corpus: current thresholds, tuned (in-sample), tuned per outer fold "
                    "(out-of-sample, leave-one-base-out)")
    t.add_column("metric")
    for c in cols:
        t.add_column(c.replace("_", " "), justify="right")
    rows = [("objective", "objective"), ("top-1 accuracy", "top1_accuracy"), ("mean per-kind F1", "mean_f1"),
            ("severity agreement", "severity_agreement"),
            ("what-if median |err| pp", "whatif_median_abs_error_pct")]
    for label, k in rows:
        t.add_row(label, *(_fmt(m[c][k]) for c in cols))
    t.add_row("healthy: high+medium of judged kinds", *(str(m[c]["healthy_high_medium_judged_kinds"]) for c in cols))
    t.add_row("healthy false high/medium/low",
              *("/".join(str(m[c]["healthy_false_findings"][s]) for s in ("high", "medium", "low")) for c in cols))
    for kind in m["in_sample"]["kinds"]:
        t.add_row(f"{kind} P/R", *(f"{_fmt(m[c]['kinds'][kind]['precision'])}/{_fmt(m[c]['kinds'][kind]['recall'])}"
                                   for c in cols))
    console.print(t)
    console.print(f"margin chosen by LOBO on all bases: {report['margin_chosen']:g} (objective by margin: "
                  f"{report['lobo_objective_by_margin']}); per outer fold: "
                  + ", ".join(f"w/o {f['held_out']}: {f['margin']:g}" for f in report["folds"]))
    o = Table(title="outer folds: the held-out base diagnosed with the current values and with those tuned without it")
    for c in ("held-out base", "cases", "margin", "top-1 current", "top-1 tuned", "healthy high+medium current",
              "healthy high+medium tuned"):
        o.add_column(c, justify="left" if c == "held-out base" else "right")
    for f in report["folds"]:
        o.add_row(f["held_out"], str(f["n_test"]), f"{f['margin']:g}", _fmt(f["test_top1_current"]),
                  _fmt(f["test_top1_tuned"]), str(f["test_healthy_high_medium_current"]),
                  str(f["test_healthy_high_medium_tuned"]))
    console.print(o)
    pb = Table(title="per base (current values | out of sample): top-1, healthy false high/medium/low, what-if "
                     "median/max |err| pp")
    for c in ("base", "cases", "top-1", "healthy h/m/l", "what-if med/max"):
        pb.add_column(c, justify="left" if c == "base" else "right")
    for b, v in report.get("per_base", {}).items():
        cur, oos = v["current_values"], v["out_of_sample"]
        pb.add_row(b, str(cur["n"]), f"{_fmt(cur['top1_accuracy'])} | {_fmt(oos['top1_accuracy'])}",
                   " | ".join("/".join(str(x["healthy_false_findings"][k]) for k in ("high", "medium", "low"))
                              for x in (cur, oos)),
                   " | ".join(f"{_fmt(x['whatif_median_abs_error_pct'])}/{_fmt(x['whatif_max_abs_error_pct'])}"
                              for x in (cur, oos)))
    console.print(pb)
    p = Table(title="thresholds: current, recommended (all bases), chosen per outer fold (held-out base)")
    p.add_column("constant")
    p.add_column("current", justify="right")
    p.add_column("recommended", justify="right")
    for b in report["bases"]:
        p.add_column(f"w/o {b}", justify="right")
    p.add_column("stable")
    for x in report["params"]:
        note = "" if x["tuned"] else " kept: no case of its kind"
        note += "" if x["has_effect"] else " no effect"
        note += " one base only" if len(x["bases_affected"]) == 1 else ""
        note += f" plateau {x['plateau'][0]:g}-{x['plateau'][1]:g}" if x["plateau"] and x["has_effect"] else ""
        p.add_row(x["name"], f"{x['current']:g}", f"{x['recommended']:g}",
                  *(f"{x['folds'][b]:g}" for b in report["bases"]),
                  f"{x['folds_agreeing']}/{len(report['bases'])}{note}")
    console.print(p)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def run(corpus: Path, sweeps: int, speedups: bool, one_sided: bool, progress: bool, console,
        margins: tuple = (0.0, 0.03, 0.1, math.inf), cache: Path | None = None,
        only: frozenset[str] | None = None) -> dict:
    """Capture every case, tune per outer fold and on all bases; return the report dict. only: tune just these
    thresholds (the others keep their values), as when one rule changed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t0 = time.perf_counter()
    params = discover_params(speedups)
    if only is not None and (unknown := only - {p.name for p in params}):
        raise TrainperfError(f"--only: no tunable threshold named {', '.join(sorted(unknown))}")
    folders = [c for c in case_folders(corpus) if (c / "traces").is_dir()]

    def bar():
        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        disable=not progress, console=console)

    key = _cache_key(folders) if cache is not None else ""
    cases = _load_cache(cache, key)
    if cases is None:
        cases = []
        with bar() as pb:
            task = pb.add_task("diagnosing", total=len(folders))
            for c in folders:
                pb.update(task, description=f"diagnosing {c.name}")
                cases.append(capture(c))
                pb.advance(task)
        if cache is not None:
            cache.write_bytes(pickle.dumps((key, cases)))
    capture_s = time.perf_counter() - t0
    scorer = Scorer(cases, params)
    names = [c.result.name for c in cases]
    current = {p.name: p.default for p in params}
    mismatches = [c.result.name for c in cases if scorer.findings(c.result.name, current) != c.expected]
    if mismatches:
        console.print(f"[yellow]warning: the re-run of the rules differs from diagnose() at the current values on "
                      f"{len(mismatches)} case(s): {', '.join(mismatches[:5])}")
    # the bases in which a parameter changes any case's findings over its grid (from the current values):
    # a value only one base reacts to is never scored out of sample
    base_rows = {n: scorer.findings(n, current) for n in names}
    effect = {p.name: sorted({scorer.cases[n].result.base for n in names for v in p.grid
                              if _valid({**current, p.name: v}) and scorer.findings(n, {**current, p.name: v})
                              != base_rows[n]}) for p in params if only is None or p.name in only}
    bases = frozenset(c.result.base for c in cases)
    labeled = {c.result.kind for c in cases} - {"healthy"}
    # a threshold of a kind the corpus has no case of can only be scored by its false findings: one-sided
    tuned = [p for p in params if (one_sided or p.judged_by(labeled)) and (only is None or p.name in only)]
    finite = [m for m in margins if not math.isinf(m)]
    n_fits = (1 + len(bases) + len(bases) * (len(bases) - 1) // 2) * len(finite)
    with bar() as pb:
        task = pb.add_task("tuning", total=n_fits * sweeps * len(tuned))
        cv = NestedCV(scorer, tuned, sweeps, tuple(margins), tick=lambda what: pb.update(task, advance=1,
                                                                                          description=what))
        folds, oos = [], []
        for b in sorted(bases):
            inner = bases - {b}
            m, inner_scores = cv.choose_margin(inner)
            values = cv.fit(inner, m)
            held = scorer.results(cv.by_base[b], values)
            oos += held
            now = scorer.results(cv.by_base[b], current)
            folds.append({"held_out": b, "n_test": len(held), "margin": m,
                          "inner_lobo_objective": {str(k): round(v, 4) for k, v in inner_scores.items()},
                          "values": values, "test_top1_tuned": summary(held, scorer.judged)["top1_accuracy"],
                          "test_top1_current": summary(now, scorer.judged)["top1_accuracy"],
                          "test_healthy_high_medium_tuned": healthy_high_medium(held),
                          "test_healthy_high_medium_current": healthy_high_medium(now)})
        m_all, lobo_scores = cv.choose_margin(bases)
        tuned_all = cv.fit(bases, m_all)
        plateau = {p.name: _plateau(scorer, names, p, tuned_all) for p in tuned}
        by_margin = {str(m): summary(cv.lobo(bases, m), scorer.judged) for m in margins}
        pb.update(task, completed=n_fits * sweeps * len(tuned))
    metrics = {"current_values": summary(scorer.results(names, current), scorer.judged),
               "in_sample": summary(scorer.results(names, tuned_all), scorer.judged),
               "out_of_sample": summary(oos, scorer.judged)}
    per_base = {b: {"current_values": per_base_scores(scorer.results(cv.by_base[b], current)),
                    "out_of_sample": per_base_scores([r for r in oos if r.base == b])} for b in sorted(bases)}
    for m in [*metrics.values(), *by_margin.values()]:
        m.pop("top1_misses", None)
    prm = []
    for p in params:
        fv = {f["held_out"]: f["values"][p.name] for f in folds}
        prm.append({"module": p.module, "name": p.name, "kind": p.kind, "tuned": p in tuned,
                    "one_sided": not p.judged_by(labeled),
                    "current": p.default, "recommended": tuned_all[p.name],
                    "folds": fv, "folds_agreeing": sum(1 for v in fv.values() if v == tuned_all[p.name]),
                    "fold_range": [min(fv.values()), max(fv.values())] if fv else None,
                    "has_effect": bool(effect.get(p.name)), "bases_affected": effect.get(p.name, []),
                    "validated_out_of_sample": len(effect.get(p.name, [])) >= 2,
                    "plateau": plateau.get(p.name), "grid": p.grid})
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": platform.node(),
            "python": platform.python_version(), "commit": _commit(), "corpus": str(corpus),
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "n_cases": len(cases),
            "bases": sorted(bases),
            "objective": {"formula": "top1 + mean_f1 + %g*severity_agreement - %g*healthy_high_medium_per_case "
                                     "(judged kinds: %s)" % (SEVERITY_WEIGHT, HEALTHY_WEIGHT,
                                                             ", ".join(sorted(scorer.judged))), "sweeps": sweeps,
                          "margins": [str(m) for m in margins], "one_sided_tuned": one_sided,
                          "only": sorted(only) if only is not None else None},
            "margin_chosen": m_all, "lobo_objective_by_margin": {str(k): round(v, 4) for k, v in lobo_scores.items()},
            "out_of_sample_by_fixed_margin": by_margin,
            "metrics": metrics, "recommended": {p.name: tuned_all[p.name] for p in params},
            "changed": {p.name: [p.default, tuned_all[p.name]] for p in params if tuned_all[p.name] != p.default},
            "changed_and_validated": {p.name: [p.default, tuned_all[p.name]] for p in params
                                      if tuned_all[p.name] != p.default and len(effect.get(p.name, [])) >= 2},
            "params": prm, "folds": folds, "per_base": per_base, "rerun_mismatches": mismatches,
            "seconds": {"capture": round(capture_s, 1), "total": round(time.perf_counter() - t0, 1)},
            "evaluations": scorer.evaluations}


def _cache_key(folders: list[Path]) -> str:
    """What the captured facts depend on: diagnose's and the trace loader's code (not rules.py and findings.py,
    whose numbers this script varies; the rules in modules of their own count, as some keep an analysis on the facts:
    host_bound.host_work's call correlation) and the corpus files (names, sizes, modification times)."""
    h = hashlib.sha256()
    src = Path(api.__file__).resolve().parents[1]
    for f in sorted([*src.glob("diagnose/*.py"), *src.glob("trace/**/*.py")]):
        if f.name not in ("rules.py", "findings.py"):
            h.update(f.name.encode() + f.read_bytes())
    for c in folders:
        for f in sorted(c.rglob("*")):
            if f.is_file():
                st = f.stat()
                h.update(f"{f.relative_to(c.parent)} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()


def _plateau(scorer: Scorer, names: list[str], p: Param, values: dict) -> list[float]:
    """[lo, hi] of the values of p, on a grid 8 times finer between the chosen value's grid neighbours,
    that score as well as the chosen one on names (the others at values): any of them is as good."""
    i = p.grid.index(values[p.name]) if values[p.name] in p.grid else None
    if i is None:
        return [values[p.name], values[p.name]]
    lo, hi = p.grid[max(i - 1, 0)], p.grid[min(i + 1, len(p.grid) - 1)]
    fine = sorted({round(lo + (hi - lo) * k / 16, 4) for k in range(17)} | {values[p.name]})
    ok = [v for v in fine if _valid({**values, p.name: v})]
    best = scorer.objective(names, values)
    good = [v for v in ok if scorer.objective(names, {**values, p.name: v}) >= best - 1e-9]
    return [min(good), max(good)] if good else [values[p.name], values[p.name]]


def _load_cache(cache: Path | None, key: str) -> list[Case] | None:
    if cache is None or not cache.is_file():
        return None
    try:
        stored, cases = pickle.loads(cache.read_bytes())
    except Exception:  # a cache of an older script or class layout: capture again
        return None
    return cases if stored == key else None


def main(argv: list[str] | None = None) -> int:
    global HEALTHY_WEIGHT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", default="corpus", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="write the report (recommended values, folds) here")
    ap.add_argument("--sweeps", type=int, default=3, help="coordinate-descent sweeps at most (default 3)")
    ap.add_argument("--speedups", action="store_true", help="also tune the *_SPEEDUP what-if factors")
    ap.add_argument("--one-sided", action="store_true",
                    help="also tune thresholds of kinds the corpus has no case of (only their false findings score)")
    ap.add_argument("--healthy-weight", type=float, default=HEALTHY_WEIGHT,
                    help=f"objective weight of high/medium findings per healthy case (default {HEALTHY_WEIGHT:g})")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--cache", type=Path, default=None,
                    help="pickle of the captured cases: reused while diagnose's analyses (all but rules.py and "
                         "findings.py) and the corpus files are unchanged, written otherwise")
    ap.add_argument("--only", default=None, help="comma-separated thresholds to tune; the others keep their values")
    a = ap.parse_args(argv)
    from rich.console import Console

    from trainperf.atomic import atomic_write_text

    HEALTHY_WEIGHT = a.healthy_weight

    console = Console() if sys.stdout.isatty() else Console(width=200)
    only = frozenset(a.only.split(",")) if a.only else None
    try:
        report = run(a.corpus, a.sweeps, a.speedups, a.one_sided, not a.no_progress, console, cache=a.cache, only=only)
    except TrainperfError as e:
        console.print(f"[red]error: {e}")
        return 2
    _print(report, console)
    console.print(f"recommended changes: {report['changed'] or 'none'}; of them affecting >= 2 bases (validated "
                  f"out of sample): {report['changed_and_validated'] or 'none'}; {report['evaluations']} evaluations, "
                  f"{report['seconds']['total']:.0f} s (capture {report['seconds']['capture']:.0f} s)")
    if a.json:
        atomic_write_text(a.json, json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
