"""Real-run cases: the reference trainer on this machine (2 ranks, gloo) with a fault switched on by
`trainperf train --fault`, its clean twin measured in the same run.

Each run profiles steps PROFILE (11 steps, 10 in the analysed window); the fault holds from FAULT_FROM on, so
the trace holds 3 clean and 7 faulty steps and the steps before FAULT_FROM are the clean twin. Why so many: the
two ranks share a loaded 2-core machine, where either one is slower in some steps by the load alone; a
straggler (crossrank.straggler_p_value) must be slower step after step, and 4 steps (2 of them faulty), as
before, cannot show that at any size (the smallest p-value 4 steps allow is 0.125: diagnose then names one
unconfirmed, by a heuristic). Truth, over the traced
window (rank 0's ProfilerStep durations in its trace, s, all but the last as for the injected cases
(kineto.window_steps): unlike metrics.jsonl's step_time_s they include a checkpoint saved between
two steps):
- where the fault has a known size (a dataset that sleeps MS ms per micro-batch with grad_accum 1
  and no workers; a rank that sleeps MS ms a step while the others wait in the next collective):
  true_gain_pct = 100 * MS * faulty steps / sum of the profiled steps;
- where the run measures the fault's time itself (gc-collect's collections: the monitor's gc_pause_s of each faulty
  step, MEASURED_FAULTS): 100 * their sum over the window's faulty steps / sum of the profiled steps;
- otherwise (synchronous checkpoint) the twin difference: 100 * sum over faulty steps of
  (step - clean) / sum of the profiled steps, clean = mean of the clean profiled steps, >= 0.
Both are in labels.json (twin_gain_pct always): on a shared 2-core machine the twin difference
is noisy (the clean run's "faulty" steps differ from its clean ones by several %). A case whose truth is the twin
difference is run TWIN_RUNS times and keeps the run of the median difference (all of them in labels.json,
twin_gain_runs_pct): the load of a shared machine can change inside a run, and a faulty stretch run under more
load reads as the fault's cost (grad_sync_per_microbatch-high-real, 2026-12-05: every op of steps 8-13, the
forward too, 2.3x slower than in the faulty steps 6-7, a 45.8 % label where a quiet run of the same job measured
15-18 %).

Each RealBase is one job configuration (a base of its own in leave-one-base-out cross-validation): the
data-parallel run (DDP: one all-reduce per gradient bucket) and the fully sharded one (FSDP2, zero=3: an
all-gather of each block's parameters before its forward and backward, a reduce-scatter of its gradients), whose
traces differ in their collectives and in the host/communication balance of a step.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainperf.atomic import atomic_write_text, ensure_dir
from trainperf.corpus import kineto as K
from trainperf.corpus.build import severity_of
from trainperf.errors import TrainperfError

PROFILE = (3, 13)
FAULT_FROM = 6
STEPS = 13
# kind -> (case suffix, --fault value, ranks it touches (None: all)); sizes chosen for ~2/6/20 %
# of a ~0.35 s CPU step of the tiny model under DDP (RealBase.fault_scale scales the ms of another base)
REAL_FAULTS = {
    "data_loader_stall": [("low", "slow-data=6", None), ("medium", "slow-data=25", None),
                          ("high", "slow-data=100", None)],
    "straggler": [("low", "slow-rank=1:6:sleep", [1]), ("medium", "slow-rank=1:25:sleep", [1]),
                  ("high", "slow-rank=1:100:sleep", [1])],
    "checkpoint_stall": [("high", "sync-ckpt=1", None)],
    # 4 micro-batches a step (REAL_LAYOUTS), synchronised after each from FAULT_FROM on
    "grad_sync_per_microbatch": [("high", "sync-every-micro", None)],
    # a full collection (gc.collect()) in 1 (step 7), 3 (6, 9, 12) and all 7 of the window's faulty steps; each walks
    # every live Python object: ~0.1-0.2 s here once torch is imported, on every rank at the same step; or on rank 0
    # alone (3 of the steps), rank 1 waiting for it at the next collective (rank 0: its pauses are the ones its
    # metrics.jsonl measures)
    "gc_stall": [("low", "gc-collect=7", None), ("medium", "gc-collect=3", None), ("high", "gc-collect", None),
                 ("rank0", "gc-collect=3:0", [0])],
}
# kind -> layout items its runs need on top of the base's (--layout), e.g. gradient accumulation
REAL_LAYOUTS = {"grad_sync_per_microbatch": "ga=4"}
# kind -> other `trainperf train` arguments its runs need: the collections are in the traces with --profile-modules
# (with_stack and record_python_gc_info, torch 2.9+)
REAL_ARGS = {"gc_stall": ("--profile-modules",)}


# runs of a case whose truth is the twin difference (the median kept): 3, the fewest with a median that one loaded
# run cannot move
TWIN_RUNS = 3


def median_run(gains: list[float]) -> int:
    """Index of the run whose gain (%) is the median of `gains` (the lower of the middle two for an even count)."""
    order = sorted(range(len(gains)), key=lambda i: gains[i])
    return order[(len(gains) - 1) // 2]


def run_args(base_args: tuple[str, ...], kind: str) -> tuple[str, ...]:
    """`trainperf train` arguments of a base's run of `kind`: the base's, its --layout extended by REAL_LAYOUTS, then
    REAL_ARGS'."""
    args = [*base_args, *REAL_ARGS.get(kind, ())]
    extra = REAL_LAYOUTS.get(kind)
    if extra and "--layout" in args:
        i = args.index("--layout") + 1
        args[i] = f"{args[i]},{extra}"
    elif extra:
        args += ["--layout", extra]
    return tuple(args)


