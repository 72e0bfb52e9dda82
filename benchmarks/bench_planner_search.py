"""Search speed with the stack and ep dimensions (issue 11): llama3-405b on 16,384 H100 per stack,
DeepSeek-V3 (671B MoE, MLA) on 2,048 H800 with expert parallelism.

Usage: .venv/bin/python benchmarks/bench_planner_search.py [--repeats 5]
Prints the median wall time of the whole search (enumerate, evaluate, rank) per case.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from trainperf.plan.search import search
from trainperf.plan.stacks import STACKS, get_stack
from trainperf.specs import load_model, make_cluster, model_from_dict

# deepseek-ai/DeepSeek-V3 config.json (the fields the planner reads), seq 4096 as trained
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "vocab_size": 129280, "max_position_embeddings": 4096, "tie_word_embeddings": False}


def timed(fn, repeats: int) -> tuple[float, float, object]:
    fn()  # warm-up
    times, res = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times), res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    m405 = load_model("llama3-405b", 8192)
    c405 = make_cluster("h100", 16384)
    for st in STACKS:
        med, worst, res = timed(lambda: search(m405, c405, 2048, top=10, sw=get_stack(st)), args.repeats)
        print(f"llama3-405b, 16384 x h100, stack {st:22}: median {med * 1e3:6.0f} ms (max {worst * 1e3:.0f}), "
              f"{res.n_candidates:,} layouts, best {res.best[0].layout.to_string()} MFU {res.best[0].mfu:.1%}")
    dsv3 = model_from_dict(DSV3, "deepseek-v3")
    c = make_cluster("h800", 2048)
    med, worst, res = timed(lambda: search(dsv3, c, 4096, top=10), args.repeats)
    print(f"deepseek-v3 671B MoE, 2048 x h800, stack megatron-core: median {med * 1e3:.0f} ms (max {worst * 1e3:.0f}), "
          f"{res.n_candidates:,} layouts ({res.n_fit:,} fit), best {res.best[0].layout.to_string()} "
          f"step {res.best[0].step_time_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
