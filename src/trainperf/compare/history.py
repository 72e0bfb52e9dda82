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
The hosts' term is weight x sigma_host^2 (``interval.HostSpread``). That term holds any two hosts of
the kind; when the store has runs on the very hosts compared, their own offset is measured instead
(``host_offset``: log level = configuration + host, least squares over every configuration run on two
hosts or more, the hosts linked through the configurations they share): the change is corrected by
it, and the interval holds only its estimate's error (plus how much a host's offset varies from one
configuration to another, where several configurations show it). This assumes a host's level scales
every configuration alike (clocks, cooling, neighbours); a configuration that meets a host's slow
memory harder than the stored ones is what the per-configuration term is for. Without runs across
hosts the spread is unknown and compare says the change cannot be told from the hosts
(``hosts_between``).

The store is read once for both terms (``read_levels``): the run rows, then the samples of the runs
either term uses, each run's steady level computed once.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

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


@dataclass(kw_only=True)
class StoreLevels:
    """What the between-run and hosts' terms read of the store, in one pass (``read_levels``): the train
    runs' rows (no samples; the compared runs left out) and the steady level (log mean seconds per token,
    variance of that log mean; ``run_level``) of the runs either term uses."""

    heads: list = field(default_factory=list)  # store RunRecords without samples, oldest first
    levels: dict[str, tuple[float, float]] = field(default_factory=dict)  # run id -> level


def _repeat_ids(heads: list, hosts: set[str]) -> list[str]:
    """Return the ids of the runs of a configuration run twice or more on one of ``hosts`` (the latest
    ``MAX_HISTORY_RUNS`` a host): the history of repeats ``history_between`` reads."""
    ids = []
    for host in sorted(hosts):
        mine = [(r.run_id, speed_key(r)) for r in heads if r.host == host]
        count: dict[str, int] = {}
        for _, key in mine:
            count[key] = count.get(key, 0) + 1
        ids += [run_id for run_id, key in mine if count[key] >= 2][-MAX_HISTORY_RUNS:]
    return ids


def _host_key(rec) -> str:
    return f"{rec.gpu_model}|{speed_key(rec)}"  # a configuration on hosts of one device kind


def _across_ids(heads: list) -> list[str]:
    """Return the ids of the latest ``MAX_HOST_RUNS`` runs of configurations run on two hosts or more (of one
    device kind): what ``hosts_between`` reads."""
    spans: dict[str, set] = {}
    for r in heads:
        if r.host:
            spans.setdefault(_host_key(r), set()).add(r.host)
    return [r.run_id for r in heads if r.host and len(spans[_host_key(r)]) >= 2][-MAX_HOST_RUNS:]


def read_levels(store: str | None, exclude: set[str], hosts: set[str] = frozenset(),
                across: bool = False) -> StoreLevels | None:
    """Return the store's train runs (``exclude``: run ids left out, the compared runs) with the steady levels
    of the repeats on ``hosts`` and, when ``across``, of the configurations run on several hosts; the run
    rows are read once (only one host's when that is all the history needs) and the samples of the union
    once. None when the store cannot be read."""
    from trainperf.store import read_runs

    one_host = next(iter(hosts)) if len(hosts) == 1 and not across else None
    try:
        heads = [r for r in read_runs(store, samples=False, host=one_host)
                 if r.run_id not in exclude and r.kind == "train"]
        ids = list(dict.fromkeys(_repeat_ids(heads, hosts) + (_across_ids(heads) if across else [])))
        recs = read_runs(store, run_ids=ids) if ids else []
    except Exception:  # noqa: BLE001 - no store, or one that cannot answer: nothing measured
        return None
    return StoreLevels(heads=heads, levels={rec.run_id: lv for rec, lv in record_levels(recs)})


def history_between(hosts: set[str], exclude: set[str], store: str | None = None,
                    read: StoreLevels | None = None) -> BetweenRun | None:
    """Return the between-run term measured by the store's repeated runs on ``hosts`` (the latest
    ``MAX_HISTORY_RUNS`` a host; run ids in ``exclude`` left out: the runs being compared), combined
    with the default as a ``PRIOR_DF`` prior; None when the store holds no configuration run twice
    there (or cannot be read). ``read``: the store as ``read_levels`` read it (else it is read here)."""
    read = read if read is not None else read_levels(store, exclude, hosts)
    if read is None:
        return None
    keys = {r.run_id: r.host + "|" + speed_key(r) for r in read.heads}
    levels: dict[str, list[tuple[float, float]]] = {}
    for run_id in _repeat_ids(read.heads, hosts):
        if run_id in read.levels:
            levels.setdefault(keys[run_id], []).append(read.levels[run_id])
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


def host_shares(a_runs: list[RunData], b_runs: list[RunData]) -> dict[str, float]:
    """Return, per host, B's share of runs there minus A's: the contrast of host levels by which the two
    sides' mean levels differ (one run a side on X and Y: {X: -1, Y: +1}; same hosts, same shares: all 0)."""
    hosts = sorted({r.host for r in a_runs + b_runs})
    return {h: sum(r.host == h for r in b_runs) / len(b_runs) - sum(r.host == h for r in a_runs) / len(a_runs)
            for h in hosts}


