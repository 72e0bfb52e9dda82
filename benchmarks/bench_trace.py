"""Trace loading cost, trainperf vs HTA 0.5.0, measured side by side in fresh processes.

Cases: df_index_resolver (54 MB of JSON, the largest real trace) and an 8-rank set made by
relabelling a real rank (negative_queue_length_values_check, 26 MB) as ranks 0-7 in /tmp.
For each tool and case: CPU seconds (process + children), wall seconds, peak RSS and the RSS after
imports, median of --repeat runs. Memory ratio = (peak RSS - RSS after imports) / JSON bytes of
one rank (the parse worker's own cost, as HTA's "100 MB plus 5x the JSON per worker").

    .venv/bin/python benchmarks/bench_trace.py [--repeat 3] [--options] [--hta-python /tmp/hta-venv/bin/python]
    .venv/bin/python benchmarks/bench_trace.py --analyses [--src /tmp/old/src] [--repeat 5]

--options first compares the loader's own options (isal or zlib inflater, msgspec typed structs or
orjson/json dicts) on df_index_resolver, interleaved run by run.
--analyses measures, per rank, the CPU seconds of loading and of the per-operator roofline and the
collective statistics that follow it (on the traces that record shapes or message sizes); with
--src it measures another checkout's src/ side by side (e.g. `git archive <commit> src | tar -x -C
/tmp/old`), interleaved run by run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "../shared/data/traces/hta"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_hta import run_hta  # noqa: E402

OURS = r'''
import gzip, json, resource, sys, time, zlib
import numpy, trainperf.trace
from trainperf.trace import kineto, load_trace
opts = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else []
if "zlib" in opts:  # the stdlib inflater instead of isal's igzip
    kineto._gzip_module, kineto._IsalError = gzip, zlib.error
if "dicts" in opts:  # the generic path: events parsed into dicts, then a Python loop
    kineto._typed_decode = None
if "json" in opts:  # the stdlib json module instead of orjson (no optional dependency at all)
    kineto._loads, kineto._DecodeError = json.loads, (ValueError,)
def hwm_mb():  # this process's peak RSS (VmHWM); ru_maxrss would carry the parent's peak across exec
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
base = hwm_mb()
c0 = time.process_time(); w0 = time.perf_counter()
tables = load_trace(sys.argv[1])
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu_s": time.process_time() - c0 + ch.ru_utime + ch.ru_stime, "wall_s": time.perf_counter() - w0,
                  "peak_rss_mb": max(hwm_mb(), ch.ru_maxrss / 1024), "main_peak_rss_mb": hwm_mb(),
                  "worker_peak_rss_mb": ch.ru_maxrss / 1024,
                  "base_rss_mb": base, "events": sum(len(t) for t in tables.values())}))
'''


ANALYSES = r'''
import inspect, json, sys, time
from trainperf.trace import read_kineto
from trainperf.diagnose.roofline import rank_roofline
from trainperf.diagnose.collectives import collective_stats, comm_args
c0 = time.process_time(); t = read_kineto(sys.argv[1]); c1 = time.process_time()
s = rank_roofline(t); c2 = time.process_time()
# before the loader kept the args, comm_args took the file (and read it again)
takes_table = "t" in inspect.signature(comm_args).parameters
stats = collective_stats({0: t}, None, {0: comm_args(t if takes_table else t.source)}); c3 = time.process_time()
print(json.dumps({"load_s": c1 - c0, "roofline_s": c2 - c1, "collectives_s": c3 - c2, "rows": len(s.rows),
                  "groups": len(stats), "events": len(t)}))
'''
ANALYSIS_CASES = ("negative_queue_length_values_check/rank0.json.gz", "mtia_trace_single_rank/mtia_rank_0.json.gz",
                  "nccl_parser_config/nccl_data.json.gz")


def run_analyses(path: Path, src: str | None) -> dict:
    import os

    env = dict(os.environ, PYTHONPATH=src) if src else None
    r = subprocess.run([sys.executable, "-c", ANALYSES, str(path)], capture_output=True, text=True, timeout=900,
                       env=env)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare_analyses(src: str | None, repeat: int) -> None:
    """CPU s of load, roofline and collectives per rank: this checkout (and --src), interleaved."""
    trees = {"this checkout": None} | ({f"--src {src}": src} if src else {})
    print(f"| trace | code | load CPU s | roofline CPU s | collectives CPU s | roofline rows | groups | "
          f"(median of {repeat}) |")
    print("|---|---|---|---|---|---|---|---|")
    for case in ANALYSIS_CASES:
        runs: dict[str, list] = {k: [] for k in trees}
        for _ in range(repeat):
            for k, tree in trees.items():
                runs[k].append(run_analyses(DATA / case, tree))
        for k, rs in runs.items():
            m = median_of(rs)
            print(f"| {case.split('/')[0]} | {k} | {m['load_s']:.3f} | {m['roofline_s']:.3f} | "
                  f"{m['collectives_s']:.3f} | {m['rows']:.0f} | {m['groups']:.0f} | |", flush=True)


# loader options measured side by side (--options): inflater x parser
OPTIONS = {"isal + msgspec typed structs (default)": "", "zlib + msgspec typed structs": "zlib",
           "isal + orjson dicts": "dicts", "zlib + orjson dicts (the previous parsing)": "zlib,dicts",
           "zlib + json dicts (no optional dependency)": "zlib,dicts,json"}


def run_ours(path: Path, options: str = "") -> dict:
    r = subprocess.run([sys.executable, "-c", OURS, str(path), options], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def make_8_ranks(src: Path, dst: Path) -> Path:
    """Copy one real rank 8 times, rewriting distributedInfo.rank to 0..7."""
    dst.mkdir(parents=True, exist_ok=True)
    raw = gzip.decompress(src.read_bytes())
    for r in range(8):
        out = dst / f"rank{r}.json.gz"
        if not out.exists():
            relabelled = re.sub(rb'("distributedInfo"\s*:\s*\{[^}]*"rank"\s*:\s*)\d+', rb"\g<1>%d" % r, raw, count=1)
            out.write_bytes(gzip.compress(relabelled, compresslevel=1))
    return dst


def json_mb(path: Path) -> tuple[float, float]:
    """(total, largest file) uncompressed JSON size in MB."""
    files = [path] if path.is_file() else sorted(path.glob("*.gz"))
    sizes = [len(gzip.decompress(f.read_bytes())) / 1e6 for f in files]
    return sum(sizes), max(sizes)


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hta-python", default="/tmp/hta-venv/bin/python")
    ap.add_argument("--options", action="store_true",
                    help="also compare the loader's inflater/parser options on df_index_resolver")
    ap.add_argument("--analyses", action="store_true", help="only measure load + roofline + collectives per rank")
    ap.add_argument("--src", help="with --analyses: another checkout's src/ folder to measure side by side")
    args = ap.parse_args()
    if args.analyses:
        compare_analyses(args.src, args.repeat)
        return
    single = DATA / "df_index_resolver"
    if args.options:
        compare_options(single, args.repeat)
    eight = make_8_ranks(DATA / "negative_queue_length_values_check/rank0.json.gz",
                         Path(tempfile.gettempdir()) / "trainperf-bench-8rank")
    print("| case | JSON MB (total / per rank) | tool | CPU s | wall s | peak RSS MB main / parse worker | "
          "RSS after imports MB | parse cost (peak - imports) / JSON of one rank |")
    print("|---|---|---|---|---|---|---|---|")
    for name, path in (("df_index_resolver, 1 rank", single), ("8 ranks x negative_queue rank 0", eight)):
        total, per = json_mb(path)
        res = {}
        for tool in ("trainperf", "HTA 0.5.0"):
            runs = [run_ours(path) if tool == "trainperf" else run_hta(path, args.hta_python, mode="load")["load"]
                    for _ in range(args.repeat)]
            m = median_of(runs)
            res[tool] = m
            # one file is parsed in the main process; several in worker processes (one rank each)
            parse_peak = m["main_peak_rss_mb"] if m["worker_peak_rss_mb"] < m["base_rss_mb"] else m["worker_peak_rss_mb"]
            m["ratio"] = (parse_peak - m["base_rss_mb"]) / per
            print(f"| {name} | {total:.1f} / {per:.1f} | {tool} | {m['cpu_s']:.2f} | {m['wall_s']:.2f} | "
                  f"{m['main_peak_rss_mb']:.0f} / {m['worker_peak_rss_mb']:.0f} | {m['base_rss_mb']:.0f} | "
                  f"{m['ratio']:.2f}x |", flush=True)
        o, h = res["trainperf"], res["HTA 0.5.0"]
        print(f"| {name} | | HTA / trainperf | {h['cpu_s'] / o['cpu_s']:.1f}x | {h['wall_s'] / o['wall_s']:.1f}x | "
              f"{h['peak_rss_mb'] / o['peak_rss_mb']:.1f}x (overall peak) | | {h['ratio'] / o['ratio']:.1f}x |",
              flush=True)

def compare_options(path: Path, repeat: int) -> None:
    """Median CPU and peak memory of each loader option on one trace, interleaved run by run."""
    _, per = json_mb(path)
    runs: dict[str, list] = {name: [] for name in OPTIONS}
    for _ in range(repeat):  # interleaved so that machine load hits every option alike
        for name, opts in OPTIONS.items():
            runs[name].append(run_ours(path, opts))
    base = statistics.median(r["cpu_s"] for r in runs[next(iter(OPTIONS))])
    print(f"| loader option ({path.name}, {per:.1f} MB JSON) | CPU s (median of {repeat}) | vs default | "
          "parse cost (peak - imports) / JSON |")
    print("|---|---|---|---|")
    for name, rs in runs.items():
        m = median_of(rs)
        print(f"| {name} | {m['cpu_s']:.3f} | {m['cpu_s'] / base:.2f}x | "
              f"{(m['main_peak_rss_mb'] - m['base_rss_mb']) / per:.2f}x |", flush=True)
    print()


if __name__ == "__main__":
    main()
