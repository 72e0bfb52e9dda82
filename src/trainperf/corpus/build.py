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
from trainperf.corpus.inject import GPU_HOLDS_PER_STEP, INJECTORS, NotApplicable, inject_straggler, launches_per_step
from trainperf.errors import TrainperfError

HIGH_PCT = 10.0       # severity bands of the true gain (% of step time), as diagnose's findings use
MEDIUM_PCT = 3.0
MIN_GAIN_PCT = 0.2    # below this the base had nothing to inject into (e.g. no overlapped collectives)
TARGET_PCT = {"low": 1.8, "medium": 6.0, "high": 20.0}
SEARCH_STEPS = 8      # bracketing steps on the injection size to reach the target gain
COUNT_KINDS = ("host_sync", "small_kernels")  # sizes that are counts per step
# kinds only the real trainer runs carry (corpus.real.REAL_FAULTS), then the injected ones
REAL_ONLY_KINDS = ("grad_sync_per_microbatch",)
KIND_LABELS = tuple(INJECTORS) + REAL_ONLY_KINDS + ("healthy",)


@dataclass(frozen=True)
class Base:
    """A base trace set: a name, the Kineto files of its ranks, and the kinds injected into it
    (None: all)."""

    name: str
    files: tuple[str, ...]
    kinds: tuple[str, ...] | None = None


