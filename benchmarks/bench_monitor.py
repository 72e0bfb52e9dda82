"""Overhead of trainperf.monitor on a real training step: an interleaved A/B with confidence intervals.

Arms, all on one model and optimizer in one process, each running the same training step
(forward, backward, AdamW, ``loss.item()``):

* ``bare``: the loop without the monitor;
* ``monitor``: the same loop inside ``mon.step()`` with a ``data()`` block, three
  ``phase()`` blocks and the loss handed to the monitor, writing metrics.jsonl to disk;
* ``baseline`` (with ``--baseline-rev REV``): the same with the monitor package as committed
  at git revision REV (read with ``git show``, imported from a temporary folder), so an
  optimisation is measured before/after in one run, on the same machine state.

Each round runs every arm for ``--block`` consecutive steps, in a random order (a machine
hiccup or a warm cache hits the arms alike; the block keeps each arm's after-effects, such
as cache pollution, mostly inside its own block). Per arm and round, the block's mean step
time; overhead = arm / bare - 1 over rounds, two estimators with 95% bootstrap confidence
intervals (resampling rounds):

* ``paired median``: the median over rounds of the per-round ratio (robust to noise spikes);
* ``total``: total time of the arm / total time of bare (every cost amortised, including the
  monitor's batched writes; sensitive to noise spikes from other jobs on a shared machine).

``--breakdown`` then times the monitor's own calls inside the real loop (perf_counter at
the block boundaries, cold caches included): what the monitor costs per step with no A/B
noise, as a fraction of the bare step.

    python benchmarks/bench_monitor.py [--rounds 300 --block 8 --baseline-rev HEAD --breakdown]
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_baseline_monitor(rev: str):
    """Return the Monitor class of trainperf.monitor as committed at git revision ``rev``."""
    tmp = Path(tempfile.mkdtemp(prefix="monitor_baseline_"))
    pkg = tmp / "tp_monitor_baseline"
    pkg.mkdir()
    for name in ("monitor.py", "memory.py", "goodput.py", "metadata.py"):
        src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:src/trainperf/monitor/{name}"],
                             capture_output=True, text=True, check=True).stdout
        (pkg / name).write_text(src.replace("trainperf.monitor.", "tp_monitor_baseline."))
    (pkg / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp))
    return importlib.import_module("tp_monitor_baseline.monitor").Monitor


def bootstrap_ci(rounds: list[tuple[float, float]], stat, n_boot: int, seed: int = 0) -> tuple[float, float]:
    """Return the 2.5 and 97.5 percentiles of ``stat`` over rounds resampled with replacement."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arr = np.asarray(rounds)
    idx = rng.integers(0, len(arr), size=(n_boot, len(arr)))
    vals = np.array([stat(arr[i]) for i in idx])
    return float(np.percentile(vals, 2.5)), float(np.percentile(vals, 97.5))


def paired_median(a) -> float:
    """Median over rounds of arm / bare - 1; ``a`` rows are (bare, arm) block means."""
    import numpy as np

    return float(np.median(a[:, 1] / a[:, 0]) - 1.0)