@dataclass(frozen=True)
class RealBase:
    """A real-run base: its name in labels.json, the case-name suffix, extra `trainperf train` arguments, and the
    factor on REAL_FAULTS' milliseconds that keeps the faults at ~2/6/20 % of its longer step."""

    name: str
    suffix: str
    args: tuple[str, ...] = ()
    fault_scale: float = 1.0


REAL_BASES = (
    RealBase("real:tiny-2rank-gloo-cpu", "real"),
    # FSDP2 steps took 0.80-0.96 s against DDP's 0.20-0.35 s on this machine (2026-12-02, load ~7): x2.5
    RealBase("real:tiny-fsdp2-2rank-gloo-cpu", "real-fsdp", ("--layout", "zero=3"), fault_scale=2.5),
)


def scaled_fault(fault: str, scale: float) -> str:
    """A --fault value with its milliseconds multiplied by scale (slow-data=MS, slow-rank=R:MS[:sleep]); other
    faults unchanged."""
    kind, _, value = fault.partition("=")
    if scale == 1.0 or kind not in ("slow-data", "slow-rank"):
        return fault
    if kind == "slow-data":
        return f"slow-data={float(value) * scale:g}"
    parts = value.split(":")
    parts[1] = f"{float(parts[1]) * scale:g}"
    return "slow-rank=" + ":".join(parts)


def known_added_s(fault: str | None) -> float | None:
    """Seconds a fault adds to each faulty step by construction, or None when not known."""
    if not fault:
        return None
    kind, _, value = fault.partition("=")
    if kind == "slow-data":
        return float(value) / 1000
    if kind == "slow-rank" and value.endswith(":sleep"):
        return float(value.split(":")[1]) / 1000
    return None


def _train(out: Path, fault: str | None, seed: int, args: tuple[str, ...] = ()) -> None:
    cmd = [sys.executable, "-m", "trainperf.cli", "train", "--model", "tiny", "--steps", str(STEPS), "--nproc", "2",
           "--synthetic", "--device", "cpu", "--seed", str(seed), "--profile-steps", f"{PROFILE[0]}:{PROFILE[1]}",
           "--out", str(out), "--store", str(out / "store"), *args]
    if fault:
        cmd += ["--fault", fault, "--fault-steps", f"{FAULT_FROM}:{STEPS}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise TrainperfError(f"train run for {out.name} failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")


def step_seconds(trace: Path) -> dict[int, float]:
    """ProfilerStep number -> duration (s) of the window steps of a Kineto trace (all but the last,
    kineto.window_steps: the injected cases' truth is taken over the same window)."""
    return {st.number: (st.end - st.ts) / 1e6 for st in K.window_steps(K.read_events(trace)["traceEvents"])}


MEASURED_FAULTS = ("gc-collect",)  # faults whose cost the monitor measures in each step (metrics.jsonl's gc_pause_s)


def measured_fault(fault: str | None) -> bool:
    """Whether the fault ("name[=args]") is one of MEASURED_FAULTS."""
    return bool(fault) and fault.partition("=")[0] in MEASURED_FAULTS


def measured_added_s(run: Path, fault: str | None) -> dict[int, float] | None:
    """step -> seconds a MEASURED_FAULTS fault added to it, as the run's monitor measured it (rank 0's metrics.jsonl:
    gc-collect's collections are gc_pause_s, every rank collecting at the same step); None for other faults."""
    if not measured_fault(fault):
        return None
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r.get("gc_pause_s") or 0.0 for r in map(json.loads, lines) if r.get("fault")}


