"""One side of a comparison: the runs of A or of B, read from run folders or the run store.

A run folder is what ``trainperf train`` (or ``trainperf.monitor`` in any loop) leaves:
``metrics.jsonl`` (the last attempt's record of each step counts), ``events.jsonl`` (the job's
start), ``run.json`` (with ``comparable``: what decides whether two runs train the same thing)
and ``summary.json``. A store run id gives its record's per-step samples (no grad norm) and
the ``comparable`` and ``eval`` entries of its config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainperf.errors import TrainperfError


@dataclass(kw_only=True)
class RunData:
    """One run's per-step series (arrays aligned on ``step``) and its run-level facts."""

    name: str  # folder or run id, as given
    step: np.ndarray  # optimizer step numbers, ascending
    step_time_s: np.ndarray
    loss: np.ndarray  # NaN where not recorded
    grad_norm: np.ndarray  # NaN where not recorded
    tokens_per_s: np.ndarray
    mfu: np.ndarray
    mem_peak_bytes: np.ndarray
    t_end: np.ndarray  # unix seconds at each step's end (reconstructed from step times for store runs)
    t_start: float  # unix seconds: the job's first process start
    world_size: int = 1
    goodput: float | None = None
    eval_step: np.ndarray = field(default_factory=lambda: np.zeros(0))
    eval_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    comparable: dict | None = None
    data_wait_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # NaN where not recorded
    run_id: str = ""  # the store's run id ("" when the folder has no run record)
    host: str = ""
    device: str = ""  # "cpu", a GPU model, ... ("" when not recorded)
    peak_flops: float | None = None  # FLOP/s per device the run's MFU is against (None: not recorded)
    peak_source: str = ""  # where that peak comes from (catalog, measured, --peak-tflops)


def _col(recs: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else float(r[key]) for r in recs], dtype=float)


def _from_folder(path: Path) -> RunData:
    from trainperf.monitor.monitor import read_jsonl

    latest: dict[int, dict] = {}
    for r in read_jsonl(path / "metrics.jsonl"):  # a resumed step: the latest attempt's record counts
        if "step" in r and "step_time_s" in r:
            latest[int(r["step"])] = r
    if not latest:
        raise TrainperfError(f"{path}: no step records in metrics.jsonl (is this a trainperf run folder?)")
    recs = [latest[k] for k in sorted(latest)]
    run = _json(path / "run.json")
    summary = _json(path / "summary.json")
    starts = [float(e["t"]) for e in read_jsonl(path / "events.jsonl") if e.get("kind") == "attempt_start"]
    t_end = _col(recs, "t_end")
    t_start = min(starts) if starts else float(t_end[0] - recs[0]["step_time_s"])
    evals = [r for r in recs if r.get("eval_loss") is not None]
    record = _json(path / "run_record.json")
    return RunData(name=str(path), step=np.array(sorted(latest), dtype=float), step_time_s=_col(recs, "step_time_s"),
                   loss=_col(recs, "loss"), grad_norm=_col(recs, "grad_norm"), tokens_per_s=_col(recs, "tokens_per_s"),
                   mfu=_col(recs, "mfu"), mem_peak_bytes=_col(recs, "mem_peak_bytes"), t_end=t_end, t_start=t_start,
                   world_size=int(run.get("world_size") or summary.get("world_size") or 1),
                   goodput=(summary.get("goodput") or {}).get("goodput"),
                   eval_step=np.array([r["step"] for r in evals], dtype=float),
                   eval_loss=np.array([r["eval_loss"] for r in evals], dtype=float),
                   comparable=run.get("comparable"), data_wait_s=_col(recs, "data_wait_s"),
                   run_id=str(record.get("run_id") or ""),
                   host=str(record.get("host") or (run.get("metadata") or {}).get("host") or ""),
                   device=str(summary.get("device") or record.get("gpu_model") or ""),
                   peak_flops=float(summary["peak_flops"]) if summary.get("peak_flops") else None,
                   peak_source=str(summary.get("peak_source") or ""))


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TrainperfError(f"{path}: cannot read ({type(e).__name__})") from None


