"""The store seam: one schema derived from the record dataclasses, two backends behind one interface."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from trainperf.store import KernelResult, RunFilter, RunRecord, StepSample, open_store, read_runs, write_run
from trainperf.store import schema
from trainperf.store.parquet import ParquetStore, arrow_schema
from trainperf.store.postgres import PostgresStore, _ddl

STORE_SRC = Path(schema.__file__).parent


def test_columns_are_the_dataclass_fields():
    # reference: the dataclasses themselves, read with dataclasses.fields
    assert schema.STEP_FIELDS == tuple(f.name for f in dataclasses.fields(StepSample))
    assert schema.KERNEL_FIELDS == tuple(f.name for f in dataclasses.fields(KernelResult))
    nested = ("job", "config", "samples", "kernels")
    run_fields = [f.name for f in dataclasses.fields(RunRecord) if f.name not in nested]
    assert [c for c in schema.RUN_COLUMNS if c in run_fields] == run_fields
    # hand-written types of a few columns, one per kind
    pa_types = {f.name: str(f.type) for f in arrow_schema()}
    assert (pa_types["step"], pa_types["data_wait_s"], pa_types["host"], pa_types["tp"], pa_types["recompute"]) == \
        ("int64", "double", "string", "int64", "string")
    ddl = " ".join(_ddl())
    assert '"world_size" BIGINT' in ddl and '"mfu" DOUBLE PRECISION' in ddl and '"kernel" TEXT' in ddl


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainperf.store"):
            out.append((node.module, [a.name for a in node.names]))
    return out


def test_backends_import_the_schema_not_each_other():
    for backend in ("parquet.py", "postgres.py"):
        imps = _imports(STORE_SRC / backend)
        mods = {m for m, _ in imps}
        assert mods <= {"trainperf.store.record", "trainperf.store.schema"}, (backend, mods)
        assert not [n for _, names in imps for n in names if n.startswith("_")], backend


def test_open_store_picks_the_backend(tmp_path):
    assert isinstance(open_store(str(tmp_path)), ParquetStore)
    pg = open_store("postgresql://u:secret@127.0.0.1:1/db")
    assert isinstance(pg, PostgresStore) and "secret" not in pg.location


def test_read_filters(tmp_path):
    recs = [RunRecord(run_id=f"r{i}", job="a" if i < 3 else "b", host=f"h{i % 2}", started_at=100.0 + i,
                      samples=[StepSample(step=1, step_time_s=1.0, data_wait_s=0.25)]) for i in range(5)]
    for r in recs:
        write_run(r, str(tmp_path))
    st = open_store(str(tmp_path))
    assert [r.run_id for r in st.read(RunFilter(job="a", host="h0"))] == ["r0", "r2"]
    assert [r.run_id for r in read_runs(str(tmp_path), since=103.0)] == ["r3", "r4"]
    assert st.read(RunFilter(run_ids=("r4",)))[0].samples[0].data_wait_s == 0.25
    bare = st.read(RunFilter(run_ids=("r4",)), samples=False)[0]
    assert bare.samples == [] and bare.host == "h0" and bare.started_at == 104.0
    assert st.query("SELECT count(*) AS n FROM steps WHERE host = ?", ["h1"]).to_pylist() == [{"n": 2}]


def test_annotations_map_to_column_kinds():
    assert [schema._kind(a) for a in ("list[int]", "float | None", "int", "bool", "str")] == \
        ["json", "float", "int", "int", "str"]
    with pytest.raises(TypeError):
        schema._kind("set")
