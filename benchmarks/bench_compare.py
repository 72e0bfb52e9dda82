"""Does `trainperf compare` call equivalent changes equivalent and broken ones diverging, every time?

Real runs of the reference trainer (tiny model, fp32, CPU, one process), 5 seeds each:

- A, the baseline: micro batch 1 with 2 accumulation steps;
- equivalent changes: ``ga-order`` (micro batch 2, one step: the same samples summed in
  another order) and, with ``--kernels``, trainperf's fused Triton kernels (interpreter on CPU);
- broken changes: ``eps`` (every RMSNorm with epsilon 0.1: --fault norm-eps=0.1), ``lr10``
  (learning rate 10x), ``no-ga-scale`` (--fault no-ga-scale).

Each B is compared with the A of its seed (one run a side: the batch-noise band), then all
seeds at once (the seed-to-seed band). A/A: every pair of baseline runs of different seeds
compared for speed (same configuration, so any "faster"/"slower" is a false alarm).

    .venv/bin/python benchmarks/bench_compare.py --seeds 5 --steps 40 --out /tmp/bench_compare

Runs on two different hosts (A/A and power, issue 13): simulated fleets, and the recorded speed
blocks below dealt to simulated hosts: ``--hosts TRIALS --out /tmp/t13h/speed``.

What compare pays to read the store for its between-run and hosts' terms (``compare.history.between_floor``):
``--floor-cost REPEAT --out DIR`` builds a Parquet store of 6 hosts x 2 configurations x 4 runs of 200
steps in DIR/floor_store and times ``between_floor`` for one run a side on two of its hosts (median of
REPEAT calls, with the store reads it made).

Speed verdicts on recorded pairs (the held-out test of the between-run term, docs/compare.md):
``--speed-blocks N`` records N blocks of four runs (A, A2, B-small, B-big, shuffled) into run
folders and a run store; ``--speed-eval`` then calls every A/A and A/B pair with the interval
before the between-run term, with the default term and with the store's earlier history:

    .venv/bin/python benchmarks/bench_compare.py --speed-blocks 12 --steps 50 --out /tmp/t13h/speed
    .venv/bin/python benchmarks/bench_compare.py --speed-eval --out /tmp/t13h/speed

On a GPU (the issue's H200 goal: bf16, fused kernels vs eager, equivalent within the seed band,
the speed-up with its interval), e.g.:

    echo '{"n_layers": 12, "hidden": 1024, "n_heads": 16, "n_kv_heads": 4, "ffn_hidden": 2816,
           "vocab": 256, "seq_len": 1024, "tied_embeddings": true}' > /tmp/byte1024.json
    python benchmarks/bench_compare.py --model /tmp/byte1024.json --precision bf16 --device cuda \
        --cases A,kernels --kernels --kernel-seeds 3 --seeds 3 --steps 200 --out /tmp/gpu_compare

(byte tokens, vocab 256: the shipped text trains it; a 128k-vocabulary preset would need
random tokens, on which no loss curve falls.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import numpy as np

CASES = {
    "A": {},
    "ga-order": {"layout": "mbs=2,ga=1"},
    "eps": {"faults": ["norm-eps=0.1"]},
    "lr10": {"lr": 3e-2},
    "no-ga-scale": {"faults": ["no-ga-scale"]},
}
EXPECTED = {"ga-order": "equivalent", "kernels": "equivalent", "eps": "diverges", "lr10": "diverges",
            "no-ga-scale": "diverges"}


def run_case(out: Path, case: str, seed: int, args, overrides: dict) -> Path:
    """Train one run (skipped when its summary exists); return its folder."""
    from trainperf.train.trainer import TrainConfig, train

    folder = out / f"{case}-s{seed}"
    if (folder / "summary.json").is_file():
        return folder
    precision = f",precision={args.precision}" if args.precision else ""
    kw = dict(model=args.model, seq_len=args.seq_len, steps=args.steps, out=str(folder), progress=False,
              record=False, peak_tflops=1.0 if args.device == "cpu" else None, device=args.device, resume=False,
              seed=seed, layout="mbs=1,ga=2" + precision, eval_every=max(args.steps // 4, 1), eval_batches=2)
    kw.update(overrides)
    if "layout" in overrides:
        kw["layout"] = overrides["layout"] + precision
    train(TrainConfig(**kw))
    return folder


SPEED_CASES = {"A": {}, "A2": {}, "B-small": {"faults": ["slow-rank=0:40"]}, "B-big": {"faults": ["slow-rank=0:200"]}}


def record_speed_blocks(out: Path, blocks: int, args) -> None:
    """Record ``blocks`` blocks of four runs (A, A2: the same configuration; B-small, B-big: 40 and
    200 ms of extra matrix products a step, ``--fault slow-rank=0:MS``) in a shuffled order within
    each block, into run folders ``out/bBB-CASE`` and the run store ``out/store`` (job "speed"), so
    that each block's pairs are run minutes apart as a user runs a baseline and a candidate."""
    import random

    from trainperf.train.trainer import TrainConfig, train

    order = random.Random(0)
    for blk in range(blocks):
        cases = list(SPEED_CASES)
        order.shuffle(cases)
        for case in cases:
            folder = out / f"b{blk:02d}-{case}"
            if (folder / "summary.json").is_file():
                continue
            train(TrainConfig(model=args.model, steps=args.steps, out=str(folder), progress=False, record=True,
                              store=str(out / "store"), job="speed", peak_tflops=1.0, device=args.device,
                              resume=False, seed=blk, layout="mbs=1,ga=2", **SPEED_CASES[case]))
            print(f"block {blk} {case} done {time.strftime('%H:%M:%S')}", flush=True)


