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
