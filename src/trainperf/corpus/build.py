"""Build the labeled diagnosis corpus: real base traces, one injected problem per case, sized to a
target gain, plus the untouched traces as healthy cases.

A case is a folder `<kind>-<severity>-<base>/` with `traces/rank<R>.json.gz` and `labels.json`:
{kind, ranks, true_gain_pct, severity, base, size, step_time_us_before, step_time_us_after, seed}.
The truth is measured, not assumed: true_gain_pct = 100 * (after - before) / after, the share of
the modified step time that removing the problem gives back (kineto.step_time_us on both).
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from trainperf.atomic import atomic_write_text, ensure_dir
from trainperf.corpus import kineto as K
from trainperf.corpus.inject import INJECTORS, inject_straggler
from trainperf.errors import TrainperfError

HIGH_PCT = 10.0       # severity bands of the true gain (% of step time), as diagnose's findings use
MEDIUM_PCT = 3.0
MIN_GAIN_PCT = 0.2    # below this the base had nothing to inject into (e.g. no overlapped collectives)
TARGET_PCT = {"low": 1.8, "medium": 6.0, "high": 20.0}
SEARCH_STEPS = 8      # bracketing steps on the injection size to reach the target gain
COUNT_KINDS = ("host_sync", "small_kernels")  # sizes that are counts per step
KIND_LABELS = tuple(INJECTORS) + ("healthy",)


@dataclass(frozen=True)
class Base:
    """A base trace set: a name and the Kineto files of its ranks."""

    name: str
    files: tuple[str, ...]


def default_bases(hta: str | Path) -> list[Base]:
    """The HTA test traces (MIT) with ProfilerSteps and GPU work that the corpus is built on."""
    hta = Path(hta)
    return [Base("trace_filter", (str(hta / "trace_filter/sampled_rank-0.json.gz"),
                                  str(hta / "trace_filter/sampled_rank-1.json.gz"))),
            Base("nccl_parser", (str(hta / "nccl_parser_config/nccl_data.json.gz"),)),
            Base("ns_resolution", (str(hta / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),))]


def healthy_only_bases(hta: str | Path) -> list[Base]:
    """Further real traces used untouched only (their host runs far ahead of an erratic device
    clock, so inserted host work barely changes the step: see docs/benchmarks.md)."""
    hta = Path(hta)
    return [Base("negative_queue", (str(hta / "negative_queue_length_values_check/rank0.json.gz"),))]


def severity_of(gain_pct: float) -> str:
    """high / medium / low band of a true gain (% of step time)."""
    return "high" if gain_pct >= HIGH_PCT else "medium" if gain_pct >= MEDIUM_PCT else "low"


def step_time(ranks: dict) -> float:
    """Step time of a set of ranks (µs): the slowest rank's, as collectives make all wait for it."""
    return max(K.step_time_us(d["traceEvents"]) for d in ranks.values())


def _start_size(kind: str, t0: float, x_us: float, ranks: dict) -> float:
    """A first guess of the injection size that adds x_us per step to a step of t0 µs."""
    n = len(K.steps(next(iter(ranks.values()))["traceEvents"]))
    return {"data_loader_stall": x_us, "checkpoint_stall": x_us * n, "host_sync": 8.0,
            "allocator_stall": x_us / 8, "pageable_copy": x_us, "small_kernels": x_us / 12.0,
            "straggler": 0.5 * x_us / t0 + 0.05, "exposed_comm": 0.5}[kind]


def _inject(kind: str, ranks: dict, size: float, seed: int, slow: int | None):
    rng = random.Random(seed)
    if kind == "straggler":
        return inject_straggler(ranks, size, rng, slow=slow)
    return INJECTORS[kind](ranks, size, rng)