def total_ratio(a) -> float:
    """Total arm time / total bare time - 1; ``a`` rows are (bare, arm) block means."""
    return float(a[:, 1].sum() / a[:, 0].sum() - 1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch", type=int, default=1, help="sequences per step")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--block", type=int, default=8, help="consecutive steps per arm per round")
    ap.add_argument("--baseline-rev", default=None, help="also measure the monitor as committed at this git rev")
    ap.add_argument("--breakdown", action="store_true", help="time the monitor's own calls inside the loop")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    args = ap.parse_args(argv)

    import torch

    from trainperf.monitor import Monitor
    from trainperf.specs import load_model
    from trainperf.train.model import build_model

    torch.manual_seed(0)
    spec = load_model(args.model)
    model = build_model(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randint(0, spec.vocab, (args.batch, spec.seq_len))
    y = torch.randint(0, spec.vocab, (args.batch, spec.seq_len))
    tokens = args.batch * spec.seq_len
    batches = [(x, y)]

    def bare_step():
        xb, yb = batches[0]
        loss = model(xb, yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    def make_monitored(mon):
        n = [0]

        def monitored_step():
            n[0] += 1
            with mon.step(n[0], tokens=tokens) as st:
                with st.data():
                    xb, yb = batches[0]
                with st.phase("forward"):
                    loss = model(xb, yb)
                with st.phase("backward"):
                    loss.backward()
                with st.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                st.loss = loss  # read (.item()) by the monitor at the end of the step

        return monitored_step

    load0 = os.getloadavg()
    t_begin = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        monitors = {"monitor": Monitor(Path(tmp) / "new", model=spec, peak_flops=1e12, start_time=time.time())}
        if args.baseline_rev:
            Baseline = load_baseline_monitor(args.baseline_rev)
            monitors["baseline"] = Baseline(Path(tmp) / "old", model=spec, peak_flops=1e12, start_time=time.time())
        arms = {"bare": bare_step, **{k: make_monitored(m) for k, m in monitors.items()}}
        for _ in range(10):  # warm-up every path
            for fn in arms.values():
                fn()
        times: dict[str, list[list[float]]] = {k: [] for k in arms}
        order = random.Random(0)
        pc = time.perf_counter
        for _ in range(args.rounds):
            names = list(arms)
            order.shuffle(names)
            for name in names:
                fn, block = arms[name], []
                for _ in range(args.block):
                    t = pc()
                    fn()
                    block.append(pc() - t)
                times[name].append(block)

        breakdowns = {}
        if args.breakdown:  # each monitor in turn, in blocks, so that both see the same machine
            n_bd = max(args.rounds, 200)
            for _ in range(4):
                for name, mon in monitors.items():
                    part = measure_breakdown(mon, model, opt, batches, tokens, n=n_bd // 4)
                    for k, v in part.items():
                        breakdowns.setdefault(name, {}).setdefault(k, []).extend(v)
        lines_written = {k: sum(1 for _ in open(Path(tmp) / d / "metrics.jsonl"))
                         for k, d in (("monitor", "new"), ("baseline", "old")) if k in monitors}
        for m in monitors.values():
            m.close()
    load1 = os.getloadavg()

    bare_all = [t for b in times["bare"] for t in b]
    mb = statistics.median(bare_all)
    print(f"{t_begin}; model {spec.name}, {tokens} tokens/step; {args.rounds} rounds x {args.block} steps per arm; "
          f"load {load0[0]:.2f} -> {load1[0]:.2f}")
    print(f"{'arm':9s} {'median step':>12s} {'mean step':>10s}   overhead: paired median [95% CI]      "
          f"total [95% CI]             per-round ratio IQR")
    for name in arms:
        flat = [t for b in times[name] for t in b]
        row = f"{name:9s} {statistics.median(flat) * 1e3:9.3f} ms {statistics.fmean(flat) * 1e3:7.3f} ms"
        if name != "bare":
            pairs = [(statistics.fmean(b0), statistics.fmean(b1)) for b0, b1 in zip(times["bare"], times[name])]
            import numpy as np

            arr = np.asarray(pairs)
            pm, (pl, ph) = paired_median(arr), bootstrap_ci(pairs, paired_median, args.boot)
            tr, (tl, th) = total_ratio(arr), bootstrap_ci(pairs, total_ratio, args.boot)
            q1, q3 = np.percentile(arr[:, 1] / arr[:, 0] - 1, [25, 75])
            row += (f"   {pm * 100:+6.2f}% [{pl * 100:+.2f}, {ph * 100:+.2f}]   {tr * 100:+6.2f}% "
                    f"[{tl * 100:+.2f}, {th * 100:+.2f}]   [{q1 * 100:+.2f}, {q3 * 100:+.2f}]%")
        print(row)
    for k, n in lines_written.items():
        print(f"{k}: {n} metrics lines written")
    for name, breakdown in breakdowns.items():
        print(f"{name}: its own calls inside the loop (us per step; median / mean):")
        for k, v in breakdown.items():
            print(f"  {k:38s} {statistics.median(v) * 1e6:7.1f} / {statistics.fmean(v) * 1e6:7.1f}")
        total = [sum(vals) for vals in zip(*breakdown.values())]
        print(f"  {'total':38s} {statistics.median(total) * 1e6:7.1f} / {statistics.fmean(total) * 1e6:7.1f}"
              f"  = {statistics.fmean(total) / mb * 100:.2f}% of the bare step (mean)")
    return 0


def _time_block(work, open_block, *args):
    """Run ``work()`` inside ``with open_block(*args):``; return (seconds of the block's own
    creation, enter and exit, read just outside and just inside the ``with``; work's result)."""
    pc = time.perf_counter
    a = pc()
    with open_block(*args):
        b = pc()
        result = work()
        c = pc()
    d = pc()
    return (b - a) + (d - c), result


def measure_breakdown(mon, model, opt, batches, tokens, n: int) -> dict[str, list[float]]:
    """Time each monitor call of ``n`` real training steps (seconds per step, by call).

    perf_counter is read just outside and just inside every ``with`` of the monitor: the
    difference is the monitor's enter (or exit) work, in place, right after real compute.
    """
    pc = time.perf_counter
    out: dict[str, list[float]] = {k: [] for k in ("step enter (reset peak)", "step exit (sync, peak, record, flush)",
                                                   "data + 3 phase blocks")}
    step0 = len(mon.records) + 1
    for i in range(n):
        t0 = pc()
        with mon.step(step0 + i, tokens=tokens) as st:
            t1 = pc()
            t_data, (xb, yb) = _time_block(lambda: batches[0], st.data)
            t_fwd, loss = _time_block(lambda: model(xb, yb), st.phase, "forward")
            t_bwd, _ = _time_block(loss.backward, st.phase, "backward")
            t_opt, _ = _time_block(lambda: (opt.step(), opt.zero_grad(set_to_none=True)), st.phase, "optimizer")
            blocks = t_data + t_fwd + t_bwd + t_opt
            st.loss = loss
            t2 = pc()
        t3 = pc()
        # The exit includes loss.item(), which the bare loop pays as well: subtract a second
        # (warm, so cheaper) read of it; the figure errs on the monitor's side.
        t = pc()
        loss.item()
        item = pc() - t
        out["step enter (reset peak)"].append(t1 - t0)
        out["step exit (sync, peak, record, flush)"].append(max(t3 - t2 - item, 0.0))
        out["data + 3 phase blocks"].append(blocks)
    return out


if __name__ == "__main__":
    sys.exit(main())
