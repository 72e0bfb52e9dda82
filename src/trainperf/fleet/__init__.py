"""Fleet regressions: change points (changepoints), root causes (localize), the CI gate (gate),
a synthetic fleet with known causes (synth) and scoring against labelled benchmarks (evaluate).

Import the submodules directly (kept out of this package's import so `trainperf --help` stays fast).
"""
