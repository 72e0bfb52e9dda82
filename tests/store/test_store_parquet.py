"""Run store (Parquet + DuckDB): round trip, layout, views, concurrency, corrupt files, bad stores."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import warnings

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from trainperf.errors import TrainperfError
from trainperf.store import (KernelResult, RunRecord, StepSample, get_run, new_run_id, query, read_runs,
                             write_run)
from trainperf.store.parquet import CorruptRunFileWarning


def _record(i: int = 0, job: str = "llama-8b", n_steps: int = 3, **kw) -> RunRecord:
    return RunRecord(run_id=f"r{i:05d}-{new_run_id()}", job=job, host=f"node{i % 4}", nccl="2.21.5",
                     torch="2.5.1", layout="tp=2,pp=1,zero=3,recompute=selective,mbs=2", config={"lr": 3e-4, "i": i},
                     started_at=1.79e9 + i, step_time_s=1.0 + i / 1000,
                     samples=[StepSample(step=s, step_time_s=1.0 + s / 100, tokens_per_s=8192.0) for s in range(n_steps)],
                     kernels=[KernelResult("rms_norm", "trainperf", "4096x8192", "bf16", "fwd", 0.12, gbps=1500.0)], **kw)


def test_round_trip_and_views(tmp_path):
    rec = _record(1)
    path = write_run(rec, str(tmp_path))
    # hive layout: <store>/runs/date=YYYY-MM-DD/job=NAME/<run_id>.parquet
    rel = os.path.relpath(path, tmp_path)
    assert rel == f"runs/date={time.strftime('%Y-%m-%d', time.gmtime(rec.started_at))}/job=llama-8b/{rec.run_id}.parquet"
    assert read_runs(str(tmp_path)) == [rec]
    assert get_run(rec.run_id, str(tmp_path)) == rec
    runs = query("SELECT run_id, job, tp, zero, recompute, config_hash, n_samples FROM runs", str(tmp_path)).to_pylist()
    assert runs == [{"run_id": rec.run_id, "job": "llama-8b", "tp": 2, "zero": 3, "recompute": "selective",
                     "config_hash": rec.config_hash, "n_samples": 3}]
    steps = query("SELECT step, step_time_s, host FROM steps ORDER BY step", str(tmp_path)).to_pylist()
    assert [s["step_time_s"] for s in steps] == [1.0, 1.01, 1.02] and {s["host"] for s in steps} == {"node1"}
    k = query("SELECT kernel, impl, median_ms FROM kernels", str(tmp_path)).to_pylist()
    assert k == [{"kernel": "rms_norm", "impl": "trainperf", "median_ms": 0.12}]


def test_pyarrow_dataset_reads_the_layout_unchanged(tmp_path):
    # what Spark/Ray do: open the folder with hive partitioning, no trainperf code involved
    write_run(_record(1, job="job a/b"), str(tmp_path))
    write_run(_record(2, job="other"), str(tmp_path))
    d = ds.dataset(tmp_path / "runs", format="parquet", partitioning="hive")
    t = d.to_table(columns=["run_id", "job", "date", "step"], filter=ds.field("record") == "run")
    assert t.num_rows == 2
    steps = d.to_table(columns=["step"], filter=ds.field("record") == "step")
    assert sorted(steps.column("step").to_pylist()) == [0, 0, 1, 1, 2, 2]
    assert set(query("SELECT job FROM runs", str(tmp_path)).column("job").to_pylist()) == {"job a/b", "other"}


def test_store_from_env_and_default(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPERF_STORE", str(tmp_path / "envstore"))
    write_run(_record(1))
    assert len(read_runs()) == 1
    monkeypatch.delenv("TRAINPERF_STORE")
    monkeypatch.chdir(tmp_path)
    write_run(_record(2))
    assert (tmp_path / ".trainperf" / "runs").is_dir()


def _writer(args):
    root, w, n = args
    for i in range(n):
        write_run(_record(w * 1000 + i, job=f"job{w % 3}"), root)
    return n


def test_eight_concurrent_writers_all_readable(tmp_path):
    root = str(tmp_path)
    with mp.get_context("spawn").Pool(8) as pool:
        assert sum(pool.map(_writer, [(root, w, 100) for w in range(8)])) == 800
    assert query("SELECT count(*) AS n, count(DISTINCT run_id) AS u FROM runs", root).to_pylist() == [{"n": 800, "u": 800}]
    assert query("SELECT count(*) AS n FROM steps", root).to_pylist() == [{"n": 2400}]
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_corrupt_file_is_skipped_with_a_warning_naming_it(tmp_path):
    for i in range(3):
        write_run(_record(i), str(tmp_path))
    bad = next((tmp_path / "runs").rglob("*.parquet"))
    bad.write_bytes(b"PAR1 this is not parquet")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = query("SELECT count(*) AS n FROM runs", str(tmp_path)).to_pylist()[0]["n"]
        assert len(read_runs(str(tmp_path))) == 2
    assert n == 2
    msgs = [str(w.message) for w in caught if issubclass(w.category, CorruptRunFileWarning)]
    assert msgs and all(str(bad) in m for m in msgs)


def test_bad_stores_and_bad_records(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(TrainperfError, match="is a file"):
        query("SELECT 1", str(f))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(TrainperfError, match="not a trainperf store"):
        write_run(_record(1), str(tmp_path / "other"))
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    with pytest.raises(TrainperfError, match="does not exist"):
        read_runs(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()  # an existing empty folder is an empty store, not "a non-empty folder"
    with pytest.raises(TrainperfError, match=r"holds no runs yet \(an empty folder") as err:
        read_runs(str(tmp_path / "empty"))
    assert "non-empty" not in str(err.value) and not (tmp_path / "empty" / "runs").exists()
    assert write_run(_record(1), str(tmp_path / "empty")).startswith(str(tmp_path / "empty" / "runs"))
    with pytest.raises(TrainperfError, match="run id"):
        write_run(RunRecord(run_id="../evil", job="j"), str(tmp_path / "s"))
    with pytest.raises(TrainperfError, match="no run with id"):
        write_run(_record(1), str(tmp_path / "s"))
        get_run("nope", str(tmp_path / "s"))
    with pytest.raises(TrainperfError, match="query failed"):
        query("SELECT nope FROM runs", str(tmp_path / "s"))


def test_failed_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    write_run(_record(1), str(tmp_path))

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", boom)
    with pytest.raises(OSError):
        write_run(_record(2), str(tmp_path))
    files = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].suffix == ".parquet"
    assert len(read_runs(str(tmp_path))) == 1


def test_config_hash_names_the_configuration_not_its_results():
    """Two runs of one configuration share config_hash though their measured summaries differ."""
    from trainperf.store import RunRecord

    def rec(lr, step_time):
        return RunRecord(run_id=f"r{lr}{step_time}", job="j", model="tiny", layout="tp=1",
                         config={"lr": lr, "summary": {"step_time_s": step_time}})

    assert rec(1e-3, 0.5).config_hash == rec(1e-3, 0.7).config_hash
    assert rec(1e-3, 0.5).config_hash != rec(2e-3, 0.5).config_hash
