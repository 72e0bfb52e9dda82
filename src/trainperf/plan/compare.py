"""Which accelerator trains this model cheapest: best layout per accelerator, time, $, kWh.

For each accelerator the same search runs on the same GPU count; the best layout's
tokens/s gives the wall time to train ``tokens`` tokens, the on-demand price gives
dollars (GPU-hours x $/GPU-hour) and the TDP gives energy: ``TDP x GPUs x hours x PUE``
(PUE, the data centre's power usage effectiveness, is stated in the output; 1.2 by default).
TDP is an upper bound for the accelerators alone (real draw in training is ~70-90% of it);
host CPUs, NICs and switches are covered only through the PUE.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.errors import TrainperfError
from trainperf.plan.efficiency import Efficiency, Software
from trainperf.plan.estimate import Estimate
from trainperf.plan.search import search
from trainperf.specs import ModelSpec, make_cluster


@dataclass
class HardwareOption:
    """The best layout of one accelerator and what training ``tokens`` tokens costs with it."""

    gpu: str
    n_gpus: int
    best: Estimate | None
    train_hours: float
    usd: float
    kwh: float
    usd_per_million_tokens: float
    usd_per_gpu_hour: float
    pue: float
    problem: str = ""

    def to_dict(self) -> dict:
        """Return the JSON form (hours, USD, kWh, USD per million tokens, best layout)."""
        return {"gpu": self.gpu, "n_gpus": self.n_gpus, "train_hours": self.train_hours, "usd": self.usd,
                "kwh": self.kwh, "usd_per_million_tokens": self.usd_per_million_tokens,
                "usd_per_gpu_hour": self.usd_per_gpu_hour, "pue": self.pue, "problem": self.problem,
                "best": self.best.to_dict() if self.best else None}


def train_cost(est: Estimate, n_gpus: int, tokens: float, usd_per_gpu_hour: float, tdp_w: float,
               pue: float) -> tuple[float, float, float, float]:
    """Return (hours, USD, kWh, USD per million tokens) to train ``tokens`` tokens with ``est``."""
    tokens_per_s = est.tokens_per_s_per_gpu * n_gpus
    hours = tokens / tokens_per_s / 3600.0
    usd = hours * n_gpus * usd_per_gpu_hour
    kwh = tdp_w * n_gpus * hours * pue / 1000.0
    usd_per_mtok = usd_per_gpu_hour / 3600.0 / est.tokens_per_s_per_gpu * 1e6
    return hours, usd, kwh, usd_per_mtok


def compare_hardware(m: ModelSpec, gpus: list[str], n_gpus: int, tokens: float, global_batch: int | None = None,
                     gpus_per_node: int | None = None, usd_per_hour: float | None = None,
                     objective: str = "time", precision: str = "bf16", eff: Efficiency | None = None,
                     sw: Software | None = None) -> list[HardwareOption]:
    """Return one HardwareOption per accelerator name, cheapest per token first.

    An accelerator on which no layout fits is kept with ``problem`` set (and sorted last);
    an unknown name raises TrainperfError listing the catalog.
    """
    sw = sw or Software()
    out = []
    for name in gpus:
        cluster = make_cluster(name, n_gpus, gpus_per_node, usd_per_gpu_hour=usd_per_hour)
        acc = cluster.accelerator
        prec = precision if (precision != "fp8" or acc.fp8_tflops) else "bf16"
        try:
            res = search(m, cluster, global_batch, objective=objective, top=1, precision=prec, eff=eff, sw=sw)
        except TrainperfError as e:
            out.append(HardwareOption(acc.name, n_gpus, None, float("inf"), float("inf"), float("inf"), float("inf"),
                                      cluster.usd_per_gpu_hour, sw.pue, problem=str(e)))
            continue
        best = res.best[0]
        used = res.extra["n_gpus_used"][0]
        hours, usd, kwh, per_m = train_cost(best, used, tokens, cluster.usd_per_gpu_hour, acc.tdp_w, sw.pue)
        out.append(HardwareOption(acc.name, used, best, hours, usd, kwh, per_m, cluster.usd_per_gpu_hour, sw.pue))
    out.sort(key=lambda o: o.usd_per_million_tokens)
    return out
