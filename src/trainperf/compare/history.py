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

**Hosts.** When A and B ran on different hosts, their means also differ by how much one host's level
differs from another's (another node of the same kind: its clocks, cooling, memory, neighbours), which
neither repeats on one host nor two runs can show. Runs of one configuration on several hosts of one
device kind, in the store, measure it: a one-way random-effects ANOVA with hosts as the groups (Searle,
Casella & McCulloch, "Variance Components", 1992, the unbalanced ANOVA estimator): sigma_host^2 =
(MSB - MSW) / n0, pooled over configurations, with Satterthwaite's degrees of freedom (``host_spread``).
The hosts' term is weight x sigma_host^2 (``interval.HostSpread``). Without such runs the spread is
unknown and compare says the change cannot be told from the hosts (``hosts_between``).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np

from trainperf.compare.interval import DEFAULT_BETWEEN, BetweenRun, HostSpread, long_run_variance
from trainperf.compare.runs import RunData

# keys of a run's configuration that do not change the cost of a step (or are measured results)
NOT_SPEED = frozenset({"seed", "data", "lr", "steps", "eval_every", "eval_batches", "eval", "out", "store", "summary",
                       "final_eval_loss", "resumed_from", "job", "record", "progress", "log_every", "resume"})
MIN_RUN_STEPS = 10  # a history run with fewer steady steps says little about its level
PRIOR_DF = 2.0  # the default between-run term's weight, in degrees of freedom, beside a measured history
MAX_HISTORY_RUNS = 60  # the latest repeats a host's history is read from (each costs a change-point pass)
MAX_HOST_RUNS = 120  # the latest runs of configurations run on several hosts that the hosts' spread is read from


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


def record_levels(recs):
    """Yield (store record, (log mean seconds per token, variance of that log mean)) for each record
    with enough steady steps (``run_level``); records without per-step samples are left out."""
    from trainperf.compare.runs import from_record
    from trainperf.errors import TrainperfError

    for rec in recs:
        try:
            lv = run_level(from_record(rec))
        except TrainperfError:
            continue
        if lv is not None:
            yield rec, lv[:2]


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
        for rec, lv in record_levels(recs):
            levels.setdefault(keys[rec.run_id], []).append(lv)
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


def host_spread(groups: dict[str, dict[str, list[tuple[float, float]]]],
                within: float | None = None) -> tuple[float, float, int, int]:
    """Return (sigma_host^2 in log units squared, its degrees of freedom, hosts used, configurations used)
    from runs' (log mean, variance of the log mean) grouped by configuration, then host (module doc: the
    unbalanced one-way ANOVA with hosts as groups, pooled over configurations that ran on two hosts or
    more). MSW is the pooled variance of runs on one host; where no host ran a configuration twice, it is
    ``within`` (the one-host between-run variance, log units squared) plus the runs' own mean variance.
    Degrees of freedom 0 when no configuration ran on two hosts."""
    ssb = ssw = df_b = df_w = n0_sum = 0.0
    run_var, hosts, configs = [], set(), 0
    for by_host in groups.values():
        rows = {h: np.array([r[0] for r in v]) for h, v in by_host.items() if v}
        if len(rows) < 2:
            continue
        configs += 1
        n_h = np.array([len(v) for v in rows.values()], dtype=float)
        n = n_h.sum()
        grand = np.concatenate(list(rows.values())).mean()
        ssb += float(sum(len(v) * (v.mean() - grand) ** 2 for v in rows.values()))
        ssw += float(sum(((v - v.mean()) ** 2).sum() for v in rows.values()))
        df_b += len(rows) - 1
        df_w += n - len(rows)
        n0_sum += n - float((n_h**2).sum()) / n
        run_var += [r[1] for v in by_host.values() for r in v]
        hosts |= set(rows)
    if not df_b:
        return 0.0, 0.0, 0, 0
    msb, n0 = ssb / df_b, n0_sum / df_b
    if df_w:
        msw, msw_df = ssw / df_w, df_w
    else:  # no host ran a configuration twice: the one-host spread from elsewhere, plus the runs' own noise
        msw, msw_df = (within or 0.0) + float(np.mean(run_var)), math.inf
    sigma2 = max((msb - msw) / n0, 0.0)
    # Satterthwaite's df of a difference of mean squares; a 0 estimate adds nothing, any df will do
    df = (msb - msw) ** 2 / (msb**2 / df_b + msw**2 / msw_df) if sigma2 > 0 else df_b
    return sigma2, float(df), len(hosts), configs


