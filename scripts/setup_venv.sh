#!/usr/bin/env bash
# Create the virtual environment and install trainperf with its test extras.
# Torch: a torch already installed in the base interpreter (a GPU machine's own build) is
# reused through --system-site-packages; where none is present, the CPU wheel is installed
# first so that an unpinned `torch` never pulls a multi-GB CUDA build.
set -euo pipefail
VENV=${1:-.venv}
PY=${PY:-python3}
if "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: reusing the base interpreter's torch ($("$PY" -c 'import torch; print(torch.__version__)'))"
  "$PY" -m venv --system-site-packages "$VENV"
else
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no torch found, installing the CPU wheel"
  "$VPY" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
    || "$VPY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi
"$VPY" -m pip install -q -e ".[test,bench]"
# Liger Kernel is the comparison point of the kernel tests and benchmarks; its pinned deps
# would replace torch, so it goes in without them (best effort: its tests skip when absent).
"$VPY" -m pip install -q --no-deps "liger-kernel==0.8.5" >/dev/null 2>&1 || echo "setup: liger-kernel not installed (its comparisons will be skipped)"
echo "setup: $("$VPY" -c 'import torch, trainperf; print("torch", torch.__version__, "| trainperf", trainperf.__version__)')"
# The report test opens every HTML report in headless Chromium; CI installs it (.ci/services.sh).
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || echo "setup: chromium not found: tests/report/test_report_browser.py will be skipped (apt-get install chromium)"
