"""Real GPU traces of faults `trainperf diagnose` should name, each beside its measured cost.

Scenarios, each in a subprocess of its own (CUDA_LAUNCH_BLOCKING must be set before CUDA starts):
  async     the training loop as it is: a 12-block MLP (width 2048, 4096 tokens) in bf16, AdamW (foreach);
  blocking  the same loop with CUDA_LAUNCH_BLOCKING=1 (every launch returns after its kernel);
  scalar    the same loop in a one-rank NCCL group with dist.all_reduce(loss) and dist.barrier() every step
            (collectives of one value);
  nocache   the same loop with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc/cudaFree);
  graphed   the same loop captured whole in one CUDA graph (capturable AdamW): the fix of launch-bound steps;
  big       a GPU-bound loop (4 blocks of width 8192, 8192 tokens): a healthy case, nothing to find;
  dataload  the big loop fed by a DataLoader without workers whose batches take 30 ms to make on the
            training thread (the fix: workers that prepare batches ahead; `big` is the fixed loop);
  syncs     the small loop with torch.cuda.synchronize() after every Linear's forward (fixed: async);
  empty_cache  the small loop calling torch.cuda.empty_cache() after every step (fixed: async);
  pageable  the big loop whose input is copied from pageable host memory every step (fixed: pinned, the same
            copy from pinned memory with non_blocking=True);
  fp32      the big loop in fp32 with full-precision fp32 GEMMs (fixed: tf32, the same with TF32 matmuls);
  deep      a deep, narrow loop in fp32 (96 blocks of width 1024, 8192 tokens: ~900 kernels a step, ~10-20 us of
            host work each against ~0.3-ms GEMMs, ~90 ms a step) whose host, never synchronising, gains ~700
            launches a step on the device and fills CUDA's ~1,024-deep launch queue in the profile's wait and
            warm-up steps: its launches wait for queue slots, the window opens behind a full queue
            (replay.queue_waits, queued_before_window) (fixed: deep_tf32);
  strided   the big loop whose Linear weights are [w, w] views of [w, w + 1] parameters: the shapes recorded look
            aligned, the strides recorded ("Input Strides") are not (misaligned_gemm's to find; fixed: big,
            contiguous weights);
  conv      6 blocks of 3x3 convolution (64 channels), batch norm and ReLU over [32, 64, 56, 56] in bf16, NCHW: cuDNN
            converts to NHWC and back around each convolution (fixed: conv_cl, model and input in channels_last);
  unfused   4 Llama-style blocks (width 2048, SwiGLU MLP of 5632, 16384 tokens, bf16) written as Hugging Face's eager
            code: RMSNorm as pow, mean, rsqrt and two multiplies, SiLU and the gate's multiply apart, each its own
            kernel (fixed: fused, the same model after trainperf.kernels.apply: fused RMSNorm and SwiGLU);
  celoss    a language model's loss: 2 MLP blocks (width 2048, 4096 tokens, bf16) and the projection onto a 128,256-entry
            vocabulary (Llama 3's), the logits cast to fp32 and F.cross_entropy as Hugging Face's eager code does
            (unfused_cross_entropy's to find; fixed: celoss_fused, the bf16 logits through
            trainperf.kernels.CrossEntropyLoss);
  breaks    the small loop under torch.compile with its graph broken twice, between its thirds
            (torch._dynamo.graph_break(): graph_breaks' to find; fixed: compiled, the same loop compiled whole);
  shared    the big loop while another process runs bf16 GEMMs on the same GPU without pause (a second job on the
            device): the GPU time-slices between the two contexts, and the loop's work waits for it with nothing in
            its own trace to say why (idle_with_work_queued's to find, or kernels stretched by preemption; fixed:
            big). The one cut when the faults' time limit is reached, but for the gc pair after it;
  gc        the small loop in a process holding 100k Python objects from its start-up, each step keeping 40k more
            for 3 steps: the garbage collector's full collections walk them all every few steps (gc_stall's to
            find, from the "Python GC" spans the Python frames and record_python_gc_info record; fixed: gc_frozen,
            gc.freeze() after the start-up and automatic collection off). Last: cut first.
big, strided, fp32, the conv loops and celoss are profiled with record_shapes=True (SHAPES_RECORDED).
Each: the step time (ms) without the profiler, as the profiled loop runs (steps queued ahead, the median of 5
chunks' mean step; and a synchronize after every step, as a loop that reads its loss each step runs), then a
profile of 4 active steps
(torch.profiler.schedule(wait=1, warmup=1, active=4)) exported to OUT/<scenario>.json.gz. OUT/faults.json holds
the step times and each planted fault's true gain, 1 - fixed / faulty (FIXED_BY), which
`trainperf diagnose OUT/<scenario>.json.gz` should price (docs/benchmarks.md records both).

    python benchmarks/gpu_diagnose_faults.py --out DIR            # on a CUDA machine (~1.5 min)
    python benchmarks/gpu_diagnose_faults.py --out DIR --device cpu --steps 3 --only-scenarios async,dataload
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCENARIOS = {"async": {}, "blocking": {"CUDA_LAUNCH_BLOCKING": "1"}, "scalar": {},
             "nocache": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, "graphed": {}, "big": {}, "dataload": {},
             "syncs": {}, "empty_cache": {}, "pageable": {}, "pinned": {}, "fp32": {}, "tf32": {}, "deep": {},
             "deep_tf32": {}, "strided": {}, "conv": {}, "conv_cl": {}, "unfused": {}, "fused": {}, "celoss": {},
             "celoss_fused": {}, "breaks": {}, "compiled": {}, "shared": {}, "gc": {}, "gc_frozen": {}}
# the scenario each fault's fix turns it into, and the fix: true gain = 1 - fixed / faulty
FIXED_BY = {"blocking": ("async", "unset CUDA_LAUNCH_BLOCKING"),
            "nocache": ("async", "the caching allocator"),
            "async": ("graphed", "CUDA graphs (launch-bound steps)"),
            "dataload": ("big", "DataLoader workers"),
            "syncs": ("async", "no torch.cuda.synchronize() in the loop"),
            "empty_cache": ("async", "no torch.cuda.empty_cache() in the loop"),
            "pageable": ("pinned", "pinned host memory, non_blocking copies"),
            "fp32": ("tf32", "TF32 matmuls"),
            "deep": ("deep_tf32", "TF32 matmuls (a host that fills the launch queue)"),
            "strided": ("big", "contiguous weights"),
            "conv": ("conv_cl", "channels_last"),
            "unfused": ("fused", "fused RMSNorm and SwiGLU kernels (trainperf.kernels.apply)"),
            "celoss": ("celoss_fused", "a fused cross-entropy (trainperf.kernels.CrossEntropyLoss)"),
            "breaks": ("compiled", "no graph breaks (one compiled graph)"),
            "shared": ("big", "no other process on the GPU"),
            "gc": ("gc_frozen", "gc.freeze() after the start-up, automatic collection off")}
BIG = ("big", "dataload", "pageable", "pinned", "fp32", "tf32", "strided", "shared")  # the GPU-bound loop's scenarios
# scenarios profiled with record_shapes=True: the healthy GPU-bound loop, on which the shape-priced findings
# (slow_gemm, misaligned_gemm, memory_bound_unfused) must find no fault, its fault whose shapes look aligned while the
# GEMMs' row strides are not (misaligned_gemm's to find), the fp32 loop (fp32_matmul priced by its shapes: a GPU-bound
# 240-ms step, which the profiler's host cost does not move), and the convolution loops
SHAPES_RECORDED = ("big", "strided", "fp32", "conv", "conv_cl", "celoss")
# scenarios profiled with profile_memory=True (the allocator's "[memory]" samples, diagnose/memory.py): the healthy
# GPU-bound loop, whose step the profiler's host cost does not move; its steps.json records the allocator's own peaks
# over the profiled steps (torch.cuda.max_memory_allocated / max_memory_reserved) for the trace's figures to match
MEMORY_RECORDED = ("big",)
CONV_SHAPE = {"cuda": (32, 64, 56), "cpu": (2, 8, 16)}  # batch, channels, height = width of the convolution loops
SHAPES = {"small": (2048, 12, 4096), "big": (8192, 4, 8192), "deep": (1024, 96, 8192), "llama": (2048, 4, 16384),
          "lm": (2048, 2, 4096), "cpu": (256, 2, 256)}  # width, blocks, tokens
# the gc loops: the small loop in a process holding LIVE Python objects from its start-up, each step keeping KEPT more
# for GC_KEPT_STEPS steps (per-sample bookkeeping): the collector's full collections walk them all, every few steps;
# gc_frozen, the fix: gc.freeze() after the start-up and automatic collection off. Profiled with the Python frames and
# record_python_gc_info (PyTorch 2.9+), which records each collection as a "Python GC" span (diagnose's gc_stall)
GC_LIVE, GC_KEPT, GC_KEPT_STEPS = 100_000, 40_000, 3
VOCABULARY = {"cuda": 128256, "cpu": 512}  # the celoss loops' projection: Llama 3's vocabulary on the GPU
BATCH_MAKING_S = 0.030


def _model(device: str, size: str, capturable: bool = False, fp32: bool = False, strided: bool = False,
           channels_last: bool = False):
    """The MLP the loop trains (bf16 on CUDA unless fp32, fp32 on CPU; strided: its weights unaligned views,
    StridedLinear), or the convolution stack (size "conv"; channels_last: model and input in that memory format), its
    AdamW and its input."""
    import torch
    from torch import nn

    width, n_blocks, tokens = SHAPES[size if device == "cuda" else "cpu"]
    dtype = torch.bfloat16 if device == "cuda" and not fp32 else torch.float32

    class StridedLinear(nn.Module):
        """A Linear whose weight is a [width, width] view of a [width, width + 1] parameter: its rows start
        width + 1 elements apart (2-byte aligned in bf16), so the GEMM library gets an unaligned leading dimension
        while the recorded shapes look aligned (a fused weight sliced without .contiguous())."""

        def __init__(self):
            super().__init__()
            self.storage = nn.Parameter(torch.randn(width, width + 1) * width ** -0.5)
            self.bias = nn.Parameter(torch.zeros(width))

        def forward(self, x):
            return nn.functional.linear(x, self.storage[:, :width], self.bias)

    class LlamaRMSNorm(nn.Module):
        """Hugging Face's eager RMSNorm (modeling_llama), one kernel per operation."""

        def __init__(self):
            super().__init__()
            self.weight, self.variance_epsilon = nn.Parameter(torch.ones(width)), 1e-6

        def forward(self, x):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * h.to(x.dtype)

    class LlamaMLP(nn.Module):
        """Hugging Face's eager SwiGLU MLP: down(silu(gate(x)) * up(x)), SiLU and the multiply apart."""

        def __init__(self):
            super().__init__()
            hidden = 11 * width // 4
            self.gate_proj, self.up_proj = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
            self.down_proj, self.act_fn = nn.Linear(hidden, width, bias=False), nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class LlamaBlock(nn.Module):
        """x + mlp(norm(x)): a decoder layer without its attention."""

        def __init__(self):
            super().__init__()
            self.norm, self.mlp = LlamaRMSNorm(), LlamaMLP()

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    linear = StridedLinear if strided else (lambda: nn.Linear(width, width))
    blocks = [m for _ in range(n_blocks) for m in (linear(), nn.GELU(), nn.LayerNorm(width))]
    if size == "llama":
        blocks = [LlamaBlock() for _ in range(n_blocks)]
    if size == "lm":  # the MLP blocks, then the projection onto the vocabulary: the step's output is the logits
        blocks += [nn.Linear(width, VOCABULARY[device], bias=False)]
    if size == "conv":  # 6 blocks of a 3x3 convolution, batch norm and ReLU over [batch, channels, h, h]
        batch, channels, h = CONV_SHAPE[device]
        blocks = [m for _ in range(6) for m in (nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels),
                                                nn.ReLU())]
        x_shape = (batch, channels, h, h)
    else:
        x_shape = (tokens, width)
    model = nn.Sequential(*blocks).to(device=device, dtype=dtype)
    x = torch.randn(*x_shape, device=device, dtype=dtype)
    if channels_last:  # the fix of the convolutions' layout transposes
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True, capturable=capturable)
    return model, opt, x