def host_mix(a_runs: list[RunData], b_runs: list[RunData]) -> float:
    """Return sum over hosts of (B's share of runs on the host - A's share)^2: the weight of the hosts'
    variance in the difference of the sides' means (2: one run a side, two hosts; 0: same hosts, same shares)."""
    hosts = {r.host for r in a_runs + b_runs}
    return float(sum((sum(r.host == h for r in b_runs) / len(b_runs) - sum(r.host == h for r in a_runs) / len(a_runs))
                     ** 2 for h in hosts))


def hosts_between(a_runs: list[RunData], b_runs: list[RunData], store: str | None = None,
                  within: BetweenRun = DEFAULT_BETWEEN) -> HostSpread | None:
    """Return the hosts' term of A against B (``interval.HostSpread``): None when both sides ran on the
    same hosts in the same shares (or a run's host is not recorded); else how much hosts of the runs'
    device kind differ, from the store's runs of configurations run on two hosts or more (the compared
    runs left out; ``within``: the one-host between-run term, used where no host ran a configuration
    twice), or an unknown spread (cv inf) when the store holds none."""
    from trainperf.store import read_runs

    runs = a_runs + b_runs
    weight = host_mix(a_runs, b_runs)
    if weight <= 0 or any(not r.host for r in runs):
        return None
    sides = (tuple(sorted({r.host for r in a_runs})), tuple(sorted({r.host for r in b_runs})))
    exclude = {r.run_id for r in runs if r.run_id} | {r.name for r in runs}
    groups: dict[str, dict[str, list[tuple[float, float]]]] = {}
    try:
        heads = [r for r in read_runs(store, samples=False) if r.run_id not in exclude and r.kind == "train" and r.host]
        keys = {r.run_id: f"{r.gpu_model}|{speed_key(r)}" for r in heads}  # hosts of one device kind
        spans: dict[str, set] = {}
        for r in heads:
            spans.setdefault(keys[r.run_id], set()).add(r.host)
        ids = [r.run_id for r in heads if len(spans[keys[r.run_id]]) >= 2][-MAX_HOST_RUNS:]
        recs = read_runs(store, run_ids=ids) if ids else []
    except Exception:  # noqa: BLE001 - no store, or one that cannot answer: nothing measured
        recs = []
    for rec, lv in record_levels(recs):
        groups.setdefault(keys[rec.run_id], {}).setdefault(rec.host, []).append(lv)
    sigma2, df, n_hosts, configs = host_spread(groups, within.cv**2)
    if not df:
        return HostSpread(cv=math.inf, df=math.inf, weight=weight, hosts=sides,
                          source="the store holds no runs of one configuration on two hosts (how much hosts differ "
                                 "is unknown)")
    return HostSpread(cv=math.sqrt(sigma2), df=df, weight=weight, hosts=sides,
                      source=f"the store's runs of {configs} configuration(s) on {n_hosts} hosts, {df:.0f} df")


def between_floor(a_runs: list[RunData], b_runs: list[RunData], store: str | None = None) -> BetweenRun:
    """Return the between-run term before the runs' own drift is seen, as `compare` and `gate` take it.
    One run a side: the store's history on the runs' hosts when it has one, else
    ``interval.DEFAULT_BETWEEN``. Repeats: the default, whose cv the repeats' own spread replaces. Either
    way with the hosts' term (``hosts_between``) when A and B ran on different hosts: the repeats measure
    their spread on their hosts, not a difference of hosts."""
    if len(a_runs) != 1 or len(b_runs) != 1:
        return replace(DEFAULT_BETWEEN, hosts=hosts_between(a_runs, b_runs, store))
    runs = a_runs + b_runs
    hosts = {r.host for r in runs}
    found = history_between(hosts, {r.run_id for r in runs if r.run_id} | {r.name for r in runs}, store)
    floor = found or DEFAULT_BETWEEN
    return replace(floor, hosts=hosts_between(a_runs, b_runs, store, floor))
