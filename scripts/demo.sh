#!/usr/bin/env bash
# `make demo`: run trainperf end to end on embedded defaults (no input needed).
set -euo pipefail
VENV=${1:-.venv}
TP="$VENV/bin/trainperf"
OUT=demo_out
mkdir -p "$OUT"
echo "== plan: llama3-70b on 1024 H100s, 8-GPU nodes, seq 8192, global batch 1024"
"$TP" plan --model llama3-70b --gpu h100 --gpus 1024 --seq 8192 --global-batch 1024 --top 5