def _slow_batches(tokens: int):
    """A DataLoader without workers over an endless dataset whose batches take BATCH_MAKING_S each to make."""
    import torch

    class SlowBatches(torch.utils.data.IterableDataset):
        def __iter__(self):
            while True:
                time.sleep(BATCH_MAKING_S)  # decoding, tokenising, augmenting on the training thread
                yield torch.rand(tokens)  # a weight per token

    return torch.utils.data.DataLoader(SlowBatches(), batch_size=None, num_workers=0)


def _step_fn(name: str, device: str):
    """The scenario's training step, a function of no arguments (warm and ready to time)."""
    import torch
    import torch.distributed as dist

    cuda = device == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = name in ("tf32", "deep_tf32")  # else full-precision fp32 GEMMs
    size = ("deep" if name.startswith("deep") else "conv" if name.startswith("conv") else "big" if name in BIG
            else "llama" if name in ("unfused", "fused") else "lm" if name.startswith("celoss") else "small")
    model, opt, x = _model(device, size, capturable=name == "graphed" and cuda,
                           fp32=name in ("fp32", "tf32", "deep", "deep_tf32"), strided=name == "strided",
                           channels_last=name == "conv_cl")
    if name in ("breaks", "compiled"):  # the small loop compiled, its graph broken twice or whole
        body = model

        def broken(x):
            third = len(body) // 3
            x = body[:third](x)
            torch._dynamo.graph_break()
            x = body[third:2 * third](x)
            torch._dynamo.graph_break()
            return body[2 * third:](x)

        model = torch.compile(broken if name == "breaks" else body)
    if name == "fused":  # the fix of the eager blocks: trainperf's fused RMSNorm and SwiGLU swapped in
        from trainperf.kernels import apply

        apply(model)
    if name.startswith("celoss"):
        from trainperf.kernels import CrossEntropyLoss

        targets = torch.randint(0, VOCABULARY[device], (x.shape[0],), device=device)
        fused_loss = CrossEntropyLoss()
    if name in ("pageable", "pinned"):  # each step's input comes from host memory, pageable or pinned
        host_x = x.cpu().pin_memory() if name == "pinned" and cuda else x.cpu()
    if name.startswith("gc"):
        import gc

        index = [[i] for i in range(GC_LIVE)]
        kept: list = []
        if name == "gc_frozen":
            gc.collect()
            gc.freeze()
            gc.disable()
    if name == "syncs" and cuda:  # a synchronize after every Linear (timing layers, a debugging habit)
        for m in model:
            if isinstance(m, torch.nn.Linear):
                m.register_forward_hook(lambda *_: torch.cuda.synchronize())

    def step(weights=None) -> None:
        opt.zero_grad(set_to_none=True)
        inputs = host_x.to(device, non_blocking=name == "pinned") if name in ("pageable", "pinned") else x
        out = model(inputs if weights is None else inputs * weights[:, None])
        if name == "celoss":  # Hugging Face's eager loss: the logits upcast, then F.cross_entropy
            loss = torch.nn.functional.cross_entropy(out.float(), targets)
        elif name == "celoss_fused":
            loss = fused_loss(out, targets)
        else:
            loss = out.float().square().mean()
        loss.backward()
        opt.step()
        if name == "scalar":
            dist.all_reduce(loss.detach().clone())
            dist.barrier(device_ids=[0]) if cuda else dist.barrier()
        if name == "empty_cache" and cuda:
            torch.cuda.empty_cache()
        if name.startswith("gc"):  # this step's bookkeeping, kept GC_KEPT_STEPS steps beside the start-up's index
            kept.append([[len(index), j] for j in range(GC_KEPT)])
            del kept[:-GC_KEPT_STEPS]

    if name == "scalar":
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method="tcp://127.0.0.1:29517",
                                rank=0, world_size=1)
    if name == "dataload":
        batches = iter(_slow_batches(x.shape[0]))
        return lambda: step(next(batches).to(device=device, dtype=x.dtype))
    if name == "graphed" and cuda:
        # torch.cuda.graphs' whole-network recipe: warm up on a side stream, capture once, replay
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss = model(x).float().square().mean()
            loss.backward()
            opt.step()
        return graph.replay
    return step