def speed_eval(out: Path) -> dict:
    """Return the speed verdicts on the recorded blocks (``record_speed_blocks``), per method:
    ``before`` (the steps' noise only), ``default`` (the stated default between-run term raised to the
    runs' drift, no history) and ``history`` (the store's runs of the earlier blocks only, as a user's
    store holds the past), each on A/A pairs (A vs A2 of a block; and every pair of baseline runs) and
    on A vs B-small / B-big (slower by 40 / 200 ms of extra work a step)."""
    import itertools

    from trainperf.compare.history import history_between
    from trainperf.compare.interval import DEFAULT_BETWEEN
    from trainperf.compare.perf import compare_perf, run_between
    from trainperf.compare.runs import load_run

    import trainperf.compare.perf as perf

    cut, memo = perf._steady, {}
    # each run's steady and settled cuts (change points: ~1 s a run here) once, not once per pair
    def cached(st):
        key = np.asarray(st, dtype=float).tobytes()
        if key not in memo:
            memo[key] = cut(st)
        return memo[key]

    perf._steady = cached
    blocks = sorted({int(p.name[1:3]) for p in out.glob("b[0-9][0-9]-*") if (p / "summary.json").is_file()})
    runs = {(b, c): load_run(str(out / f"b{b:02d}-{c}")) for b in blocks for c in SPEED_CASES
            if (out / f"b{b:02d}-{c}" / "summary.json").is_file()}
    store = str(out / "store")

    def later_ids(b):
        return {r.run_id for (bb, _), r in runs.items() if bb >= b}

    floors = {}

    def floor(method, b, x, y):
        if method == "default":
            return run_between(x, y, DEFAULT_BETWEEN)
        if b not in floors:
            floors[b] = history_between({x.host}, later_ids(b), store) or DEFAULT_BETWEEN
        return run_between(x, y, floors[b])

    def verdict(method, b, x, y):
        if method == "before":
            return compare_perf([x], [y], between=None)  # the steps' noise only
        return compare_perf([x], [y], between=floor(method, b, x, y))

    pairs = {"A/A (A vs A2, same block)": [(b, runs[(b, "A")], runs[(b, "A2")]) for b in blocks
                                           if (b, "A") in runs and (b, "A2") in runs],
             "A/A (every pair of baseline runs)": [
                 (max(p[0], q[0]), runs[p], runs[q]) for p, q in itertools.combinations(
                     [k for k in runs if k[1] in ("A", "A2")], 2)],
             "B-small (+40 ms/step)": [(b, runs[(b, "A")], runs[(b, "B-small")]) for b in blocks
                                       if (b, "A") in runs and (b, "B-small") in runs],
             "B-big (+200 ms/step)": [(b, runs[(b, "A")], runs[(b, "B-big")]) for b in blocks
                                      if (b, "A") in runs and (b, "B-big") in runs]}
    res = {}
    for name, ps in pairs.items():
        res[name] = {}
        for method in ("before", "default", "history"):
            vs = [verdict(method, b, x, y) for b, x, y in ps]
            res[name][method] = {
                "n": len(vs), "called": sum(v.verdict != "inside the noise" for v in vs),
                "slower": sum(v.verdict == "slower" for v in vs),
                "changes": [round(v.throughput.change, 4) for v in vs],
                "between_cv": [round(v.between_cv, 4) for v in vs]}
    # repeats: three blocks at a time, three runs a side (the t over run means; no between-run term needed)
    triples = [blocks[i:i + 3] for i in range(0, len(blocks) - 2, 3)]
    for name, case in (("A/A", "A2"), ("B-small", "B-small"), ("B-big", "B-big")):
        vs = [compare_perf([runs[(b, "A")] for b in t], [runs[(b, case)] for b in t]) for t in triples
              if all((b, "A") in runs and (b, case) in runs for b in t)]
        res[f"{name}, 3 runs a side"] = {"n": len(vs), "called": sum(v.verdict != "inside the noise" for v in vs),
                                        "slower": sum(v.verdict == "slower" for v in vs),
                                        "changes": [round(v.throughput.change, 4) for v in vs],
                                        "intervals": [(round(v.throughput.lo, 3), round(v.throughput.hi, 3))
                                                      for v in vs]}
    true = [float(np.median(runs[(b, c)].step_time_s[1:])) for b in blocks for c in ("A", "A2") if (b, c) in runs]
    res["median_step_s_A"] = float(np.median(true))
    res["history_floors"] = {b: (f.cv, f.source) for b, f in floors.items()}
    return res


