"""A store of training runs with faults of known size, for the metric tree's tests and demo.

Every run is ``n_steps`` steps of one model and layout on ``gpus`` GPUs, with the monitor's
record shape: step samples (step time, data wait, MFU over the whole step) and the goodput split
in ``config["summary"]["goodput"]``. A healthy step is ``busy_s`` of compute at ``mfu`` (over the
compute time) plus ``data_wait_s``; each run pays ``startup_s``, ``n_checkpoints`` saves of
``checkpoint_s`` and ``other_s`` of evaluation. Faults (each a dict of its size):

- ``slow_host``: every run on that host computes at ``mfu`` x ``slowdown`` (its steps take longer);
- ``checkpoint_stall``: one run's save blocks ``extra_s`` more;
- ``data_stall``: one run's first ``steps`` steps each wait ``extra_s`` more for data;
- ``restart``: one run crashes once: ``restart_s`` to relaunch, another start-up, ``lost_steps`` re-done.

``nodes_per_run`` > 1 spreads each run's ``gpus`` ranks evenly over that many consecutive hosts
(its own first); the record keeps rank 0's host and, in ``config["summary"]["ranks"]``, each rank's
host and compute time per step (``busy_s``): a slow host slows every run it is part of (the others
wait for it), and only the ranks list says which host it was.

``noise`` > 0 draws each run's MFU, data wait, checkpoint, start-up and evaluation times with that
coefficient of variation (lognormal, seeded by ``seed``): runs differ as real ones do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainperf.store.record import RunRecord, StepSample


@dataclass(kw_only=True)
class TreeFleet:
    """Parameters of the synthetic fleet; ``records()`` builds it."""

    hosts: tuple[str, ...] = ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3")
    jobs: tuple[str, ...] = ("llama-pretrain", "llama-anneal")  # one run of each job per host
    model: str = "llama3-8b"
    layout: str = "tp=2,pp=1,dp=4,cp=1,vpp=1,sp=0,recompute=selective,zero=1,mbs=2,precision=bf16"
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    gpus: int = 8
    n_steps: int = 1000
    busy_s: float = 2.97
    data_wait_s: float = 0.03
    mfu: float = 0.40
    tokens_per_step: int = 1_048_576
    startup_s: float = 300.0
    n_checkpoints: int = 10
    checkpoint_s: float = 6.0
    other_s: float = 120.0
    start_time: float = 1.79e9
    noise: float = 0.0
    seed: int = 0
    nodes_per_run: int = 1
    slow_host: dict = field(default_factory=lambda: {"host": "gpu-node-3", "slowdown": 0.75})
    checkpoint_stall: dict = field(default_factory=lambda: {"host": "gpu-node-1", "job": "llama-pretrain",
                                                            "extra_s": 600.0})
    data_stall: dict = field(default_factory=lambda: {"host": "gpu-node-2", "job": "llama-anneal", "steps": 200,
                                                      "extra_s": 3.0})
    restart: dict = field(default_factory=lambda: {"host": "gpu-node-0", "job": "llama-anneal", "restart_s": 180.0,
                                                   "lost_steps": 50})

    def records(self) -> list[RunRecord]:
        """Return one RunRecord per (host, job), faults applied."""
        import numpy as np

        rng = np.random.default_rng(self.seed)
        sigma = float(np.sqrt(np.log1p(self.noise ** 2)))
        out = []
        for i, (host, job) in enumerate((h, j) for h in self.hosts for j in self.jobs):
            jitter = dict(zip(("mfu", "wait", "ckpt", "startup", "other"),
                              np.exp(rng.normal(-sigma ** 2 / 2, sigma, 5)) if sigma > 0 else np.ones(5)))
            out.append(self._run(i, host, job, jitter))
        return out

    def _hit(self, fault: dict | None, host: str, job: str) -> bool:
        return bool(fault) and fault.get("host", host) == host and fault.get("job", job) == job

    def _run(self, i: int, host: str, job: str, jitter: dict) -> RunRecord:
        k = self.hosts.index(host)
        nodes = [self.hosts[(k + m) % len(self.hosts)] for m in range(max(self.nodes_per_run, 1))]
        slow = next((h for h in nodes if self._hit(self.slow_host, h, job)), None)
        base = self.mfu * jitter["mfu"]
        mfu = base * (self.slow_host["slowdown"] if slow else 1.0)
        busy = self.busy_s * self.mfu / mfu  # same work per step at a lower MFU takes longer
        healthy = self.busy_s * self.mfu / base
        ranks = [{"rank": r, "host": nodes[r * len(nodes) // self.gpus],
                  "busy_s": busy if nodes[r * len(nodes) // self.gpus] == slow else healthy}
                 for r in range(self.gpus)] if len(nodes) > 1 else None
        stall = self.data_stall if self._hit(self.data_stall, host, job) else None
        samples = []
        for s in range(1, self.n_steps + 1):
            wait = self.data_wait_s * jitter["wait"] + (stall["extra_s"] if stall and s <= stall["steps"] else 0.0)
            step = busy + wait
            samples.append(StepSample(step=s, step_time_s=step, tokens_per_s=self.tokens_per_step / step,
                                      mfu=mfu * busy / step, data_wait_s=wait))
        steps_s = sum(x.step_time_s for x in samples)
        wait_s = sum(x.data_wait_s for x in samples)
        ckpt = self.n_checkpoints * self.checkpoint_s * jitter["ckpt"]
        if self._hit(self.checkpoint_stall, host, job):
            ckpt += self.checkpoint_stall["extra_s"]
        startup, other = self.startup_s * jitter["startup"], self.other_s * jitter["other"]
        restart, lost, attempts = 0.0, 0.0, 1
        if self._hit(self.restart, host, job):
            startup, restart, attempts = 2 * startup, self.restart["restart_s"], 2
            lost = self.restart["lost_steps"] * (busy + self.data_wait_s * jitter["wait"])
        gp = {"total_s": steps_s + startup + restart + lost + ckpt + other, "productive_s": steps_s - wait_s,
              "startup_s": startup, "data_wait_s": wait_s, "checkpoint_s": ckpt, "restart_s": restart,
              "lost_work_s": lost, "other_s": other, "attempts": attempts}
        gp["goodput"] = gp["productive_s"] / gp["total_s"]
        return RunRecord(run_id=f"tree-{i:02d}-{host}-{job}", job=job, host=host, gpu_model=self.gpu_model,
                         torch="2.5.1", cuda="12.4", nccl="2.21.5", git_sha="a1b2c3d4e5f6", world_size=self.gpus,
                         model=self.model, layout=self.layout, started_at=self.start_time + 3600.0 * i,
                         config={"seq_len": 8192, "summary": {"goodput": gp, **({"ranks": ranks} if ranks else {})}},
                         step_time_s=samples[-1].step_time_s, mfu=samples[-1].mfu,
                         goodput=gp["goodput"], samples=samples)
