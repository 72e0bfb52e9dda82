"""Benchmark the run store: write throughput and DuckDB queries over 10 million step rows.

Builds a Parquet store of ``--runs`` runs x ``--steps`` steps through trainperf.store.write_run
(one file per run, hive-partitioned by date and job), then times whole ``trainperf.store.query``
calls (listing the files, opening DuckDB, creating the views, running the SQL), median of
``--repeat``. Side by side: the same SQL on one flat Parquet file of the same step rows
(no nesting, no per-run files): the floor our layout pays against.

    .venv/bin/python benchmarks/bench_store.py [--runs 1000] [--steps 10000] [--dir /tmp/tp_bench_store]

``--schema-cost``: the same store read when its files are of an older schema (before
``peak_flops``), and after ``trainperf runs migrate``.

``--pg-connect URL``: what every call on a PostgreSQL store pays before its own statement (connect,
make sure the tables exist): whole ``query``/``read_runs`` calls on an empty store and on one of
``--runs`` small runs, in a private schema of the server at URL, median of ``--repeat``, with the
statements the server ran per call (``pg_stat_statements`` is not assumed: the calls are counted
through psycopg's cursor).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

QUERIES = {
    "count": "SELECT count(*) FROM steps",
    "mean by job, host": "SELECT job, host, avg(step_time_s), avg(tokens_per_s) FROM steps GROUP BY job, host",
    "median by job, host": "SELECT job, host, median(step_time_s), avg(tokens_per_s) FROM steps GROUP BY job, host",
    "p90 per run after warm-up": "SELECT run_id, quantile_cont(step_time_s, 0.9) FROM steps WHERE step >= 100 GROUP BY run_id",
    "runs list": "SELECT run_id, job, started_at, step_time_s FROM runs ORDER BY started_at DESC LIMIT 50",
}


def build(root: Path, runs: int, steps: int) -> float:
    from rich.progress import track

    from trainperf.store import RunRecord, StepSample, write_run

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    write_s = 0.0
    for i in track(range(runs), description=f"writing {runs} runs x {steps} steps"):
        st = 1.0 + 0.01 * rng.standard_normal(steps)
        rec = RunRecord(run_id=f"bench-{i:05d}", job=f"job{i % 8}", host=f"node{i % 64:02d}", nccl="2.21.5",
                        torch="2.5.1", layout="tp=2,pp=1,zero=3", started_at=1.7e9 + 3600 * i,
                        step_time_s=float(np.median(st)),
                        samples=[StepSample(step=k, step_time_s=float(v), tokens_per_s=float(8192 / v))
                                 for k, v in enumerate(st)])
        t1 = time.perf_counter()
        write_run(rec, str(root))
        write_s += time.perf_counter() - t1
    print(f"built in {time.perf_counter() - t0:.1f} s; write_run total {write_s:.1f} s "
          f"({1000 * write_s / runs:.1f} ms per run of {steps} steps)")
    return write_s


def flat_copy(root: Path, flat: Path) -> None:
    from trainperf.store.parquet import connect

    con = connect(root)
    con.execute(f"COPY (SELECT * FROM steps) TO '{flat}' (FORMAT parquet, COMPRESSION zstd)")
    con.close()


def schema_cost(root: Path, repeat: int) -> None:
    """Print the cost of run files of an older schema (no peak_flops / peak_source columns, as written
    before those fields existed): the same queries on three copies of the store, timed in turn (round
    robin, so that a machine's changing load falls on all alike): as built, with its first file older
    (read by column name), with every file older; then again after ``trainperf runs migrate``
    (``migrate_store``) on the two older copies. Medians of ``repeat`` whole ``query`` calls."""
    import warnings

    import pyarrow.parquet as pq

    from trainperf.store import query
    from trainperf.store.parquet import OlderSchemaWarning, migrate_store, run_files

    older = ("peak_flops", "peak_source")
    sqls = {k: QUERIES[k] for k in ("count", "runs list")}

    def make_older(path):
        f = pq.ParquetFile(path)
        groups = [f.read_row_group(i).drop_columns(list(older)) for i in range(f.num_row_groups)]
        with pq.ParquetWriter(path, groups[0].schema, compression="zstd") as w:
            for g in groups:
                w.write_table(g)

    copies = {"as built": root}
    for name in ("first file older", "every file older"):
        copies[name] = root.parent / f"{root.name}_{name.split()[0]}"
        shutil.rmtree(copies[name], ignore_errors=True)
        shutil.copytree(root, copies[name])
        files = run_files(copies[name])
        for p in files[:1] if name.startswith("first") else files:
            make_older(p)

    def table(title):
        times = {(c, q): [] for c in copies for q in sqls}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OlderSchemaWarning)
            for _ in range(repeat):
                for c, where in copies.items():
                    for q, sql in sqls.items():
                        t0 = time.perf_counter()
                        query(sql, str(where))
                        times[(c, q)].append(time.perf_counter() - t0)
        print(f"{title}: {len(run_files(root))} run files, median s of {repeat}: " + " ".join(f"{q:>10}" for q in sqls))
        for c in copies:
            print(f"  {c:<20} " + " ".join(f"{statistics.median(times[(c, q)]):>10.3f}" for q in sqls), flush=True)

    table("before migrate")
    for name in ("first file older", "every file older"):
        t0 = time.perf_counter()
        n = migrate_store(copies[name])
        print(f"migrate_store on '{name}': {n} files rewritten in {time.perf_counter() - t0:.1f} s")
    table("after migrate")


def pg_connect_cost(url: str, runs: int, repeat: int) -> None:
    """Print the median time of whole store calls on PostgreSQL at ``url`` (module doc: ``--pg-connect``),
    and how many statements each call sent, in a fresh schema (dropped at the end)."""
    import uuid

    import psycopg

    from trainperf.store import RunRecord, StepSample, query, read_runs, write_run

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(url, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    store = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    sent = [0]
    real_execute = psycopg.Cursor.execute

    def counting(self, *a, **k):  # count the statements a store call sends (psycopg's own method, wrapped)
        sent[0] += 1
        return real_execute(self, *a, **k)

    def once(call):
        sent[0] = 0
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0, sent[0]

    def new_run():
        return RunRecord(run_id=f"pgw-{uuid.uuid4().hex[:8]}", job="bench", started_at=1.8e9,
                         samples=[StepSample(step=k, step_time_s=1.0) for k in range(20)])

    psycopg.Cursor.execute = counting
    try:
        rows = {"query SELECT 1, empty store (first call)": [once(lambda: query("SELECT 1 AS one", store))]}
        for i in range(runs):
            write_run(RunRecord(run_id=f"pgb-{i}", job="bench", host=f"node{i % 4}", started_at=1.7e9 + i,
                                samples=[StepSample(step=k, step_time_s=1.0) for k in range(20)]), store)
        def bare():  # the floor: a connection and one statement, no store code
            with psycopg.connect(store, connect_timeout=5) as con:
                con.cursor().execute("SELECT 1")

        calls = {"psycopg connect + SELECT 1 (the floor)": bare,
                 "query SELECT 1": lambda: query("SELECT 1 AS one", store),
                 f"read_runs, {runs} runs, samples=False": lambda: read_runs(store, samples=False),
                 f"read_runs, {runs} runs x 20 steps": lambda: read_runs(store),
                 "write_run, one run of 20 steps": lambda: write_run(new_run(), store)}
        for _ in range(repeat):  # round robin: a changing machine load falls on every call alike
            for name, call in calls.items():
                rows.setdefault(name, []).append(once(call))
    finally:
        psycopg.Cursor.execute = real_execute
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()
    print(f"PostgreSQL store calls, median of {repeat} (ms, statements sent per call):")
    for name, got in rows.items():
        t, n = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
        print(f"  {name:<40} {1e3 * t:>8.1f} ms {n:>5.0f} statements", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/tp_bench_store")
    ap.add_argument("--keep", action="store_true", help="reuse an existing store in --dir")
    ap.add_argument("--schema-cost", action="store_true",
                    help="only time queries on files of an older schema, before and after `runs migrate`")
    ap.add_argument("--pg-connect", metavar="URL", help="only time store calls on PostgreSQL at URL (module doc)")
    args = ap.parse_args()
    if args.pg_connect:
        pg_connect_cost(args.pg_connect, args.runs, args.repeat)
        return
    import duckdb

    from trainperf.store import query
    from trainperf.store.parquet import store_size_bytes

    root = Path(args.dir)
    if not (args.keep and (root / "runs").is_dir()):
        shutil.rmtree(root, ignore_errors=True)
        build(root, args.runs, args.steps)
    if args.schema_cost:
        schema_cost(root, args.repeat)
        return
    flat = root.parent / (root.name + "_flat.parquet")
    if not flat.exists():
        flat_copy(root, flat)
    n = query("SELECT count(*) AS n FROM steps", str(root)).column("n")[0].as_py()
    print(f"store {root}: {n:,} step rows, {store_size_bytes(root) / 2**20:.0f} MiB in run files; "
          f"flat copy {flat.stat().st_size / 2**20:.0f} MiB")
    print(f"{'query':<28} {'store s (median)':>17} {'flat s (median)':>16} {'ratio':>6}")
    for name, sql in QUERIES.items():
        ts, tf = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            query(sql, str(root))
            ts.append(time.perf_counter() - t0)
            if "FROM steps" in sql:
                t0 = time.perf_counter()
                con = duckdb.connect()
                con.execute(f"CREATE VIEW steps AS SELECT * FROM read_parquet('{flat}')")
                con.sql(sql).to_arrow_table()
                con.close()
                tf.append(time.perf_counter() - t0)
        ms, mf = statistics.median(ts), (statistics.median(tf) if tf else float("nan"))
        print(f"{name:<28} {ms:>17.3f} {mf:>16.3f} {ms / mf if tf else float('nan'):>6.2f}")


if __name__ == "__main__":
    main()