HOST_SDS = (0.0, 0.005, 0.01, 0.02, 0.04)  # how much simulated hosts' levels differ (sd, log units)


def _called(sh, slower: bool = False, min_effect: float = 0.01) -> bool:
    """Return whether compare would call this interval (seconds per token, log units) faster or slower
    (``slower``: slower only, the right call for a B that is slower)."""
    import math

    return (sh.lo > 0 or (sh.hi < 0 and not slower)) and abs(math.expm1(-sh.estimate)) >= min_effect


def _floors(groups: dict, shares: dict | None = None):
    """Return (before, spread, after) between-run terms from a store's levels ``groups`` ({config: {host: [(log
    mean, variance)]}}) for sides spread over hosts as ``shares`` (default: one run a side, A on host 0, B on
    host 1): before, the one-host history only (compare.history's pooled ANOVA on each host, the default as a
    2-df prior); spread, plus the spread of hosts of the kind (compare.history.host_spread, the 14:35 UTC
    rule); after, plus what compare takes now (compare.history.host_term: the compared hosts' measured offset
    when the store links them, else the spread)."""
    import math

    from trainperf.compare.history import PRIOR_DF, host_spread, host_term, pooled_between
    from trainperf.compare.interval import DEFAULT_BETWEEN, BetweenRun, HostSpread

    shares = {str(h): w for h, w in (shares or {0: -1.0, 1: 1.0}).items()}  # host names are text, as in a store
    groups = {c: {str(h): v for h, v in hs.items()} for c, hs in groups.items()}
    weight = sum(w**2 for w in shares.values())
    per_host = {f"{c}|{h}": v for c, hs in groups.items() for h, v in hs.items()}
    tau2, df, _ = pooled_between(per_host)
    prior = DEFAULT_BETWEEN.cv**2
    before = (BetweenRun(cv=math.sqrt((df * tau2 + PRIOR_DF * prior) / (df + PRIOR_DF)), df=df + PRIOR_DF, source="h")
              if df else DEFAULT_BETWEEN)
    sigma2, hdf, _, _ = host_spread(groups, before.cv**2)
    spread = (HostSpread(cv=math.sqrt(sigma2), df=hdf, source="sim", weight=weight) if hdf else
              HostSpread(cv=math.inf, df=math.inf, source="no history", weight=weight))
    return (before, BetweenRun(cv=before.cv, df=before.df, source="h", hosts=spread),
            BetweenRun(cv=before.cv, df=before.df, source="h", hosts=host_term(groups, shares, before)))


