"""The run record a monitored run leaves behind (the store's one schema, trainperf.store.record)."""

from __future__ import annotations

import json
from pathlib import Path

from trainperf.atomic import atomic_write_text
from trainperf.monitor.monitor import Monitor, MonitorSummary
from trainperf.store.record import RunRecord, StepSample, new_run_id


def build_run_record(mon: Monitor, summary: MonitorSummary, metadata: dict, *, job: str, model: str = "",
                     layout: str = "", config: dict | None = None, run_id: str | None = None,
                     peak_source: str = "") -> RunRecord:
    """Return a RunRecord (kind "train") of this attempt's steps, summary metrics, environment and the
    peak (FLOP/s, the monitor's) its MFU was measured against, with ``peak_source`` saying where it came from."""
    env_keys = ("host", "gpu_model", "driver", "cuda", "nccl", "torch", "git_sha", "user")
    cfg = dict(config or {})
    cfg["summary"] = summary.to_dict()
    return RunRecord(
        run_id=run_id or new_run_id(), job=job, kind="train", started_at=mon.t_start,
        world_size=int(metadata.get("world_size", mon.world_size)), model=model, layout=layout, config=cfg,
        step_time_s=summary.step_time_s, tokens_per_s=summary.tokens_per_s, mfu=summary.mfu,
        mem_peak_bytes=summary.mem_peak_bytes, goodput=summary.goodput.goodput,
        peak_flops=mon.peak_flops, peak_source=peak_source,
        samples=[StepSample(step=r["step"], step_time_s=r["step_time_s"], tokens_per_s=r["tokens_per_s"],
                            mfu=r["mfu"], loss=r["loss"], data_wait_s=r["data_wait_s"],
                            mem_peak_bytes=r["mem_peak_bytes"]) for r in mon.records],
        **{k: str(metadata.get(k, "") or "") for k in env_keys},
    )


def save_run_record(record: RunRecord, run_dir: str | Path | None, store: str | None = None) -> tuple[str | None, str]:
    """Write ``record`` into the store (trainperf.store.write_run) and as run_record.json in ``run_dir``.

    Returns (the store's location of the record or None, a one-line note). A store that
    cannot be written is reported in the note, never fatal: the run's own files hold it.
    """
    if run_dir is not None:
        atomic_write_text(Path(run_dir) / "run_record.json", json.dumps(record.to_dict(), indent=1, default=str))
    try:
        from trainperf.store import write_run
    except ImportError as e:  # the store is optional for a training run
        return None, f"run record not stored ({e}); kept in run_record.json"
    try:
        where = write_run(record, store)
    except Exception as e:  # noqa: BLE001 - a broken store must not lose the training run
        return None, f"run record not stored ({type(e).__name__}: {e}); kept in run_record.json"
    return str(where), f"run record {record.run_id} stored at {where}"