def _from_store(run_id: str, store: str | None) -> RunData:
    from trainperf.store import get_run

    try:
        rec = get_run(run_id, store)
    except Exception as e:  # noqa: BLE001 - a store that cannot answer is the user's one line
        raise TrainperfError(f"{run_id}: not a run folder, nor a run id in the store ({e})") from None
    return from_record(rec, run_id)


def from_record(rec, name: str | None = None) -> RunData:
    """Return a store RunRecord as a RunData named ``name`` (default: its run id); raise
    TrainperfError when it has no per-step samples."""
    samples = sorted(rec.samples, key=lambda s: s.step)
    if not samples:
        raise TrainperfError(f"run {rec.run_id}: the record has no per-step samples")

    def col(key):
        return np.array([np.nan if getattr(s, key) is None else float(getattr(s, key)) for s in samples])

    st = col("step_time_s")
    ev = rec.config.get("eval") or []
    return RunData(name=name or rec.run_id, step=np.array([s.step for s in samples], dtype=float), step_time_s=st,
                   loss=col("loss"), grad_norm=np.full(len(samples), np.nan), tokens_per_s=col("tokens_per_s"),
                   mfu=col("mfu"), mem_peak_bytes=col("mem_peak_bytes"),
                   t_end=rec.started_at + np.cumsum(np.nan_to_num(st)), t_start=float(rec.started_at),
                   world_size=int(rec.world_size or 1), goodput=rec.goodput,
                   eval_step=np.array([e[0] for e in ev], dtype=float), eval_loss=np.array([e[1] for e in ev], dtype=float),
                   comparable=rec.config.get("comparable"), data_wait_s=col("data_wait_s"), run_id=rec.run_id,
                   host=rec.host or "", device=str(rec.config.get("device") or rec.gpu_model or ""),
                   peak_flops=rec.peak_flops or None, peak_source=rec.peak_source or "")


def load_run(spec: str, store: str | None = None) -> RunData:
    """Return the run named by ``spec``: a run folder, else a run id in ``store``."""
    p = Path(spec)
    if p.is_dir() and not (p / "metrics.jsonl").is_file() and _holds_traces(p):
        raise TrainperfError(f"{spec}: a traces folder: compare takes run folders (or store run ids); "
                             "to compare traces use `trainperf diff`")
    if p.is_dir():
        return _from_folder(p)
    if p.exists():
        raise TrainperfError(f"{spec}: not a run folder (expected a folder with metrics.jsonl, or a run id)")
    return _from_store(spec, store)


RUN_FILES = ("run.json", "summary.json", "run_record.json")  # a run folder's own .json files: never traces


def _holds_traces(p: Path) -> bool:
    """Return whether folder ``p`` holds profiler traces rather than a run's records: named ``traces``
    (what ``trainperf train --profile-steps`` writes), or holding trace files as ``trainperf diff``
    reads them (``trace.load.TRACE_SUFFIXES``, a run's own RUN_FILES aside) directly or one folder down."""
    from trainperf.trace.load import TRACE_SUFFIXES

    def traces_in(d: Path) -> bool:
        return any(f.is_file() and f.name.endswith(TRACE_SUFFIXES) and f.name not in RUN_FILES for f in d.iterdir())

    return p.name == "traces" or traces_in(p) or any(traces_in(d) for d in p.iterdir() if d.is_dir())


def load_side(spec: str, store: str | None = None) -> list[RunData]:
    """Return the runs of one side: ``spec`` is one run or several (repeats) separated by commas."""
    names = [s.strip() for s in str(spec).split(",") if s.strip()]
    if not names:
        raise TrainperfError(f"{spec!r}: no run named")
    return [load_run(n, store) for n in names]


def finite(x: np.ndarray) -> np.ndarray:
    """Return the finite values of ``x``."""
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x)]

