#!/usr/bin/env bash
# `make demo`: run trainperf end to end on embedded defaults (no input needed), every verb:
# plan a layout, train the tiny reference model with the monitor and the profiler, diagnose the
# traces it wrote, train it again with a known fault and compare / diff the two runs, benchmark the
# fused kernels, then watch the runs in the store and gate a change.
set -euo pipefail
VENV=${1:-.venv}
TP="$VENV/bin/trainperf"
OUT=demo
rm -rf "$OUT"; mkdir -p "$OUT"
export TRAINPERF_STORE="$OUT/store"
EX=src/trainperf/fleet/examples
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "plan: llama3-70b on 1024 H100s, seq 8192, global batch 1024 (top 5 layouts)"
"$TP" plan --model llama3-70b --gpu h100 --gpus 1024 --seq-len 8192 --global-batch 1024 --top 5 --html "$OUT/plan.html"
step "plan: the same job on four accelerators, cost to train 15T tokens"
"$TP" plan --model llama3-70b --gpus 1024 --seq-len 8192 --global-batch 1024 --compare-hardware h100,h200,b200,mi300x \
  --tokens 15T --html "$OUT/plan_hardware.html"

step "train: warm-up (3 steps, thrown away) so that the measured run below starts on a warm CPU"
# The first run after set-up measured 52.6 ms/step where the next one measured 14.7 ms, and the CPU
# peak varied from 84 to 200 GFLOP/s between runs (issue 14): a first run is warm-up, thrown away.
WARM=$(mktemp -d)
"$TP" train --model tiny --steps 3 --out "$WARM/run" --store "$WARM/store" >/dev/null 2>&1 \
  || echo "warm-up run failed (the measured run below shows why)"
rm -rf "$WARM"
step "train: tiny Llama on the shipped public-domain text, 30 steps, profiler on steps 10-12"
"$TP" train --model tiny --steps 30 --profile-steps 10:12 --out "$OUT/train"

step "diagnose: the traces the training run just wrote"
"$TP" diagnose "$OUT/train/traces" --html "$OUT/diagnose_train.html" --json-out "$OUT/diagnose_train.json"
step "diagnose: a real 2-rank GPU job (HTA's test traces, MIT, shipped in scripts/demo_data)"
"$TP" diagnose scripts/demo_data/hta_trace_filter --top 5 --html "$OUT/diagnose_gpu.html" --json-out "$OUT/diagnose_gpu.json"
step "evaluate: are the findings right? scored on the committed labeled cases (faults injected into HTA's traces)"
"$TP" evaluate tests/corpus/data --html "$OUT/evaluate.html" --json-out "$OUT/evaluate.json"

step "train again: the same run with a 20 ms data-loader stall per batch from step 16 on (a fault of known size)"
"$TP" train --model tiny --steps 30 --profile-steps 20:22 --fault slow-data=20 --fault-steps 16:30 --out "$OUT/train_slow"
step "compare: is the second run slower (with an interval), and does it still train the same model?"
"$TP" compare "$OUT/train" "$OUT/train_slow" --html "$OUT/compare.html"
step "diff: what changed per step between the two runs' traces"
"$TP" diff "$OUT/train/traces" "$OUT/train_slow/traces" --html "$OUT/diff.html"

step "bench: fused Triton kernels vs eager on tiny CPU shapes (interpreter: proves the path, not speed)"
"$TP" bench kernels --device cpu --kernels rms_norm,swiglu,cross_entropy --html "$OUT/bench_kernels.html"

step "runs: what the store holds now"
"$TP" runs list

step "fleet: change points in a step-time series"
"$TP" fleet changes --csv "$EX/step_times.csv" --column step_time_s --html "$OUT/changes.html"
step "fleet: which hosts / versions / configs explain the regression"
"$TP" fleet localize --csv "$EX/fleet_runs.csv" --time-col period --measure step_time_s --at 30
step "gate: a candidate against its baseline (exit 1 = regression)"
"$TP" gate --baseline "$EX/baseline_step_times.txt" --candidate "$EX/candidate_step_times.txt" \
  || echo "gate exit $? (1 = regression, as expected for this example)"

# ---- fleet tree (issue 12): a store of 8 runs with faults of known size; each lands on its factor ----
step "fleet tree: where 8 runs' GPU-hours went (a slow host, a checkpoint stall, a data-loader stall, a restart)"
"$VENV/bin/python" -c "import sys; from trainperf.fleet.tree_synth import TreeFleet; from trainperf.store import write_run
for r in TreeFleet().records(): write_run(r, sys.argv[1])" "$OUT/tree_store"
"$TP" fleet tree --store "$OUT/tree_store" --explain --html "$OUT/fleet_tree.html"
step "fleet tree: where the checkpoint stalls and the data wait sit"
# the explain sentence from its start (at 80 columns it wraps over several lines)
"$TP" fleet tree --store "$OUT/tree_store" --factor checkpoint | sed -n '/^explain:/,$p'
"$TP" fleet tree --store "$OUT/tree_store" --factor data_wait | sed -n '/^explain:/,$p'

step "done: every report is linked from $OUT/index.html (open it in a browser; it works offline)"
"$VENV/bin/python" -m trainperf.report.index "$OUT"