# the other process of the `shared` scenario: bf16 GEMMs on the GPU until its parent (the scenario's process) is gone
# or HOG_MAX_S have passed, so that a scenario killed by its time limit leaves no process on the device behind it
HOG_MAX_S = 60
HOG = ("import os, sys, time, torch\n"
       "parent, t0 = os.getppid(), time.time()\n"
       "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
       "print('started', flush=True)\n"
       "while os.getppid() == parent and time.time() - t0 < float(sys.argv[1]):\n"
       "    for _ in range(8):\n"
       "        b = a @ a\n"
       "    torch.cuda.synchronize()\n")


def _other_process_on_the_gpu() -> subprocess.Popen:
    """Start the `shared` scenario's other process (HOG) and return once its GEMMs run."""
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(HOG_MAX_S)], stdout=subprocess.PIPE, text=True)
    hog.stdout.readline()
    return hog


def _scenario(name: str, out: Path, device: str, steps: int) -> None:
    """Run one scenario in this process: time `steps` steps, then profile 6 and export the trace."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    from trainperf.monitor.profiler import gc_events_config

    step = _step_fn(name, device)
    hog = _other_process_on_the_gpu() if name == "shared" and device == "cuda" else None

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(5):  # warm-up: allocator pool, cuBLAS handles, NCCL communicator
        step()
    sync()
    # as the profiled loop runs: the host queues steps ahead of the device, one synchronize per CHUNK steps (the
    # mean step of each chunk); and, as a loop that reads its loss every step runs, a synchronize after each step
    chunk = max(steps // 5, 1)
    times = []
    for _ in range(max(steps // chunk, 1)):
        t0 = time.perf_counter()
        for _ in range(chunk):
            step()
        sync()
        times.append(1e3 * (time.perf_counter() - t0) / chunk)
    synced = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        synced.append(1e3 * (time.perf_counter() - t0))
    raw = out / f"{name}.json"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    gc_events = {"with_stack": True, "experimental_config": gc_events_config(torch.profiler)} \
        if name.startswith("gc") else {}
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=4),
                 record_shapes=name in SHAPES_RECORDED, profile_memory=name in MEMORY_RECORDED, **gc_events,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(6):
            step()
            prof.step()
    sync()
    peaks = {"max_memory_allocated": torch.cuda.max_memory_allocated(),
             "max_memory_reserved": torch.cuda.max_memory_reserved()} if device == "cuda" else {}
    if name in SHAPES_RECORDED:  # PyTorch's own count of one step's matrix products and convolutions: what the
        # trace's recorded shapes must give (diagnose's flops_per_step)
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            step()
        sync()
        peaks["flop_counter_flops_per_step"] = counter.get_total_flops()
    if hog is not None:
        hog.kill()
        hog.wait()
    with open(raw, "rb") as f, gzip.open(out / f"{name}.json.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    raw.unlink()
    (out / f"{name}.steps.json").write_text(json.dumps({"step_ms": times, "synced_step_ms": synced, **peaks}))
    if dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--scenario-timeout-s", type=float, default=90.0)
    ap.add_argument("--only-scenarios", default=",".join(SCENARIOS), help="comma-separated scenarios to run")
    ap.add_argument("--only", default="", help="run this scenario in this process (used by the parent)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only:
        _scenario(args.only, out, args.device, args.steps)
        return
    figures = {}
    for name in args.only_scenarios.split(","):
        env = SCENARIOS[name]
        t0 = time.perf_counter()
        try:
            rc = subprocess.run([sys.executable, __file__, "--out", str(out), "--device", args.device, "--steps",
                                 str(args.steps), "--only", name], env={**os.environ, **env},
                                timeout=args.scenario_timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        steps_file = out / f"{name}.steps.json"
        if rc or not steps_file.exists():
            figures[name] = {"error": f"exit {rc}"}
            continue
        timed = json.loads(steps_file.read_text())
        steps_file.unlink()
        figures[name] = {"median_step_ms": statistics.median(timed["step_ms"]),
                         "median_synced_step_ms": statistics.median(timed["synced_step_ms"]),
                         "steps": len(timed["synced_step_ms"]),
                         "seconds": round(time.perf_counter() - t0, 1),
                         # the allocator's own peaks over the profiled steps (bytes): what the trace's samples of a
                         # MEMORY_RECORDED scenario must read (diagnose's memory_peak_*_bytes); PyTorch's count of a
                         # SHAPES_RECORDED scenario's FLOPs a step (diagnose's flops_per_step)
                         **{k: timed[k] for k in ("max_memory_allocated", "max_memory_reserved",
                                                  "flop_counter_flops_per_step") if k in timed}}
        print(name, figures[name], flush=True)
    for name, (fixed_name, fix) in FIXED_BY.items():
        faulty = figures.get(name, {}).get("median_step_ms")
        fixed = figures.get(fixed_name, {}).get("median_step_ms")
        if fixed and faulty:
            figures[name]["fixed_by"] = fix
            figures[name]["true_gain_pct"] = 100.0 * (1.0 - fixed / faulty)
            synced = [figures[k].get("median_synced_step_ms") for k in (fixed_name, name)]
            figures[name]["true_gain_synced_pct"] = 100.0 * (1.0 - synced[0] / synced[1])
    (out / "faults.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
