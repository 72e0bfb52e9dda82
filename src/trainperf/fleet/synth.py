"""A synthetic fleet with known causes, for tests and demos.

Hosts x software versions x configs run one job each per period; step time is the config's
base time x the host's own speed x noise (coefficient of variation ``cv``) x the injected causes:

- ``bad_host``: one host is ``bad_host_slowdown`` slower from ``bad_host_at`` on;
- ``nccl_upgrade``: from ``nccl_at`` on, half the hosts run a new NCCL that is slower;
- ``config_change``: from ``config_at`` on, one job switches to full recompute (slower);
- ``thermal_drift``: one host slows down linearly from ``drift_at`` on.

``truth`` maps each cause to when it starts and the attribute=value set that explains it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainperf.store.record import RunRecord, StepSample


@dataclass
class SyntheticFleet:
    """Run records of a synthetic fleet and the causes injected into them."""

    records: list[RunRecord]
    truth: dict = field(default_factory=dict)  # cause -> {"period": int, "attrs": {...}}

    def columns(self) -> dict[str, np.ndarray]:
        """Return one row per run: period, host, nccl, torch, layout, job, step_time_s, n (=1)."""
        keys = ["period", "host", "nccl", "torch", "layout", "job", "step_time_s", "n"]
        rows = [[r.config["period"], r.host, r.nccl, r.torch, r.layout, r.job, r.step_time_s, 1.0] for r in self.records]
        return {k: np.array([row[i] for row in rows]) if k in ("host", "nccl", "torch", "layout", "job")
                else np.array([row[i] for row in rows], dtype=float) for i, k in enumerate(keys)}

    def series(self, host: str | None = None, job: str | None = None) -> np.ndarray:
        """Return the step times of the runs of one host and/or job, in period order."""
        rs = [r for r in self.records if (host is None or r.host == host) and (job is None or r.job == job)]
        rs.sort(key=lambda r: r.config["period"])
        return np.array([r.step_time_s for r in rs])


def synthetic_fleet(n_periods: int = 60, n_hosts: int = 12, cv: float = 0.01, seed: int = 0,
                    causes: tuple[str, ...] = ("bad_host", "nccl_upgrade", "config_change", "thermal_drift"),
                    bad_host_at: int = 20, bad_host_slowdown: float = 0.15, nccl_at: int = 30,
                    nccl_slowdown: float = 0.08, config_at: int = 40, config_slowdown: float = 0.2,
                    drift_at: int = 45, drift_per_period: float = 0.01, steps_per_run: int = 0,
                    start_time: float = 1.7e9, period_s: float = 3600.0) -> SyntheticFleet:
    """Return a synthetic fleet: ``n_hosts`` hosts x ``n_periods`` periods, one run per host and period."""
    rng = np.random.default_rng(seed)
    hosts = [f"node{i:02d}" for i in range(n_hosts)]
    host_speed = dict(zip(hosts, 1.0 + 0.01 * rng.standard_normal(n_hosts)))
    jobs = {"llama-8b": ("tp=2,pp=1,zero=3,recompute=selective,mbs=2", 1.20),
            "llama-70b": ("tp=8,pp=4,zero=1,recompute=selective,mbs=1", 4.80)}
    job_of_host = {h: list(jobs)[i % len(jobs)] for i, h in enumerate(hosts)}
    bad_host, drift_host = hosts[3], hosts[min(7, n_hosts - 1)]
    upgraded = {h for i, h in enumerate(hosts) if (i // 2) % 2 == 0}  # both jobs on either NCCL
    config_job = "llama-8b"
    truth = {}
    if "bad_host" in causes:
        truth["bad_host"] = {"period": bad_host_at, "attrs": {"host": bad_host}}
    if "nccl_upgrade" in causes:
        truth["nccl_upgrade"] = {"period": nccl_at, "attrs": {"nccl": "2.21.5"}}
    if "config_change" in causes:
        truth["config_change"] = {"period": config_at,
                                  "attrs": {"layout": jobs[config_job][0].replace("selective", "full")}}
    if "thermal_drift" in causes:
        truth["thermal_drift"] = {"period": drift_at, "attrs": {"host": drift_host}}
    records = []
    for p in range(n_periods):
        for h in hosts:
            job = job_of_host[h]
            layout, base = jobs[job]
            factor = host_speed[h]
            nccl = "2.21.5" if ("nccl_upgrade" in causes and p >= nccl_at and h in upgraded) else "2.20.5"
            if nccl == "2.21.5":
                factor *= 1 + nccl_slowdown
            if "bad_host" in causes and h == bad_host and p >= bad_host_at:
                factor *= 1 + bad_host_slowdown
            if "config_change" in causes and job == config_job and p >= config_at:
                layout = layout.replace("selective", "full")
                factor *= 1 + config_slowdown
            if "thermal_drift" in causes and h == drift_host and p >= drift_at:
                factor *= 1 + drift_per_period * (p - drift_at + 1)
            step = base * factor * (1 + cv * rng.standard_normal())
            samples = [StepSample(step=i, step_time_s=float(step * (1 + cv * rng.standard_normal())))
                       for i in range(steps_per_run)]
            records.append(RunRecord(run_id=f"synth-{p:04d}-{h}", job=job, started_at=start_time + p * period_s,
                                     host=h, gpu_model="NVIDIA H100 80GB HBM3", driver="550.54.15", cuda="12.4",
                                     nccl=nccl, torch="2.5.1", git_sha="0" * 12, layout=layout,
                                     world_size=8, config={"period": p}, step_time_s=float(step), samples=samples))
    return SyntheticFleet(records=records, truth=truth)


# Performance series: what benchmark results per revision and step times per run look like.
PERF_KINDS = ("normal", "bimodal", "outliers", "drift", "short_segments", "missing", "quantised", "ar1", "ramp",
              "benchmark")
# Browser-benchmark results per revision (``benchmark``): regressions an engineer confirms are
# 5-15% level shifts; steps below Perfherder's default alert threshold (2%) are never confirmed.
BENCH_SHIFT = (0.05, 0.15)
BENCH_UNCONFIRMED = (0.005, 0.015)


@dataclass(kw_only=True)
class PerfSeries:
    """One synthetic performance series and the regressions injected into it."""

    kind: str
    values: np.ndarray  # NaN = a missing run
    change_points: list[int]  # 0-based index of the first point of each new level


def _perf_noise(kind: str, n: int, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Relative noise of one kind (multiply the level by 1 + noise)."""
    if kind == "bimodal":  # two modes (e.g. a cache hit or a core-placement effect), each run picks one
        mode = rng.random(n) < rng.uniform(0.2, 0.5)
        return cv * rng.standard_normal(n) + np.where(mode, rng.uniform(2, 4) * cv, 0.0)
    if kind == "outliers":  # heavy tails plus 3% stalled runs 10-50% slow
        e = cv * rng.standard_t(3, n)
        m = rng.random(n) < 0.03
        return e + np.where(m, rng.uniform(0.1, 0.5, n), 0.0)
    if kind == "ar1":  # persistent noise (machine state carried over between runs)
        z, e = cv * np.sqrt(1 - 0.5**2) * rng.standard_normal(n), np.zeros(n)
        for i in range(1, n):
            e[i] = 0.5 * e[i - 1] + z[i]
        return e
    return cv * rng.standard_normal(n)


