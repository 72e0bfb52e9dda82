"""The between-run term from the run store: how much repeated runs of one configuration on a host differ.

With one run a side, the difference of two runs' means holds the change *and* how much a run's
level moves from one run to the next; the two runs cannot tell these apart. Repeated runs of one
configuration on the same host, already in the store, measure the second: each run's steady log
mean (seconds per token, ``compare.perf``'s steady steps) deviates from its configuration's mean
by the between-run term plus its own step noise, so (method of moments, as a one-way random-effects
ANOVA) tau^2 = pooled variance of the log means within configurations - the mean variance of a
run's mean from its steps (``interval.long_run_variance``), floored at 0. The stated default
(``interval.DEFAULT_BETWEEN_CV``) enters as a prior worth ``PRIOR_DF`` degrees of freedom, so a
history of three quiet runs does not claim a perfectly steady machine.

Configurations are grouped by what sets a step's cost (model, layout, precision, kernels, compile,
faults, versions): the seed, data, learning rate and run length are left out of the key.
"""

from __future__ import annotations

import json
import math

import numpy as np

from trainperf.compare.interval import DEFAULT_BETWEEN, BetweenRun, long_run_variance
from trainperf.compare.runs import RunData

# keys of a run's configuration that do not change the cost of a step (or are measured results)
NOT_SPEED = frozenset({"seed", "data", "lr", "steps", "eval_every", "eval_batches", "eval", "out", "store", "summary",
                       "final_eval_loss", "resumed_from", "job", "record", "progress", "log_every", "resume"})
MIN_RUN_STEPS = 10  # a history run with fewer steady steps says little about its level
PRIOR_DF = 2.0  # the default between-run term's weight, in degrees of freedom, beside a measured history
MAX_HISTORY_RUNS = 60  # the latest repeats a host's history is read from (each costs a change-point pass)


def speed_key(rec) -> str:
    """Return the key grouping a store RunRecord with runs of the same per-step cost (module doc)."""
    conf = rec.config.get("comparable") or rec.config
    kept = {k: v for k, v in conf.items() if k not in NOT_SPEED}
    return json.dumps({"conf": kept, "model": rec.model, "layout": rec.layout, "job": rec.kind}, sort_keys=True,
                      default=str)


def run_level(run: RunData) -> tuple[float, float, int] | None:
    """Return (log mean seconds per token over the steady steps, the variance of that log mean from
    the steps' long-run variance, steady steps) of ``run``; None when it has too few steady steps."""
    from trainperf.compare.perf import seconds_per_token, steady_slice

    x = seconds_per_token(run)[steady_slice(run.step_time_s)]
    x = x[np.isfinite(x) & (x > 0)]
    if len(x) < MIN_RUN_STEPS:
        return None
    v = long_run_variance(x)
    return math.log(v.mean), v.variance / (v.n * v.mean**2), v.n


def pooled_between(levels: dict[str, list[tuple[float, float]]]) -> tuple[float, float, int]:
    """Return (tau^2 in log units squared, degrees of freedom, runs used) from groups of (log mean,
    variance of the log mean) pairs, one group per configuration (module doc); df 0 when no group
    has two runs."""
    ss, df, within, used = 0.0, 0, [], 0
    for rows in levels.values():
        if len(rows) < 2:
            continue
        m = np.array([r[0] for r in rows])
        ss += float(((m - m.mean()) ** 2).sum())
        df += len(rows) - 1
        within += [r[1] for r in rows]
        used += len(rows)
    if not df:
        return 0.0, 0.0, 0
    return max(ss / df - float(np.mean(within)), 0.0), float(df), used


def history_between(hosts: set[str], exclude: set[str], store: str | None = None) -> BetweenRun | None:
    """Return the between-run term measured by the store's repeated runs on ``hosts`` (the latest
    ``MAX_HISTORY_RUNS`` a host; run ids in ``exclude`` left out: the runs being compared), combined
    with the default as a ``PRIOR_DF`` prior; None when the store holds no configuration run twice
    there (or cannot be read)."""
    from trainperf.compare.runs import from_record
    from trainperf.errors import TrainperfError
    from trainperf.store import read_runs

    levels: dict[str, list[tuple[float, float]]] = {}
    for host in sorted(hosts):
        try:  # run-level fields first (fast), then the samples of the repeats only
            heads = [r for r in read_runs(store, host=host, samples=False)
                     if r.run_id not in exclude and r.kind == "train"]
            keys = {r.run_id: host + "|" + speed_key(r) for r in heads}
            count: dict[str, int] = {}
            for k in keys.values():
                count[k] = count.get(k, 0) + 1
            ids = [r.run_id for r in heads if count[keys[r.run_id]] >= 2]
            ids = ids[-MAX_HISTORY_RUNS:]  # read oldest first: the latest ones
            recs = read_runs(store, run_ids=ids) if ids else []
        except Exception:  # noqa: BLE001 - no store, or one that cannot answer: no history (the default stands)
            return None
        for rec in recs:
            try:
                lv = run_level(from_record(rec))
            except TrainperfError:
                continue
            if lv is not None:
                levels.setdefault(keys[rec.run_id], []).append(lv[:2])
    tau2, df, used = pooled_between(levels)
    if not df:
        return None
    prior = DEFAULT_BETWEEN.cv**2
    cv = math.sqrt((df * tau2 + PRIOR_DF * prior) / (df + PRIOR_DF))
    where = ", ".join(sorted(hosts)) or "an unnamed host"
    configs = sum(len(v) >= 2 for v in levels.values())
    return BetweenRun(cv=cv, df=df + PRIOR_DF,
                      source=(f"the store's history ({used} repeated runs of {configs} configuration(s) on {where}: "
                              f"{math.sqrt(tau2):.1%} over {df:.0f} df, with the {prior ** 0.5:.1%} default as a "
                              f"{PRIOR_DF:.0f}-df prior)"))


def between_floor(a_runs: list[RunData], b_runs: list[RunData], store: str | None = None) -> BetweenRun:
    """Return the between-run term before the runs' own drift is seen: the store's history on the
    runs' hosts when it has one, else ``interval.DEFAULT_BETWEEN``."""
    runs = a_runs + b_runs
    hosts = {r.host for r in runs}
    found = history_between(hosts, {r.run_id for r in runs if r.run_id} | {r.name for r in runs}, store)
    return found or DEFAULT_BETWEEN