def hosts_sim(trials: int, seed: int = 0, interaction: float = 0.0, configs: int = 1) -> list[dict]:
    """Return A/A (called faster or slower) and power (3% slower, called slower) of one run a side on two
    different hosts, simulated: hosts whose
    levels differ by sd HOST_SDS, runs on one host by 0.25%, 1% AR(1) step noise (phi 0.3), 50 steps; the
    store holds 2 runs of one configuration on each of H hosts (H = 0: nothing across hosts), the two
    compared hosts among them when H >= 2. Before: the one-host history only; spread: plus the spread of hosts;
    after: plus the hosts' term compare takes (their measured offset when the store links them).
    ``configs`` > 1 or ``interaction`` > 0: the store holds ``configs`` other configurations (2 runs each a
    host), and a host's level differs from one configuration to another by sd ``interaction`` (memory-bound
    and compute-bound code meeting a host's slow memory or slow clocks unalike); A and B run a configuration
    the store does not hold."""
    import math

    from trainperf.compare.interval import long_run_variance, series_shift

    rng = np.random.default_rng(seed)
    n, phi, tau = 50, 0.3, 0.0025

    def series(level):
        e = rng.normal(size=n)
        x = np.empty(n)
        x[0] = e[0]
        for i in range(1, n):
            x[i] = phi * x[i - 1] + math.sqrt(1 - phi**2) * e[i]
        return math.exp(level) * (1 + 0.01 * x)

    rows = []
    for sd in HOST_SDS:
        for n_hosts in (0, 2, 4, 8):
            counts = {f"{k}_{m}": 0 for k in ("aa", "p3") for m in ("before", "spread", "after")}
            for _ in range(trials):
                m = rng.normal(0, sd, max(n_hosts, 2))
                per_config = rng.normal(0, interaction, (configs + 1, max(n_hosts, 2)))  # row 0: A and B's
                groups = {}
                for k in range(1, configs + 1):
                    for h in range(n_hosts):
                        for _ in range(2):
                            v = long_run_variance(series(m[h] + per_config[k, h] + rng.normal(0, tau)))
                            groups.setdefault(f"c{k}", {}).setdefault(h, []).append(
                                (math.log(v.mean), v.variance / (v.n * v.mean**2)))
                floors = dict(zip(("before", "spread", "after"), _floors(groups)))
                a = series(m[0] + per_config[0, 0] + rng.normal(0, tau))
                for change, key in ((0.0, "aa"), (0.03, "p3")):
                    # B slower by `change` (time)
                    b = series(m[1] + per_config[0, 1] + rng.normal(0, tau) + math.log1p(change))
                    for method, floor in floors.items():
                        counts[f"{key}_{method}"] += _called(series_shift(a, b, between=floor), slower=change > 0)
            rows.append({"host_sd": sd, "hosts_in_store": n_hosts, "trials": trials, "interaction": interaction,
                         "configs": configs,
                         **{k: v / trials for k, v in counts.items()}})
            print(f"| {sd:.1%} | {n_hosts} | " + " | ".join(f"{counts[k] / trials:.1%}" for k in counts) + " |",
                  flush=True)
    return rows


