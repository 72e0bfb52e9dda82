"""The store's columns and their types, derived from the record dataclasses in store/record.py.

Both backends (Parquet files read by DuckDB, PostgreSQL tables) build their tables from these
lists, so a field added to ``RunRecord``, ``StepSample`` or ``KernelResult`` reaches every
backend and view with no second list to edit. Three tables (views in DuckDB):

* ``runs``: one row per run: the RunRecord's fields (``config`` stored as ``config_json`` plus its
  ``config_hash``, and the layout string parsed into ``tp``, ``pp``, ... for slicing), with
  ``date`` (UTC day the run started) and ``n_samples`` / ``n_kernels``;
* ``steps``: one row per StepSample, ``kernels``: one row per KernelResult, each carrying the
  run's CONTEXT columns so a slice by host or version needs no join.

Also here, because both backends need them: the run-row values of a record, the WHERE clause
of the read filters, and records rebuilt from rows.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields

from trainperf.errors import TrainperfError
from trainperf.store.record import KernelResult, RunRecord, StepSample

_NESTED = ("samples", "kernels")  # RunRecord fields stored as their own tables
LAYOUT_COLUMNS = ("tp", "pp", "dp", "cp", "zero", "recompute", "mbs", "precision")  # Layout fields sliced on


def _kind(annotation: str) -> str:
    """Return 'str', 'int', 'float' or 'json' for a dataclass field's annotation (text)."""
    a = annotation.replace(" ", "")
    if a.startswith(("dict", "list")):
        return "json"
    if "float" in a:
        return "float"
    if a.startswith(("int", "bool")):
        return "int"
    if a.startswith("str"):
        return "str"
    raise TypeError(f"store schema: no column type for annotation {annotation!r}")


def _field_kinds(cls) -> dict[str, str]:
    return {f.name: _kind(f.type if isinstance(f.type, str) else f.type.__name__) for f in fields(cls)}


def _layout_kinds() -> dict[str, str]:
    from trainperf.specs import Layout

    kinds = _field_kinds(Layout)
    return {c: kinds[c] for c in LAYOUT_COLUMNS}


STEP_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StepSample))
KERNEL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(KernelResult))
# run-level columns in file order; job (and date) are partition columns in the Parquet store
RUN_COLUMNS: tuple[str, ...] = tuple(
    c for f in fields(RunRecord) if f.name not in _NESTED + ("job",)
    for c in ((("config_json", "config_hash") + LAYOUT_COLUMNS) if f.name == "config" else (f.name,)))
COUNT_COLUMNS = ("n_samples", "n_kernels")
# run-level columns repeated on every step and kernel row
CONTEXT: tuple[str, ...] = ("run_id", "job", "date", "kind", "started_at", "host", "gpu_model", "driver", "cuda",
                            "nccl", "torch", "git_sha", "world_size", "model", "layout", "config_hash")
# summary fields a run may leave unmeasured (None)
OPTIONAL_RUN_FIELDS = frozenset(f.name for f in fields(RunRecord) if "None" in str(f.type))


def column_kind(name: str) -> str:
    """Return 'str', 'int' or 'float': the type of column ``name`` in every table and backend."""
    if name in _KINDS:
        return _KINDS[name]
    raise KeyError(f"store schema: unknown column {name!r}")


def _all_kinds() -> dict[str, str]:
    kinds = {"record": "str", "date": "str", "config_json": "str", "config_hash": "str", "n_samples": "int",
             "n_kernels": "int"}
    for cls in (RunRecord, StepSample, KernelResult):
        for name, k in _field_kinds(cls).items():
            if name not in _NESTED and name != "config":
                kinds.setdefault(name, k)
    kinds.update(_layout_kinds())
    return kinds


_KINDS = _all_kinds()


def layout_values(layout: str) -> dict:
    """Return the LAYOUT_COLUMNS parsed from a layout string (all None when it does not parse)."""
    if not layout:
        return dict.fromkeys(LAYOUT_COLUMNS)
    from trainperf.specs import parse_layout

    try:
        lay = parse_layout(layout)
    except (TrainperfError, ValueError):
        return dict.fromkeys(LAYOUT_COLUMNS)
    return {k: getattr(lay, k) for k in LAYOUT_COLUMNS}


