"""The innermost-span query (trace/nesting.py) beside an older checkout's `annotate.enclosing_span`, on real
traces (issue 10): every CPU operator a span, every runtime call a query (what host.call_sites and the
roofline's launching_op ask). CPU ms by `time.process_time`, median of 5 calls each, and the share of
queries on which both give the same span.

    git archive <commit> src | tar -x -C /tmp/old
    .venv/bin/python benchmarks/bench_nesting.py /tmp/old/src [TRACE ...]
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
HTA = REPO / "../shared/data/traces/hta"
DEFAULT = ("df_index_resolver/df_index_resolver.json.gz",
           "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
           "mtia_trace_single_rank/mtia_rank_0.json.gz", "nccl_parser_config/nccl_data.json.gz")


def main() -> None:
    from trainperf.trace.events import CPU_OP, RUNTIME
    from trainperf.trace.kineto import read_kineto
    from trainperf.trace.nesting import enclosing_span, thread_key

    spec = importlib.util.spec_from_file_location("old_annotate", Path(sys.argv[1]) / "trainperf/trace/annotate.py")
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    print("| trace | ops | queries | before ms | after ms | before/after | same answer |")
    print("|---|---|---|---|---|---|---|")
    for p in sys.argv[2:] or [str(HTA / d) for d in DEFAULT]:
        t = read_kineto(p)
        ops, q = np.flatnonzero(t.kind == CPU_OP), np.flatnonzero(t.kind == RUNTIME)
        key = thread_key(t.pid, t.tid)
        args = (key[ops], t.ts_ns[ops], t.ts_ns[ops] + t.dur_ns[ops], key[q], t.ts_ns[q])
        res = {}
        for name, f in (("before", old.enclosing_span), ("after", enclosing_span)):
            runs = []
            for _ in range(5):
                c0 = time.process_time()
                r = f(*args)
                runs.append(time.process_time() - c0)
            res[name] = (1e3 * statistics.median(runs), r)
        same = 100 * float(np.mean(res["before"][1] == res["after"][1])) if q.size else 100.0
        print(f"| {Path(p).name} | {ops.size:,} | {q.size:,} | {res['before'][0]:.1f} | {res['after'][0]:.1f} | "
              f"{res['before'][0] / res['after'][0]:.2f} | {same:.2f}% |")


if __name__ == "__main__":
    main()
