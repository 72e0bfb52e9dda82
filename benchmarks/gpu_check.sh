#!/usr/bin/env bash
# Every GPU measurement of trainperf in one script, under 8 minutes on one H200 (the limits below add to 480 s;
# on 2026-12-04: 236 s with 4 fault scenarios; the 13 of today took 188 s alone, so ~6.5 minutes in all; the 2
# deep-loop scenarios added since, ~15 s each, are paid for by the kernels' budget, 90 -> 70 s; the strided-weights
# fault and the convolution loops (strided, conv, conv_cl; big now profiled with its shapes) by 25 s more of it:
# 70 -> 45 s, the faults' limit 230 -> 270 s; the eager and fused Llama-style blocks, unfused and fused, by 25 s
# more: the kernels' budget 45 -> 20 s, whose figures earlier sessions recorded, the faults' limit 270 -> 295 s; the
# language-model loss, eager and fused, celoss and celoss_fused, by 30 s more: the faults' limit 295 -> 325 s, the
# kernels' 35 -> 25 s (budget 20 -> 12), roofline_vs_bench's 40 -> 30 s, train's 70 -> 60 s; DDP's own per-step work,
# ddp, 20 s: the faults' limit 325 -> 315 s, calibrate's 40 -> 35 s, roofline_vs_bench's 30 -> 25 s; the gc pair,
# ~20 s on CPU, run last inside the faults' limit: the first cut when it is reached; variable-length attention's FLOPs,
# varlen, 20 s: the faults' limit 315 -> 295 s, its last scenarios cut first).
# Run on the device machine from the repository root; results go under $OUT (default ./gpu_out).
#   - faults:    real traces of planted faults (CUDA_LAUNCH_BLOCKING, no caching allocator, empty_cache, synchronize
#                calls, pageable input, fp32 GEMMs, a slow DataLoader, graph breaks, Python's garbage collector...)
#                beside each fix's measured gain
#                (issue 9; the graph-break pair and then `shared`, the big loop beside another process's GEMMs on the
#                same GPU, run last: cut first when the limit is reached)
#   - calibrate: GEMM TFLOP/s over shapes, device copy bandwidth (planner calibration profile)
#   - kernels:   fused Triton kernels vs eager / torch.compile / Liger, GB/s and % of roofline
#   - train:     ~1B Llama-style model, ~30 steps, bf16 + compile: tokens/s, MFU, memory
#   - roofline_vs_bench: diagnose's per-operator roofline vs `bench kernels` on the same eager calls
#   - ddp:       DDP's buffer broadcast and gradient copies on one GPU, each fix's measured gain beside diagnose's
#   - varlen:    packed (variable-length) attention's FLOPs as the trace gives them against flop_counter's and the
#                true lengths' (nested jagged SDPA; flash-attn's varlen ops where installed)
# The device tool returns at most 8 files from $OUT: every result is written under a raw folder and packed
# into $OUT/gpu_results.tar.gz after each measurement (so a run cut short still returns what finished).
# The GPU machine has torch/Triton/typer/rich/pyarrow/scipy but no package registry: wheels
# that are missing there (duckdb, liger-kernel) travel in .whl/ (see docs/benchmarks.md).
set -uo pipefail
OUT=${OUT:-gpu_out}
RAW=${RAW:-/tmp/gpu_raw}
mkdir -p "$OUT" "$RAW"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{
  date -u; hostname; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  # the catalog entry the trainer, bench and diagnose take for this device (name, SMs and memory)
  python3 -c "import torch; from trainperf.hardware import accelerator_for_torch_device as a; p = torch.cuda.get_device_properties(0); e = a(0); print('device', p.name, p.multi_processor_count, 'SMs', p.total_memory, 'B -> catalog', e.name if e else None)"
} 2>&1 | tee "$RAW/env.txt"

pack() { tar -czf "$OUT/gpu_results.tar.gz.part" -C "$RAW" . && mv "$OUT/gpu_results.tar.gz.part" "$OUT/gpu_results.tar.gz"; }
run() {  # run NAME TIMEOUT_S CMD...: one measurement, its log kept even when it fails
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s) $(date -u +%T)"
  timeout "$limit" "$@" 2>&1 | tee "$RAW/$name.log"
  echo "== $name exit ${PIPESTATUS[0]} $(date -u +%T)"
  pack
}
run faults    295 python3 benchmarks/gpu_diagnose_faults.py --out "$RAW/faults" --scenario-timeout-s 35
run calibrate 35  python3 -m trainperf.cli calibrate --device cuda --out "$RAW/calibration.json"
run kernels   25  python3 benchmarks/gpu_kernels.py --out "$RAW/kernels" --budget-s 12
run train     60  python3 benchmarks/gpu_train.py --out "$RAW/train" --run-dir "$RAW/train/run" --steps 20
run roofline_vs_bench 25 python3 benchmarks/roofline_vs_bench.py --device cuda --json "$RAW/roofline_vs_bench.json"
run ddp       20  python3 -m torch.distributed.run --nproc-per-node 1 benchmarks/bench_ddp_own_work.py "$RAW/ddp" \
  --device cuda --steps 30 --rounds 5 --width 32 --image 16 --batch 16
run varlen    20  python3 benchmarks/gpu_varlen_flops.py --json "$RAW/varlen_flops.json"
cp "$RAW/faults/faults.json" "$OUT/" 2>/dev/null
ls -laR "$RAW" | head -60