def host_mix(a_runs: list[RunData], b_runs: list[RunData]) -> float:
    """Return sum over hosts of (B's share of runs on the host - A's share)^2: the weight of the hosts'
    variance in the difference of the sides' means (2: one run a side, two hosts; 0: same hosts, same shares)."""
    return float(sum(w**2 for w in host_shares(a_runs, b_runs).values()))


@dataclass(kw_only=True, frozen=True)
class HostOffset:
    """The offset of B's hosts against A's measured on the store's runs (``host_offset``), log units."""

    offset: float  # sum over hosts of shares x host level: B's hosts' log level minus A's
    variance: float  # of that estimate (log units squared)
    per_config: float  # variance of a host's level from one configuration to another beyond the offset (>= 0)
    df: float  # degrees of freedom of the residual variance both rest on
    lack_of_fit: bool = False  # per_config was read from the lack of fit (else assumed 0: nothing shows it)
    hosts: int  # hosts linked in the fit
    configs: int  # configurations in the fit


def host_offset(groups: dict[str, dict[str, list[tuple[float, float]]]], shares: dict[str, float],
                within: float, within_df: float) -> HostOffset | None:
    """Return the offset of the compared hosts' levels (``shares``: host -> B's share of runs there minus A's)
    from runs' (log mean, variance of the log mean) grouped by configuration, then host: least squares of
    log level = configuration + host (hosts as fixed effects; module doc), the offset being the contrast
    l = sum shares x host effect. Its variance is MS l'(X'X)^+ l, and the residual splits as a two-way ANOVA
    (Searle, "Linear Models", 1971): pure error (runs of one configuration on one host; without repeats,
    ``within``, the one-host between-run variance, plus the runs' own mean variance, at ``within_df``) and
    lack of fit (cells the additive model misses: a host's offset that varies between configurations).
    Where the design has lack-of-fit degrees of freedom, the offset's variance is MS_lof l'(X'X)^+ l (its
    expectation holds the per-configuration variance in the share an offset averaged over configurations
    carries) and per_config, the compared configuration's own, (MS_lof - MS_pe) / runs per cell, floored at
    0, with Satterthwaite's degrees of freedom for the sum; else per_config is 0 and the variance rests on
    MS_pe.
    None when a compared host is not in the runs, or the hosts are not linked through shared configurations
    (the contrast is not estimable)."""
    rows = [(c, h, lv) for c, by_host in groups.items() for h, v in by_host.items() for lv in v]
    if not rows or any(w and h not in {r[1] for r in rows} for h, w in shares.items()):
        return None
    configs, hosts = sorted({r[0] for r in rows}), sorted({r[1] for r in rows})
    ci, hi = {c: i for i, c in enumerate(configs)}, {h: len(configs) + i for i, h in enumerate(hosts)}
    x = np.zeros((len(rows), len(ci) + len(hi)))
    for i, (c, h, _) in enumerate(rows):
        x[i, ci[c]] = x[i, hi[h]] = 1.0
    y, run_var = np.array([r[2][0] for r in rows]), np.array([r[2][1] for r in rows])
    lvec = np.zeros(x.shape[1])
    for h, w in shares.items():
        if w:
            lvec[hi[h]] = w
    xtx = x.T @ x
    g = np.linalg.pinv(xtx)
    if not np.allclose(xtx @ (g @ lvec), lvec, atol=1e-9):  # l outside X's row space: hosts not linked
        return None
    beta = g @ (x.T @ y)
    resid = y - x @ beta
    cells: dict[tuple[str, str], list[float]] = {}
    for (c, h, lv) in rows:
        cells.setdefault((c, h), []).append(lv[0])
    ss_pe = float(sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in cells.values()))
    df_pe, df_lof = len(rows) - len(cells), len(cells) - int(np.linalg.matrix_rank(x))
    ms_pe, df_pe = ((ss_pe / df_pe, float(df_pe)) if df_pe else (within + float(run_var.mean()), within_df))
    lgl = float(lvec @ g @ lvec)
    if df_lof <= 0:  # each link rests on one configuration: nothing shows a per-configuration offset
        return HostOffset(offset=float(lvec @ beta), variance=ms_pe * lgl, per_config=0.0, df=df_pe,
                          hosts=len(hosts), configs=len(configs))
    ms_lof = (float(resid @ resid) - ss_pe) / df_lof
    # the offset's error (ms_lof l'Gl) plus the compared configuration's own per-configuration offsets,
    # weight x (ms_lof - ms_pe) / runs per cell: a difference of mean squares with Satterthwaite's df
    # (as host_spread), at least the offset's error alone
    weight, per_cell = float(sum(w**2 for w in shares.values())), len(rows) / len(cells)
    a_lof, a_pe = lgl + weight / per_cell, -weight / per_cell
    total = a_lof * ms_lof + a_pe * ms_pe
    if total <= ms_lof * lgl:
        total, df = ms_lof * lgl, float(df_lof)
    else:
        df = total**2 / ((a_lof * ms_lof) ** 2 / df_lof + (a_pe * ms_pe) ** 2 / df_pe)
    return HostOffset(offset=float(lvec @ beta), variance=ms_lof * lgl, per_config=(total - ms_lof * lgl) / weight,
                      df=df, hosts=len(hosts), configs=len(configs), lack_of_fit=True)