def run_date(rec: RunRecord) -> str:
    """Return the UTC date (YYYY-MM-DD) a run started: its date partition."""
    return time.strftime("%Y-%m-%d", time.gmtime(rec.started_at))


def run_row(rec: RunRecord) -> dict:
    """Return the values of every runs-table column for ``rec`` (job, date and counts included)."""
    row = {c: getattr(rec, c) for c in RUN_COLUMNS if c not in ("config_json", "config_hash") + LAYOUT_COLUMNS}
    row["config_json"] = json.dumps(rec.config, sort_keys=True, default=str)
    row["config_hash"] = rec.config_hash
    row.update(layout_values(rec.layout))
    row.update(job=rec.job, date=run_date(rec), n_samples=len(rec.samples), n_kernels=len(rec.kernels))
    return row


def step_values(s: StepSample) -> list:
    """Return one step row's STEP_FIELDS values."""
    return [getattr(s, k) for k in STEP_FIELDS]


def kernel_values(k: KernelResult) -> list:
    """Return one kernel row's KERNEL_FIELDS values."""
    return [getattr(k, f) for f in KERNEL_FIELDS]


@dataclass(kw_only=True, frozen=True)
class RunFilter:
    """Which runs to read (None: no condition). ``since``: unix seconds, started at or after."""

    job: str | None = None
    run_ids: tuple[str, ...] | None = None
    since: float | None = None
    host: str | None = None

    def where(self, mark: str, member: str) -> tuple[str, list]:
        """Return (``" WHERE ..."`` or ``""``, its parameters) for the runs table.

        ``mark``: the backend's placeholder; ``member``: its SQL testing ``run_id`` against a list parameter.
        """
        conds, params = [], []
        for col, v in (("job", self.job), ("host", self.host)):
            if v is not None:
                conds.append(f"{col} = {mark}")
                params.append(v)
        if self.run_ids is not None:
            conds.append(member)
            params.append(list(self.run_ids))
        if self.since is not None:
            conds.append(f"started_at >= {mark}")
            params.append(float(self.since))
        return (" WHERE " + " AND ".join(conds)) if conds else "", params


def row_to_record(row: dict) -> RunRecord:
    """Return the RunRecord of one runs-table row (``samples`` / ``kernels``: lists of field dicts)."""
    kw = {}
    for f in fields(RunRecord):
        if f.name in _NESTED or f.name == "config":
            continue
        v = row.get(f.name)
        if f.name in ("started_at", "world_size"):
            v = v or {"started_at": 0.0, "world_size": 1}[f.name]
        elif v is None and f.name not in OPTIONAL_RUN_FIELDS:
            v = ""
        kw[f.name] = v
    kw["config"] = json.loads(row.get("config_json") or "{}")
    kw["samples"] = [StepSample(**{k: s[k] for k in STEP_FIELDS}) for s in row.get("samples") or []]
    kw["kernels"] = [KernelResult(**{k: r[k] for k in KERNEL_FIELDS}) for r in row.get("kernels") or []]
    return RunRecord(**kw)


def records_from_rows(runs: list[dict], step_rows, kernel_rows) -> list[RunRecord]:
    """Return the RunRecords of ``runs`` (run rows as dicts), in their order, samples in step order.

    ``step_rows``: tuples (run_id, *STEP_FIELDS); ``kernel_rows``: tuples (run_id, *KERNEL_FIELDS).
    """
    samples: dict = {r["run_id"]: [] for r in runs}
    kernels: dict = {r["run_id"]: [] for r in runs}
    for r in step_rows:
        samples[r[0]].append(dict(zip(STEP_FIELDS, r[1:])))
    for r in kernel_rows:
        kernels[r[0]].append(dict(zip(KERNEL_FIELDS, r[1:])))
    out = []
    for r in runs:
        r = dict(r, samples=sorted(samples[r["run_id"]], key=lambda s: s["step"]), kernels=kernels[r["run_id"]])
        out.append(row_to_record(r))
    return out