def default_bases(hta: str | Path) -> list[Base]:
    """The HTA test traces (MIT) of training jobs with ProfilerSteps and device work, one base per
    job: different vendors, GPUs, step lengths (1 to 620 ms), stream layouts and host/device balance,
    so that a base held out in cross-validation is a trace of another kind, not another rank.

    A base needs two or more host ProfilerStep#N spans (the last is left out of the window) and device
    work. Left out, and why (every folder read 2026-12-02: ProfilerStep spans, device ops, categories):
    critical_path/ (alexnet, simple_add, end_to_end, cuda_event_sync_multi_stream: a forward-only
    benchmark without ProfilerStep; cuda_event_sync: one step, 4 kernels), cupti_profiler/ (no device
    activity, counters only, no steps), mtia_* (MTIA's own event categories, no CUDA/HIP streams, and
    one step or none), cpu_only/, rank_non_gpu/, mixed_files/, rank_unavailable/,
    distributed_info_unavailable/ (one step, no device events), triton_example/, call_stack/ (one step,
    one kernel), large_integer_trace/ (one kernel, no steps), memory_analysis/ (a memory timeline, not a
    trace), with_gpu_user_annotation/ (a Quadro GP100 training loop of 5 iterations, but no ProfilerStep
    spans: where its steps start is not recorded, and the step finder, diagnose/steps.py, says so
    rather than cutting steps at its Optimizer.step annotations)."""
    hta = Path(hta)
    return [
        # A100, 2 of 128 ranks of a recommendation model, NCCL on side streams; 2 steps of ~615 ms
        Base("trace_filter", (str(hta / "trace_filter/sampled_rank-0.json.gz"),
                              str(hta / "trace_filter/sampled_rank-1.json.gz"))),
        # A100, rank 0 of 2, host-bound (GPU 78 % idle), backward on the autograd thread; 3 steps of ~220 ms
        Base("nccl_parser", (str(hta / "nccl_parser_config/nccl_data.json.gz"),)),
        # V100, GPU-bound, the host ~90 ms ahead of the device; 5 steps of ~96 ms
        Base("ns_resolution", (str(hta / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),)),
        # A100, rank 0 of 16, kernels start ~160 ms (median) after their launch although the GPU
        # is busy only ~40 % of the step; NCCL on 5 streams; 5 steps of ~215 ms
        # Host-side kinds are not injected: the stream model absorbs a 266 ms DataLoader fetch per
        # step into this queue for a 21 % gain, and whether the device's waits (64 ms gaps on the
        # compute stream each step) would move with the host cannot be told from one rank.
        # exposed_comm gains 0.00 % at every size here since its dependants move with it (only what
        # waited for a serialised collective waits longer): the host already blocks on the full
        # launch queue (2.3 ms launch calls, a 146 ms copy) and the compute stream's gaps absorb it.
        Base("negative_queue", (str(hta / "negative_queue_length_values_check/rank0.json.gz"),),
             kinds=("exposed_comm", "straggler")),
        # V100, rank 1 of 2, 404 small all-reduces per step already exposed on their own stream,
        # 216k events; 5 steps of ~345 ms
        Base("df_index_resolver", (str(hta / "df_index_resolver/df_index_resolver.json.gz"),)),
        # AMD MI250 (ROCm 6.2, hip* runtime names), a toy model's training step (9.3 ms, a 6.5 ms
        # first-launch hipLaunchKernel inside) and a last step cut short by the profiler (49 µs)
        Base("amd_mi250", (str(hta / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"),)),
    ]


def h200_bases(cases: str | Path) -> list[Base]:
    """The H200 loops without a planted fault of tests/data/h200_faults (benchmarks/gpu_diagnose_faults.py, torch 2.11,
    rank 0 of 1), bases of a kind the HTA traces have none of: a GPU-bound loop whose host runs ~28 ms ahead (the
    window opens on 13 ms of earlier steps' queued work) and one CUDA graph replay a step. Three steps each."""
    cases = Path(cases)
    return [Base("h200_gpu_bound", (str(cases / "healthy-h200-gpu_bound/traces/rank0.json.gz"),)),
            Base("h200_cuda_graph", (str(cases / "healthy-h200-cuda_graph/traces/rank0.json.gz"),))]


def severity_of(gain_pct: float) -> str:
    """high / medium / low band of a true gain (% of step time)."""
    return "high" if gain_pct >= HIGH_PCT else "medium" if gain_pct >= MEDIUM_PCT else "low"


def step_time(ranks: dict) -> float:
    """Step time of a set of ranks (µs): the slowest rank's, as collectives make all wait for it."""
    return max(K.step_time_us(d["traceEvents"]) for d in ranks.values())


def _start_size(kind: str, t0: float, x_us: float, ranks: dict) -> float:
    """A first guess of the injection size that adds x_us per step to a step of t0 µs."""
    n = len(K.window_steps(next(iter(ranks.values()))["traceEvents"]))
    return {"data_loader_stall": x_us, "checkpoint_stall": x_us * n, "host_sync": 8.0,
            "allocator_stall": x_us / 8, "pageable_copy": x_us, "small_kernels": x_us / 12.0,
            "straggler": 0.5 * x_us / t0 + 0.05, "exposed_comm": 0.5, "host_work": x_us,
            "layout_transposes": x_us / 16, "idle_with_work_queued": x_us / GPU_HOLDS_PER_STEP,
            "launch_bound": x_us / max(launches_per_step(ranks), 1.0)}[kind]


def inject_sized(kind: str, ranks: dict, size: float, seed: int, slow: int | None = None):
    """`kind` injected at `size` (the injector's unit) with the positions seed draws; returns (ranks, touched)."""
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
        out, touched = inject_sized(kind, ranks, size, seed, slow)
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


def write_case(folder: Path, ranks: dict, labels: dict) -> None:
    ensure_dir(folder / "traces")
    for r, doc in ranks.items():
        K.write_events(folder / "traces" / f"rank{r}.json.gz", doc)
    atomic_write_text(folder / "labels.json", json.dumps(labels, indent=1))


def load_base(base: Base) -> dict:
    """rank -> Kineto object of a base's files (the rank its distributedInfo names, else its place)."""
    docs = [K.read_events(f) for f in base.files]
    return {int((d.get("distributedInfo") or {}).get("rank", i)): d for i, d in enumerate(docs)}


def build_corpus(out: str | Path, bases: list[Base], kinds=tuple(INJECTORS),
                 severities=("low", "medium", "high"), log=print, targets: dict | None = None,
                 seed_salt: str = "") -> list[dict]:
    """Write every case under out; return their labels. Deterministic: seeds come from the case name (prefixed with
    seed_salt: another draw of every injection's positions); targets: severity -> target gain % (default
    TARGET_PCT; other sizes give a corpus no threshold was tuned on)."""
    targets = TARGET_PCT if targets is None else targets
    out = ensure_dir(out)
    written = []
    for base in bases:
        ranks = load_base(base)
        t0 = step_time(ranks)
        labels = {"kind": "healthy", "ranks": [], "true_gain_pct": 0.0, "severity": "none", "base": base.name,
                  "size": 0.0, "step_time_us_before": round(t0, 1), "step_time_us_after": round(t0, 1), "seed": 0}
        write_case(out / f"healthy-{base.name}", ranks, labels)
        written.append(labels)
        log(f"healthy-{base.name}")
        sizes_done: set = set()
        for kind in (k for k in kinds if base.kinds is None or k in base.kinds):
            variants = sorted(ranks)[:2] if kind == "straggler" and len(ranks) >= 2 else [None]
            for slow in variants:
                for sev in severities:
                    name = f"{kind}-{sev}-{base.name}" + (f"-slow{slow}" if slow is not None else "")
                    seed = zlib.crc32((seed_salt + name).encode())
                    try:
                        mod, touched, size, before, after = sized_case(kind, ranks, targets[sev], seed, slow)
                    except NotApplicable as e:
                        log(f"{kind}-*-{base.name}: skipped, {e}")
                        break
                    gain = 100 * (after - before) / after
                    if gain < MIN_GAIN_PCT:
                        log(f"{name}: skipped, the base has nothing to inject it into (gain {gain:.2f} %)")
                        continue
                    if (kind, slow, size) in sizes_done:
                        log(f"{name}: skipped, the same size as a smaller target (the base holds no more)")
                        continue
                    sizes_done.add((kind, slow, size))
                    labels = {"kind": kind, "ranks": touched, "true_gain_pct": round(gain, 3),
                              "severity": severity_of(gain), "target_severity": sev, "base": base.name,
                              "size": round(size, 4), "step_time_us_before": round(before, 1),
                              "step_time_us_after": round(after, 1), "seed": seed}
                    write_case(out / name, mod, labels)
                    written.append(labels)
                    log(f"{name}: size {size:.4g}, true gain {gain:.2f} % ({labels['severity']})")
    if not written:
        raise TrainperfError(f"{out}: no cases built")
    return written