def sized_case(kind: str, ranks: dict, target_pct: float, seed: int, slow: int | None = None):
    """Inject `kind` with the size whose measured gain is closest to target_pct.

    The gain is monotone in the size but not linear (device slack absorbs host delay up to a
    point), so the search brackets the target and then interpolates inside the bracket.
    Returns (modified ranks, touched ranks, size, step time before, after) in µs."""
    t0 = step_time(ranks)
    want = t0 * target_pct / (100 - target_pct)
    size = _start_size(kind, t0, want, ranks)
    best, lo, hi = None, None, None  # lo/hi: (size, gain) below / above the target
    for _ in range(SEARCH_STEPS):
        if kind in COUNT_KINDS:
            size = max(1.0, float(round(size)))
        if kind == "exposed_comm":
            size = min(max(size, 0.01), 1.0)
        out, touched = _inject(kind, ranks, size, seed, slow)
        t1 = step_time(out)
        gain = 100 * (t1 - t0) / t1
        if best is None or abs(gain - target_pct) < abs(best[4] - target_pct):
            best = (out, touched, size, t1, gain)
        if abs(gain - target_pct) <= 0.15 * target_pct:
            break
        if gain < target_pct:
            lo = (size, gain) if lo is None or size > lo[0] else lo
        else:
            hi = (size, gain) if hi is None or size < hi[0] else hi
        if lo and hi:
            f = (target_pct - lo[1]) / (hi[1] - lo[1])
            size = lo[0] + min(max(f, 0.1), 0.9) * (hi[0] - lo[0])
        elif lo:
            if kind == "exposed_comm" and lo[0] >= 1.0:
                break  # every overlapped collective serialised already
            added = t1 - t0
            size = size * min(max(want / added if added > 1e-6 else 8.0, 1.5), 8.0)
        else:
            size = size * min(max(want / (t1 - t0), 0.125), 0.67)
        if kind in COUNT_KINDS and (round(size) == (lo or (0,))[0] or round(size) == (hi or (0,))[0]):
            break  # no count left between the bracket's ends
    out, touched, size, t1, _ = best
    return out, touched, size, t0, t1


def _write_case(folder: Path, ranks: dict, labels: dict) -> None:
    ensure_dir(folder / "traces")
    for r, doc in ranks.items():
        K.write_events(folder / "traces" / f"rank{r}.json.gz", doc)
    atomic_write_text(folder / "labels.json", json.dumps(labels, indent=1))


def _load(base: Base) -> dict:
    docs = [K.read_events(f) for f in base.files]
    return {int((d.get("distributedInfo") or {}).get("rank", i)): d for i, d in enumerate(docs)}


def build_corpus(out: str | Path, bases: list[Base], healthy: list[Base] = (), kinds=tuple(INJECTORS),
                 severities=("low", "medium", "high"), log=print) -> list[dict]:
    """Write every case under out; return their labels. Deterministic: seeds come from the case name."""
    out = ensure_dir(out)
    written = []
    for base in list(bases) + list(healthy):
        ranks = _load(base)
        t0 = step_time(ranks)
        labels = {"kind": "healthy", "ranks": [], "true_gain_pct": 0.0, "severity": "none", "base": base.name,
                  "size": 0.0, "step_time_us_before": round(t0, 1), "step_time_us_after": round(t0, 1), "seed": 0}
        _write_case(out / f"healthy-{base.name}", ranks, labels)
        written.append(labels)
        log(f"healthy-{base.name}")
        if base in healthy:
            continue
        for kind in kinds:
            variants = [None]
            if kind == "straggler":
                if len(ranks) < 2:
                    continue
                variants = sorted(ranks)[:2]
            for slow in variants:
                for sev in severities:
                    name = f"{kind}-{sev}-{base.name}" + (f"-slow{slow}" if slow is not None else "")
                    seed = zlib.crc32(name.encode())
                    mod, touched, size, before, after = sized_case(kind, ranks, TARGET_PCT[sev], seed, slow)
                    gain = 100 * (after - before) / after
                    if gain < MIN_GAIN_PCT:
                        log(f"{name}: skipped, the base has nothing to inject it into (gain {gain:.2f} %)")
                        continue
                    labels = {"kind": kind, "ranks": touched, "true_gain_pct": round(gain, 3),
                              "severity": severity_of(gain), "target_severity": sev, "base": base.name,
                              "size": round(size, 4), "step_time_us_before": round(before, 1),
                              "step_time_us_after": round(after, 1), "seed": seed}
                    _write_case(out / name, mod, labels)
                    written.append(labels)
                    log(f"{name}: size {size:.4g}, true gain {gain:.2f} % ({labels['severity']})")
    if not written:
        raise TrainperfError(f"{out}: no cases built")
    return written