def _bench_noise(rng: np.random.Generator, n: int, level: np.ndarray) -> np.ndarray:
    """Return benchmark results around ``level``: quantised to a resolution of 0.5-5% of the level
    (whole milliseconds on a 20-200 ms test), noise 0.3-2% (AR(1), lag-1 correlation 0-0.6) with one
    or two long stretches at a fifth of it (flat once quantised), a second mode 2-6% slower in
    10-40% of runs (half the series), 2-4% outliers 10-80% slow and 5% of runs missing."""
    cv = np.full(n, rng.uniform(0.003, 0.02))
    for s in rng.integers(0, n, int(rng.integers(1, 3))):
        cv[s:s + int(rng.integers(20, 80))] *= 0.2
    z, e, rho = cv * rng.standard_normal(n), np.zeros(n), rng.uniform(0.0, 0.6)  # machine state carries over
    e[0] = z[0]
    for i in range(1, n):
        e[i] = rho * e[i - 1] + np.sqrt(1 - rho**2) * z[i]
    if rng.random() < 0.5:
        e += np.where(rng.random(n) < rng.uniform(0.1, 0.4), rng.uniform(0.02, 0.06), 0.0)
    e += np.where(rng.random(n) < rng.uniform(0.02, 0.04), rng.uniform(0.1, 0.8, n), 0.0)
    q = level[0] * rng.choice([0.005, 0.01, 0.02, 0.05])
    y = np.round(level * (1 + e) / q) * q
    y[rng.random(n) < 0.05] = np.nan
    return y