def hosts_recorded(out: Path, trials: int, seed: int = 0) -> list[dict]:
    """Return A/A calls (faster or slower) and B-small/B-big calls (slower) of one run a side on two
    different (simulated) hosts, built from
    the recorded runs of ``record_speed_blocks``: their 24 baseline runs are dealt to 6 hosts (4 each)
    whose levels differ by sd HOST_SDS (each run's steps scaled by its host's factor); the compared
    pair is one baseline run on one host against another baseline run (A/A), or a B run, on another
    host, the other baseline runs are the store. Before, spread, after: as ``hosts_sim``."""
    import math

    from trainperf.compare.history import run_level
    from trainperf.compare.interval import series_shift
    from trainperf.compare.perf import seconds_per_token, steady_slice
    from trainperf.compare.runs import load_run

    folders = sorted(p for p in out.glob("b[0-9][0-9]-*") if (p / "summary.json").is_file())
    runs = {p.name: load_run(str(p)) for p in folders}
    level = {k: run_level(r) for k, r in runs.items()}
    per_token = {k: seconds_per_token(r)[steady_slice(r.step_time_s)] for k, r in runs.items()}
    per_token = {k: v[np.isfinite(v) & (v > 0)] for k, v in per_token.items()}
    base = [k for k in runs if k.endswith(("-A", "-A2")) and level[k] is not None]
    other = {c: [k for k in runs if k.endswith(c)] for c in ("-B-small", "-B-big")}
    rng = np.random.default_rng(seed)
    rows = []
    for sd in HOST_SDS:
        counts = {f"{k}_{m}": 0 for k in ("aa", "B-small", "B-big") for m in ("before", "spread", "after")}
        for _ in range(trials):
            order = list(rng.permutation(base))
            host = {k: i // 4 for i, k in enumerate(order)}  # 6 hosts of 4 runs
            m = rng.normal(0, sd, 6)
            x, y = order[0], order[4]  # hosts 0 and 1
            groups = {"c": {}}
            for k in order[1:4] + order[5:]:
                groups["c"].setdefault(host[k], []).append((level[k][0] + m[host[k]], level[k][1]))
            floors = dict(zip(("before", "spread", "after"), _floors(groups)))
            a = per_token[x] * math.exp(m[0])
            pairs = {"aa": per_token[y] * math.exp(m[1])}
            for c in ("B-small", "B-big"):
                same_block = [k for k in other[f"-{c}"] if k[:3] == x[:3]]
                if same_block:
                    pairs[c] = per_token[same_block[0]] * math.exp(m[1])
            for key, b in pairs.items():
                for method, floor in floors.items():
                    counts[f"{key}_{method}"] += _called(series_shift(a, b, between=floor), slower=key != "aa")
        rows.append({"host_sd": sd, "trials": trials, **{k: v / trials for k, v in counts.items()}})
        print(f"| {sd:.1%} | " + " | ".join(f"{counts[k] / trials:.1%}" for k in counts) + " |", flush=True)
    return rows


def floor_cost(out: Path, repeat: int) -> dict:
    """Return the median seconds of ``compare.history.between_floor`` (one run a side, A and B on two hosts)
    over ``repeat`` calls, and the store reads (``trainperf.store.read_runs`` calls) each made, on a store
    of 6 hosts x 2 configurations x 4 runs of 200 steps (1% step noise, hosts 2% apart) built in
    ``out``/floor_store."""
    import shutil
    import statistics

    import trainperf.store as store_mod
    from trainperf.compare.history import between_floor
    from trainperf.compare.runs import RunData
    from trainperf.store import RunRecord, StepSample, write_run

    rng = np.random.default_rng(0)
    root = out / "floor_store"
    shutil.rmtree(root, ignore_errors=True)
    for h in range(6):
        host_level = float(np.exp(rng.normal(0, 0.02)))
        for model in ("tiny", "small"):
            for k in range(4):
                st = 0.1 * host_level * (1 + 0.01 * rng.normal(size=200))
                write_run(RunRecord(run_id=f"h{h}-{model}-{k}", job="train", host=f"node{h}", gpu_model="cpu",
                                    model=model, layout="mbs=1", started_at=1000.0 + k,
                                    samples=[StepSample(i + 1, float(x), tokens_per_s=256 / float(x))
                                             for i, x in enumerate(st)]), str(root))

    def run(name, host):
        st = 0.1 * (1 + 0.01 * rng.normal(size=200))
        n = len(st)
        return RunData(name=name, step=np.arange(1, n + 1, dtype=float), step_time_s=st, loss=np.full(n, np.nan),
                       grad_norm=np.full(n, np.nan), tokens_per_s=256 / st, mfu=np.full(n, np.nan),
                       mem_peak_bytes=np.full(n, np.nan), t_end=np.cumsum(st), t_start=0.0, run_id=name, host=host)

    a, b = run("a", "node0"), run("b", "node1")
    reads, real = [0], store_mod.read_runs

    def counting(*args, **kw):  # count the store reads (trainperf.store.read_runs, the one entry point)
        reads[0] += 1
        return real(*args, **kw)

    store_mod.read_runs = counting
    times = []
    try:
        for _ in range(repeat):
            reads[0] = 0
            t0 = time.perf_counter()
            floor = between_floor([a], [b], str(root))
            times.append(time.perf_counter() - t0)
    finally:
        store_mod.read_runs = real
    res = {"median_s": statistics.median(times), "reads": reads[0], "history_cv": floor.cv,
           "hosts": None if floor.hosts is None else floor.hosts.source}
    print(f"between_floor, one run a side on 2 of 6 hosts, 48 stored runs x 200 steps: median "
          f"{res['median_s']:.3f} s of {repeat}, {reads[0]} store reads; history cv {floor.cv:.4f}; hosts: "
          f"{res['hosts']}")
    return res


def gate_band(runs: dict) -> list[dict]:
    """Return the `gate --numerics band` statuses of every change against all baseline seeds (each
    candidate seed alone and all together), and with one baseline seed (inconclusive expected)."""
    from trainperf.fleet.gate import band_gate

    rows = []
    for case, bs in runs.items():
        if case == "A":
            continue
        each = [band_gate(runs["A"], [b]) for b in bs]
        rows.append({"case": case, "expected": "pass" if EXPECTED[case] == "equivalent" else "fail",
                     "each": [g.status + (f" (step {g.step})" if g.step is not None else "") for g in each],
                     "all": band_gate(runs["A"], bs).status, "one_seed": band_gate(runs["A"][:1], bs[:1]).status})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--kernels", action="store_true", help="also the fused-kernel run (slow on CPU: interpreter)")
    ap.add_argument("--kernel-seeds", type=int, default=2)
    ap.add_argument("--out", default="/tmp/bench_compare")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--precision", default="", help="layout precision (default: the trainer's: fp32 on CPU, bf16 on GPU)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ", ".join(CASES))
    ap.add_argument("--speed-eval", action="store_true",
                    help="only evaluate the recorded speed blocks in --out (A/A and power, before/default/history)")
    ap.add_argument("--hosts", type=int, default=0, metavar="TRIALS",
                    help="only the A/A and power of runs on two different hosts, simulated fleets and the recorded "
                         "speed blocks in --out dealt to simulated hosts (TRIALS pairs each)")
    ap.add_argument("--hosts-configs", type=int, default=1,
                    help="with --hosts: configurations the simulated store holds (A and B run another when > 1)")
    ap.add_argument("--hosts-interaction", type=float, default=0.0,
                    help="with --hosts: sd of a host's level from one configuration to another (log units)")
    ap.add_argument("--floor-cost", type=int, default=0, metavar="REPEAT",
                    help="only time compare's store reads for the between-run and hosts' terms (module doc)")
    ap.add_argument("--speed-blocks", type=int, default=0,
                    help="only record this many blocks of A, A2, B-small, B-big speed runs (A/A and power pairs)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from trainperf.compare import compare_runs, load_run

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.speed_blocks:
        record_speed_blocks(out, args.speed_blocks, args)
        return
    if args.floor_cost:
        floor_cost(out, args.floor_cost)
        return
    if args.hosts:
        methods = ("before", "spread", "after")
        print("| hosts differ by | hosts in store | " + " | ".join(f"{k} {m}" for k in ("A/A", "3% found")
                                                                  for m in methods) + " |")
        sim = hosts_sim(args.hosts, interaction=args.hosts_interaction, configs=args.hosts_configs)
        print("| hosts differ by | " + " | ".join(f"{k} {m}" for k in ("A/A", "B-small", "B-big")
                                                 for m in methods) + " |")
        rec = hosts_recorded(out, args.hosts) if any(out.glob("b[0-9][0-9]-A")) else []
        (out / "hosts_eval.json").write_text(json.dumps({"simulated": sim, "recorded": rec}, indent=1))
        return
    if args.speed_eval:
        res = speed_eval(out)
        (out / "speed_eval.json").write_text(json.dumps(res, indent=1))
        print("| pairs | n | before: called | default: called (slower) | history: called (slower) |")
        print("|---|---|---|---|---|")
        for name, r in res.items():
            if isinstance(r, dict) and "before" in r:
                print(f"| {name} | {r['before']['n']} | " + " | ".join(
                    f"{r[m]['called']} ({r[m]['slower']})" for m in ("before", "default", "history")) + " |")
        for name, r in res.items():
            if isinstance(r, dict) and "intervals" in r:
                print(f"{name}: {r['called']} of {r['n']} called ({r['slower']} slower); throughput changes "
                      + ", ".join(f"{c:+.0%} [{lo:+.0%}, {hi:+.0%}]"
                                  for c, (lo, hi) in zip(r["changes"], r["intervals"])))
        print(f"median A step {res['median_step_s_A'] * 1e3:.0f} ms; history floors: {res['history_floors']}")
        return
    cases = {c: CASES[c] for c in args.cases.split(",") if c in CASES}
    cases.setdefault("A", {})
    if args.kernels:
        cases["kernels"] = {"kernels": True}
    t0 = time.time()
    folders: dict[str, list[Path]] = {}
    for case, kw in cases.items():
        n = args.kernel_seeds if case == "kernels" else args.seeds
        folders[case] = [run_case(out, case, s, args, kw) for s in range(n)]
    runs = {c: [load_run(str(f)) for f in fs] for c, fs in folders.items()}
    rows, results = [], {}
    for case in cases:
        if case == "A":
            continue
        per_seed = []
        for i, b in enumerate(runs[case]):
            c = compare_runs([runs["A"][i]], [b])
            per_seed.append({"seed": i, "verdict": c.numerics.verdict, "perf": c.perf.verdict,
                             "speed": c.perf.throughput.change, "max_excess": max(
                                 (d.max_excess for d in c.numerics.divergences if d.metric == "loss"), default=None)})
        k = len(runs[case])
        pooled = compare_runs(runs["A"][:k], runs[case])
        ok = sum(EXPECTED[case] in p["verdict"] for p in per_seed)
        results[case] = {"per_seed": per_seed, "all_seeds": pooled.numerics.verdict,
                         "band_all_seeds": pooled.numerics.band_source, "right": ok, "n": k}
        rows.append(f"| {case} | {EXPECTED[case]} | {ok}/{k} | "
                    + ", ".join(p["verdict"].replace("diverges at step ", "step ") for p in per_seed)
                    + f" | {pooled.numerics.verdict} |")
    gate_rows = gate_band(runs)
    aa = []
    for x, y in itertools.combinations(range(len(runs["A"])), 2):
        c = compare_runs([runs["A"][x]], [runs["A"][y]])
        t = c.perf.throughput
        aa.append({"pair": [x, y], "verdict": c.perf.verdict, "change": t.change, "lo": t.lo, "hi": t.hi})
    false_alarms = sum(a["verdict"] != "inside the noise" for a in aa)
    # with repeats: two baseline runs a side (every split of 4 runs into 2 + 2)
    aa_rep = []
    for four in itertools.combinations(range(len(runs["A"])), 4):
        for left in itertools.combinations(four, 2):
            if left[0] != four[0]:
                continue  # each split once
            right = [i for i in four if i not in left]
            c = compare_runs([runs["A"][i] for i in left], [runs["A"][i] for i in right])
            t = c.perf.throughput
            aa_rep.append({"a": list(left), "b": right, "verdict": c.perf.verdict, "change": t.change,
                           "lo": t.lo, "hi": t.hi})
    rep_alarms = sum(a["verdict"] != "inside the noise" for a in aa_rep)
    results["gate_band"] = gate_rows
    results["a_a"] = {"pairs": aa, "false_alarms": false_alarms, "repeats_2v2": aa_rep,
                      "repeats_false_alarms": rep_alarms}
    results["elapsed_s"] = time.time() - t0
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("| change | expected | right | per seed (A vs B of that seed) | all seeds at once (seed band) |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n`gate --numerics band` (baseline: all A seeds; each candidate seed alone, then all at once):")
    print("| change | expected | each seed | all seeds | one baseline seed |")
    print("|---|---|---|---|---|")
    for row in gate_rows:
        print(f"| {row['case']} | {row['expected']} | {', '.join(row['each'])} | {row['all']} | {row['one_seed']} |")
    print(f"\nA/A (baseline runs of different seeds, speed): {false_alarms} of {len(aa)} pairs called faster/slower; "
          "changes: " + ", ".join(f"{a['change']:+.1%} [{a['lo']:+.1%}, {a['hi']:+.1%}]" for a in aa))
    print(f"A/A with repeats (2 baseline runs a side, every 2+2 split): {rep_alarms} of {len(aa_rep)} called "
          "faster/slower; changes: " + ", ".join(f"{a['change']:+.1%} [{a['lo']:+.1%}, {a['hi']:+.1%}]" for a in aa_rep))
    print(f"elapsed {results['elapsed_s']:.0f} s")


if __name__ == "__main__":  # DCP's process-based async save needs the guard
    main()