def host_term(groups: dict[str, dict[str, list[tuple[float, float]]]], shares: dict[str, float],
              within: BetweenRun = DEFAULT_BETWEEN) -> HostSpread:
    """Return the hosts' term of two sides whose runs are spread over hosts as ``shares`` (``host_shares``),
    from the store's runs ``groups`` ({configuration: {host: [(log mean, variance of the log mean)]}}, only
    configurations run on two hosts or more): the compared hosts' own offset when the runs link them
    (``host_offset``), else the spread of hosts of the kind (``host_spread``), else unknown (cv inf).
    ``within``: the one-host between-run term (history or default)."""
    weight = float(sum(w**2 for w in shares.values()))
    sides = (tuple(sorted(h for h, w in shares.items() if w < 0)), tuple(sorted(h for h, w in shares.items() if w > 0)))
    off = host_offset(groups, shares, within.cv**2, within.df)
    if off is not None:
        return HostSpread(cv=math.sqrt(off.per_config), df=off.df, weight=weight, hosts=sides, offset=off.offset,
                          offset_var=off.variance, paired=True, caps_df=off.lack_of_fit,
                          source=f"the store's runs of {off.configs} configuration(s) on {off.hosts} linked hosts, "
                                 f"{off.df:.0f} df")
    sigma2, df, n_hosts, configs = host_spread(groups, within.cv**2)
    if not df:
        return HostSpread(cv=math.inf, df=math.inf, weight=weight, hosts=sides,
                          source="the store holds no runs of one configuration on two hosts (how much hosts differ "
                                 "is unknown)")
    return HostSpread(cv=math.sqrt(sigma2), df=df, weight=weight, hosts=sides,
                      source=f"the store's runs of {configs} configuration(s) on {n_hosts} hosts, {df:.0f} df")


def hosts_between(a_runs: list[RunData], b_runs: list[RunData], store: str | None = None,
                  within: BetweenRun = DEFAULT_BETWEEN, read: StoreLevels | None = None) -> HostSpread | None:
    """Return the hosts' term of A against B (``interval.HostSpread``, ``host_term``): None when both sides
    ran on the same hosts in the same shares (or a run's host is not recorded); else from the store's runs
    of configurations run on two hosts or more (the compared runs left out; ``within``: the one-host
    between-run term), the compared hosts' offset or the spread of hosts of their kind, or an unknown
    spread (cv inf) when the store holds none. ``read``: the store as ``read_levels`` read it."""
    runs = a_runs + b_runs
    shares = host_shares(a_runs, b_runs)
    if not any(shares.values()) or any(not r.host for r in runs):
        return None
    if read is None:
        read = read_levels(store, {r.run_id for r in runs if r.run_id} | {r.name for r in runs}, across=True)
    groups: dict[str, dict[str, list[tuple[float, float]]]] = {}
    heads = {r.run_id: r for r in (read.heads if read is not None else [])}
    for run_id in _across_ids(list(heads.values())):
        if run_id in read.levels:
            rec = heads[run_id]
            groups.setdefault(_host_key(rec), {}).setdefault(rec.host, []).append(read.levels[run_id])
    return host_term(groups, shares, within)


def between_floor(a_runs: list[RunData], b_runs: list[RunData], store: str | None = None) -> BetweenRun:
    """Return the between-run term before the runs' own drift is seen, as `compare` and `gate` take it.
    One run a side: the store's history on the runs' hosts when it has one, else
    ``interval.DEFAULT_BETWEEN``. Repeats: the default, whose cv the repeats' own spread replaces. Either
    way with the hosts' term (``hosts_between``) when A and B ran on different hosts: the repeats measure
    their spread on their hosts, not a difference of hosts. The store is read once for both
    (``read_levels``)."""
    runs = a_runs + b_runs
    one_each = len(a_runs) == 1 and len(b_runs) == 1
    across = any(host_shares(a_runs, b_runs).values())
    if not (one_each or across):
        return DEFAULT_BETWEEN
    hosts = {r.host for r in runs}
    read = read_levels(store, {r.run_id for r in runs if r.run_id} | {r.name for r in runs},
                       hosts if one_each else set(), across)
    floor = (history_between(hosts, set(), store, read) if one_each and read is not None else None) or DEFAULT_BETWEEN
    return replace(floor, hosts=hosts_between(a_runs, b_runs, store, floor, read) if across else None)