def perf_series(kind: str, rng: np.random.Generator, *, n: int | None = None, n_changes: int | None = None,
                cv: float | None = None) -> PerfSeries:
    """Return one synthetic performance series of ``kind`` (one of PERF_KINDS), seeded by ``rng``.

    Level 100 (e.g. ms per iteration), noise ``cv`` (default 1-3%), 0-3 steps of 3-8 sigma
    (a regression or its fix), each segment at least 10 points (``short_segments``: 4-8 steps,
    segments of 8-25 points). ``drift``: plus a slow linear drift of 5-10% over the series (not a
    change); ``ramp``: each change reaches its new level over 3-40 runs (the change point is
    the first run off the old level); ``missing``: 10% of runs missing, some in runs of 3-6; ``quantised``: values
    rounded to a quantum near the noise level (integer milliseconds); ``benchmark``: browser-benchmark
    results per revision (``_bench_noise``), regressions of ``BENCH_SHIFT`` (5-15%) and, in half the
    series, one persistent step of ``BENCH_UNCONFIRMED`` (0.5-1.5%, not a change point: below the
    practical minimum nobody confirms); ``n_changes=0``: an A/A series.
    """
    if kind not in PERF_KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    cv = float(rng.uniform(0.01, 0.03)) if cv is None else cv
    if kind == "short_segments":
        k = int(rng.integers(4, 9)) if n_changes is None else n_changes
        lens = rng.integers(8, 26, k + 1)
        n = int(lens.sum())
        cps = [int(c) for c in np.cumsum(lens)[:-1]]
    else:
        n = int(rng.integers(60, 400)) if n is None else n
        k = int(rng.integers(0, 4)) if n_changes is None else n_changes
        cps = []
        for _ in range(200):  # draw k change points with segments of at least 10 points
            c = np.sort(rng.choice(np.arange(10, n - 9), size=k, replace=False)) if k else np.array([], int)
            if np.all(np.diff(np.r_[0, c, n]) >= 10):
                cps = [int(v) for v in c]
                break
    level = np.full(n, 100.0)
    t = np.arange(n)
    if kind == "benchmark":
        for c in cps:
            level[c:] *= 1 + rng.uniform(*BENCH_SHIFT) * rng.choice([-1.0, 1.0])
        if rng.random() < 0.5:
            at = int(rng.integers(10, n - 9))
            level[at:] *= 1 + rng.uniform(*BENCH_UNCONFIRMED) * rng.choice([-1.0, 1.0])
        return PerfSeries(kind=kind, values=_bench_noise(rng, n, level), change_points=cps)
    for i, c in enumerate(cps):
        size = rng.uniform(3, 8) * cv * rng.choice([-1.0, 1.0])
        if kind == "ramp":  # a gradual regression (a leak, fragmentation, a thermal limit) over 3-40 runs
            room = (cps[i + 1] if i + 1 < len(cps) else n) - c
            length = int(rng.integers(3, max(4, min(41, room - 4))))
            level *= 1 + size * np.clip((t - c + 1) / length, 0, 1)  # first point off the old level: c
        else:
            level[c:] *= 1 + size
    if kind == "drift":
        level *= 1 + rng.uniform(0.05, 0.10) * rng.choice([-1.0, 1.0]) * np.arange(n) / n
    y = level * (1 + _perf_noise(kind, n, cv, rng))
    if kind == "quantised":
        y = np.round(y / (100 * cv)) * (100 * cv)
    if kind == "missing":
        miss = rng.random(n) < 0.05
        for s in rng.integers(0, n, 2):
            miss[s:s + int(rng.integers(3, 7))] = True
        y[miss] = np.nan
    return PerfSeries(kind=kind, values=y, change_points=cps)


def perf_benchmark(reps: int = 6, seed: int = 0) -> list[PerfSeries]:
    """Return ``reps`` labelled series of every kind in PERF_KINDS (seeded; 0-3 regressions each)."""
    rng = np.random.default_rng(seed)
    return [perf_series(kind, rng) for kind in PERF_KINDS for _ in range(reps)]


def aa_series(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Return an A/A series (no change) of ``kind``: normal, t3, bimodal, outliers, ar1, quantised,
    drift (8% over the series + 3% stalls), drift_t3 (2e-4 per point, t3 noise) or benchmark
    (browser-benchmark results: quantised, flat low-noise stretches, bimodal, outliers, missing runs)."""
    if kind == "benchmark":
        return _bench_noise(rng, n, np.full(n, float(rng.choice([20.0, 50.0, 200.0]))))
    if kind == "t3":
        return 100 * (1 + 0.01 * rng.standard_t(3, n))
    if kind == "drift":
        return 100 * (1 + 0.08 * np.arange(n) / n + _perf_noise("outliers", n, 0.01, rng))
    if kind == "drift_t3":  # slow thermal-like drift, 2e-4 per point, in heavy-tailed noise
        return 100 * (1 + 2e-4 * np.arange(n) + 0.01 * rng.standard_t(3, n))
    if kind == "quantised":
        return np.round(100 * (1 + 0.01 * rng.standard_normal(n)))
    return 100 * (1 + _perf_noise(kind, n, 0.01, rng))