def _gain_pct(rows: dict[int, float], faulty: bool, added_s: float | dict | None = None) -> tuple[float, float, float]:
    """(gain %, clean step s, faulty step s) of the profiled steps (rows: step -> s): from the known
    added seconds per faulty step when given (a number for every faulty step alike, or step -> seconds), else from
    the clean twin."""
    prof = [rows[s] for s in sorted(rows) if PROFILE[0] <= s <= PROFILE[1]]
    clean_steps = [rows[s] for s in sorted(rows) if PROFILE[0] <= s < FAULT_FROM]
    clean = sum(clean_steps) / len(clean_steps)
    bad = [rows[s] for s in sorted(rows) if FAULT_FROM <= s <= PROFILE[1]]
    if not faulty:
        return 0.0, clean, sum(bad) / len(bad)
    if isinstance(added_s, dict):
        added = sum(added_s.get(s, 0.0) for s in rows if FAULT_FROM <= s <= PROFILE[1])
        return 100 * added / sum(prof), clean, sum(bad) / len(bad)
    if added_s is not None:
        return 100 * added_s * len(bad) / sum(prof), clean, sum(bad) / len(bad)
    return max(0.0, 100 * sum(b - clean for b in bad) / sum(prof)), clean, sum(bad) / len(bad)


def _case(run: Path, case: Path, labels: dict) -> None:
    ensure_dir(case / "traces")
    for f in sorted((run / "traces").glob("rank*.json")):
        rank = f.name.split(".")[0]
        with open(f, "rb") as src, gzip.open(case / "traces" / f"{rank}.json.gz", "wb", compresslevel=5) as dst:
            shutil.copyfileobj(src, dst)
    atomic_write_text(case / "labels.json", json.dumps(labels, indent=1))


def build_real(out: str | Path, work: str | Path, bases: tuple[RealBase, ...] = REAL_BASES, log=print,
               kinds: tuple[str, ...] = ()) -> list[dict]:
    """Run the trainer of each base once clean and once per REAL_FAULTS entry (only those of `kinds`, "healthy"
    for the clean run, when given); write the cases under out."""
    written = []
    for base in bases:
        written += _build_base(out, work, base, log, kinds)
    return written


def _build_base(out: str | Path, work: str | Path, base: RealBase, log, kinds: tuple[str, ...] = ()) -> list[dict]:
    out, work = ensure_dir(out), ensure_dir(work)
    runs = [("healthy", "none", None, None)] + [(k, sev, scaled_fault(f, base.fault_scale), r)
                                                for k, v in REAL_FAULTS.items() for sev, f, r in v]
    written = []
    for seed, (kind, sev, fault, ranks) in enumerate(runs):  # a run's seed does not depend on `kinds`
        if kinds and kind not in kinds:
            continue
        name = f"{kind}-{sev}-{base.suffix}" if kind != "healthy" else f"healthy-{base.suffix}"
        by_twin = fault is not None and known_added_s(fault) is None and not measured_fault(fault)
        runs = []
        for i in range(TWIN_RUNS if by_twin else 1):
            run = work / (name if i == 0 else f"{name}.run{i}")
            shutil.rmtree(run, ignore_errors=True)
            _train(run, fault, seed, run_args(base.args, kind))
            shutil.rmtree(run / "checkpoints", ignore_errors=True)  # only the traces and metrics are kept
            runs.append((run, step_seconds(sorted((run / "traces").glob("rank0*.json"))[0])))
        twins = [_gain_pct(rows, fault is not None)[0] for _, rows in runs]
        kept = median_run(twins)
        (run, rows), twin = runs[kept], twins[kept]
        measured = measured_added_s(run, fault)
        gain, clean, bad = _gain_pct(rows, fault is not None, known_added_s(fault) if measured is None else measured)
        sev_measured = "none" if fault is None else severity_of(gain)
        labels = {"kind": kind, "ranks": ranks if ranks is not None else ([] if fault is None else [0, 1]),
                  "true_gain_pct": round(gain, 3), "twin_gain_pct": round(twin, 3),
                  "truth": "known size" if known_added_s(fault) is not None else
                  "measured pauses" if measured is not None else "clean twin",
                  "severity": sev_measured, "target_severity": sev,
                  "base": base.name, "fault": fault, "clean_step_s": round(clean, 4),
                  "faulty_step_s": round(bad, 4), "seed": seed}
        if len(runs) > 1:
            labels["twin_gain_runs_pct"] = [round(g, 3) for g in twins]
        _case(run, out / name, labels)
        written.append(labels)
        log(f"{name}: {fault or 'clean'}, clean {clean:.3f} s, faulty {bad:.3f} s, true gain {gain:.2f} % "
            f"(twin difference {twin:.2f} %)")
    return written
