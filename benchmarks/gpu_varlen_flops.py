"""Variable-length attention's FLOPs as a trace gives them against PyTorch's own count, on a GPU.

A packed attention call (n sequences in one, their lengths tensor values the profiler does not record) is counted by
`roofline.op_cost` as n sequences of equal length (4 h d T_q T_k / n forward, twice that backward). This checks the
assumptions only a GPU run can: that nested jagged SDPA records `aten::_flash_attention_forward` /
`_flash_attention_backward` with the packed (total, heads, dim) inputs and `cum_seq_q` where the module says, and
that the flash-attn package (where installed) records its varlen ops so. The reference is
`torch.utils.flop_counter.FlopCounterMode` on the same call, which reads the real offsets (its backward counts 2.5x
the forward, the scores' recomputation included; a model's FLOPs, ours, 2x), and, for flash-attn's ops, which it has
no formula for, the FLOPs worked from the true lengths (written beside each). Equal lengths must match; other
lengths read under the reference (a lower bound), at the equal-length count.

    python3 benchmarks/gpu_varlen_flops.py --json OUT   # benchmarks/gpu_check.sh
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from trainperf.diagnose.roofline import roofline  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

HEADS, DIM = 16, 64
DEVICE = "cuda"  # --device cpu: a dry run of the script's own path (CPU's SDPA has no packed kernel to count)
LENGTHS = {"equal": [512] * 8, "unequal": [1900, 1000, 600, 300, 200, 60, 24, 12]}


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _traced_flops(fn) -> dict[str, float]:
    """{operator: FLOPs} of the attention rows diagnose's roofline reads from a profile of fn() (record_shapes)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        fn()
        _sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank0.json"
        prof.export_chrome_trace(str(path))
        (t,) = load_trace(path, workers=1).values()
    out: dict[str, float] = {}
    for r in roofline(t):
        if r.kind == "attention":
            out[r.op] = out.get(r.op, 0.0) + r.total_flops
    return out


def _flop_counter(fn) -> dict[str, float]:
    """{operator: FLOPs} torch.utils.flop_counter counts for fn()."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
        _sync()
    return {str(op): float(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}


def nested_sdpa(lengths: list[int]) -> dict:
    """Nested jagged SDPA forward and backward: the trace's count beside flop_counter's."""
    def make():
        return torch.nested.nested_tensor([torch.randn(n, HEADS, DIM) for n in lengths], layout=torch.jagged,
                                          device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = make(), make(), make()

    def call():
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        if DEVICE == "cuda":  # the CPU's jagged backward fails in torch 2.13 ("operator aten::stride does not exist")
            out.values().float().sum().backward()

    call()  # warm
    out = {"traced": _traced_flops(call), **_true_flops(lengths)}
    try:
        out["flop_counter"] = _flop_counter(call)
    except RuntimeError as e:  # CPU: SDPA's math path on jagged tensors, which FlopCounterMode cannot decompose
        out["flop_counter"] = {"error": str(e)}
    return out


def _true_flops(lengths: list[int]) -> dict[str, float]:
    """The FLOPs worked from the true lengths: 4 h d sum L^2 forward, twice that backward (no causal mask)."""
    forward = 4.0 * HEADS * DIM * sum(n * n for n in lengths)
    return {"true_forward": forward, "true_backward": 2 * forward, "equal_length_forward":
            4.0 * HEADS * DIM * sum(lengths) ** 2 / len(lengths)}


def flash_attn_varlen(lengths: list[int]) -> dict | None:
    """flash-attn's varlen forward and backward, where the package is installed: the trace's count beside the FLOPs
    worked from the true lengths (4 h d sum L^2 forward, twice that backward)."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    total = sum(lengths)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(total, HEADS, DIM, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))

    def call():
        out = flash_attn_varlen_func(q, k, v, offsets, offsets, max(lengths), max(lengths), causal=False)
        out.float().sum().backward()

    call()
    return {"traced": _traced_flops(call), **_true_flops(lengths)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the script itself")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("gpu_varlen_flops: needs a CUDA device")
        return 1
    results = {"torch": torch.__version__,
               "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (a dry run)"}
    for name, lengths in LENGTHS.items():
        for what, fn in (("nested_sdpa", nested_sdpa), ("flash_attn_varlen", flash_attn_varlen)):
            try:
                results[f"{what}/{name}"] = fn(lengths)
            except Exception as e:  # one call's failure (an API this torch lacks) must not hide the others'
                results[f"{what}/{name}"] = {"error": f"{type(e).__name__}: {e}"}
            print(what, name, json.dumps(results[f"{what}/{name}"]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
