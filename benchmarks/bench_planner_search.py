"""Search speed with the stack and ep dimensions (issue 11): llama3-405b on 16,384 H100 per stack,
DeepSeek-V3 (671B MoE, MLA) on 2,048 H800 with expert parallelism.

Usage: .venv/bin/python benchmarks/bench_planner_search.py [--repeats 5] [--exhaustive]

Prints, per case, the median wall time of the whole search (enumerate, evaluate, rank) and its
median CPU time (user + system of this process: what the search costs, whatever else the
machine runs), with the load average before and after. ``--exhaustive`` also times, in the
same run, the exhaustive reference (the time model on every layout, memory included, then
the ranking), which the search must equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from trainperf.plan.search import evaluate_all, search
from trainperf.plan.stacks import STACKS, get_stack
from trainperf.specs import load_model, make_cluster, model_from_dict

# deepseek-ai/DeepSeek-V3 config.json (the fields the planner reads), seq 4096 as trained
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "vocab_size": 129280, "max_position_embeddings": 4096, "tie_word_embeddings": False}


def _cpu_s() -> float:
    return time.process_time()  # user + system CPU seconds of this process


def timed(fn, repeats: int) -> tuple[float, float, float, object]:
    """Return (median wall s, max wall s, median CPU s, last result) of ``repeats`` calls after a warm-up."""
    fn()
    walls, cpus, res = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), _cpu_s()
        res = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu_s() - c0)
    return statistics.median(walls), max(walls), statistics.median(cpus), res


def exhaustive_best(m, cluster, gb, sw):
    """Return the fastest fitting layout of the exhaustive reference (every layout priced, then ranked)."""
    arrays, out = evaluate_all(m, cluster, gb, sw=sw)
    fit = np.flatnonzero(out["memory_bytes"] <= cluster.accelerator.hbm_bytes)
    return arrays.at(int(fit[np.lexsort((out["memory_bytes"][fit], out["step_time_s"][fit]))[0]]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exhaustive", action="store_true", help="also time the exhaustive reference")
    args = ap.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    m405 = load_model("llama3-405b", 8192)
    cases = [(f"llama3-405b, 16384 x h100, stack {st}", m405, make_cluster("h100", 16384), 2048, get_stack(st))
             for st in STACKS]
    cases.append(("deepseek-v3 671B MoE, 2048 x h800, stack megatron-core", model_from_dict(DSV3, "deepseek-v3"),
                  make_cluster("h800", 2048), 4096, get_stack("megatron-core")))
    for name, m, c, gb, sw in cases:
        med, worst, cpu, res = timed(lambda: search(m, c, gb, top=10, sw=sw), args.repeats)
        best = res.best[0]
        print(f"{name:50}: median {med * 1e3:5.0f} ms wall (max {worst * 1e3:.0f}), {cpu * 1e3:4.0f} ms CPU; "
              f"{res.n_candidates:,} layouts ({res.n_fit:,} fit), best {best.layout.to_string()} "
              f"step {best.step_time_s:.2f} s MFU {best.mfu:.1%}")
        if args.exhaustive:
            med_x, _, cpu_x, ref = timed(lambda: exhaustive_best(m, c, gb, sw), args.repeats)
            same = ref == best.layout
            print(f"{'  exhaustive reference':50}: median {med_x * 1e3:5.0f} ms wall, {cpu_x * 1e3:4.0f} ms CPU; "
                  f"same best layout: {same}")
            if not same:
                return 1
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
