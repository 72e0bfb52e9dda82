#!/usr/bin/env bash
# Every GPU measurement of trainperf in one script, under 9 minutes on one H200 (the limits below add to 520 s).
# Run on the device machine from the repository root; results go under $OUT (default ./gpu_out).
#   - calibrate: GEMM TFLOP/s over shapes, device copy bandwidth (planner calibration profile)
#   - kernels:   fused Triton kernels vs eager / torch.compile / Liger, GB/s and % of roofline
#   - train:     ~1B Llama-style model, ~30 steps, bf16 + compile: tokens/s, MFU, memory
#   - roofline_vs_bench: diagnose's per-operator roofline vs `bench kernels` on the same eager calls
# The GPU machine has torch/Triton/typer/rich/pyarrow/scipy but no package registry: wheels
# that are missing there (duckdb, liger-kernel) travel in .whl/ (see docs/benchmarks.md).
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
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
} 2>&1 | tee "$OUT/env.txt"

run() {  # run NAME TIMEOUT_S CMD...: one measurement, its log kept even when it fails
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "== $name exit ${PIPESTATUS[0]}"
}
run calibrate 60  python3 -m trainperf.cli calibrate --device cuda --out "$OUT/calibration.json"
run kernels   200 python3 benchmarks/gpu_kernels.py --out "$OUT"
run train     200 python3 benchmarks/gpu_train.py --out "$OUT"
run roofline_vs_bench 60 python3 benchmarks/roofline_vs_bench.py --device cuda --json "$OUT/roofline_vs_bench.json"
ls -la "$OUT"
