"""Findings: typed records naming a bottleneck, its evidence, the what-if gain and a fix.

Severity follows the estimated gain of fixing it (replay of the step graph with the fix applied):
high >= 10 % of step time, medium >= 3 %, low otherwise. A healthy trace therefore has no high
finding: nothing in it can be fixed for a large gain.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

HIGH_GAIN_PCT = 10.0
MEDIUM_GAIN_PCT = 3.0

RECOMMENDATIONS = {
    "data_loader_stall": "Feed the GPU faster: raise DataLoader num_workers, set pin_memory=True and "
                         "persistent_workers=True, prefetch (prefetch_factor) or move decoding/augmentation off "
                         "the training process.",
    "host_sync": "Remove host-device syncs inside the step: avoid .item()/.cpu()/print of tensors and "
                 "torch.cuda.synchronize() in the loop; log losses every N steps or asynchronously "
                 "(non_blocking copies to pinned memory).",
    "exposed_comm": "Overlap communication with computation: enable bucketing/prefetch (DDP bucket_cap_mb, "
                    "FSDP forward/backward prefetch), launch collectives on a side stream, or reduce volume "
                    "(gradient compression, larger micro-batches per all-reduce).",
    "straggler": "Investigate the slow rank: its host/GPU (thermal throttling, noisy neighbour, slower link), "
                 "uneven data (sequence-length imbalance) or extra work only it does (logging, checkpointing).",
    "launch_bound": "The GPU waits for the CPU to launch kernels: capture the step with CUDA graphs, "
                    "torch.compile (mode='reduce-overhead') to fuse kernels, or raise the per-GPU batch size.",
    "small_kernels": "Many kernels are tiny: fuse them (torch.compile, fused optimizers, foreach ops) or use "
                     "CUDA graphs to cut per-launch overhead.",
    "memory_bound_unfused": "Elementwise and reduction kernels take a large share: fuse them (torch.compile, "
                            "fused LayerNorm/RMSNorm, fused activation and dropout, Liger/Triton kernels).",
    "optimizer_slow": "The optimizer step is expensive: use the fused or foreach implementation "
                      "(torch.optim.AdamW(fused=True)), or shard optimizer state (ZeRO/FSDP).",
    "idle_gpu": "The GPU is idle for a large share of the window with no single cause found: look at the "
                "critical path in the report for the host work that gates it.",
    "checkpoint_stall": "Checkpoint saving blocks training: save asynchronously "
                        "(torch.distributed.checkpoint.async_save) or less often.",
    "gpu_analyses_skipped": "Profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] to record "
                            "GPU kernels.",
}


@dataclass
class Finding:
    """One diagnosed problem: what, how bad, where, the evidence, what fixing it gains and how."""

    kind: str
    severity: str
    ranks: list[int]
    steps: list[int]
    evidence: dict = field(default_factory=dict)  # metrics (value, unit); events (name, start_us from the
    #                                               rank's first event, dur_us)
    gain_pct: float = 0.0                           # estimated step-time reduction, % of the window
    gain_us: float = 0.0
    what_if: str = ""
    recommendation: str = ""

    def to_json(self) -> dict:
        """A plain JSON-able dict."""
        return asdict(self)


def severity_of(gain_pct: float) -> str:
    """high / medium / low from the estimated gain (% of step time)."""
    return "high" if gain_pct >= HIGH_GAIN_PCT else "medium" if gain_pct >= MEDIUM_GAIN_PCT else "low"


def make(kind: str, ranks, steps, metrics: dict, events=(), gain_pct: float = 0.0, gain_us: float = 0.0,
         what_if: str = "", severity: str | None = None) -> Finding:
    """A Finding with severity from its gain and the standard recommendation of its kind."""
    ev = {"metrics": {k: {"value": round(float(v[0]), 3), "unit": v[1]} for k, v in metrics.items()},
          "events": [{"name": n, "start_us": round(float(s), 1), "dur_us": round(float(d), 1)} for n, s, d in events]}
    return Finding(kind, severity or severity_of(gain_pct), sorted(int(r) for r in ranks), [int(s) for s in steps],
                   ev, round(float(gain_pct), 2), round(float(gain_us), 1), what_if, RECOMMENDATIONS[kind])


def merge_across_ranks(findings: list[Finding]) -> list[Finding]:
    """One finding per kind: ranks joined, evidence and gain of the rank with the largest gain."""
    best: dict[str, Finding] = {}
    ranks: dict[str, set] = {}
    for f in findings:
        ranks.setdefault(f.kind, set()).update(f.ranks)
        if f.kind not in best or f.gain_pct > best[f.kind].gain_pct:
            best[f.kind] = f
    out = []
    sev_rank = {"high": 0, "medium": 1, "low": 2}
    for k, f in best.items():
        f.ranks = sorted(ranks[k])
        out.append(f)
    return sorted(out, key=lambda f: (-f.gain_pct, sev_rank[f.severity]))
