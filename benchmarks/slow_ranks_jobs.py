"""Slow ranks against unequal work: what diagnose names on simulated multi-rank jobs.

Each job: N ranks, 8 steps of one GEMM (8 ms) then an all-reduce that ends 300 us after the last rank arrives,
written as Kineto traces (tests/trace/kineto_builder.py). Scenarios:
- slow group: G ranks (the last G, one node's when G = 8) compute 1.3x longer (2.4 ms) in every step, and every
  rank's GEMM varies by +-noise us per step (uniform; --noise, default 100): the last rank of a step is one of the
  group, by the noise;
- rotating: one rank per step computes 3 ms more, a different one each step (unequal work: load imbalance);
- random: every rank's GEMM varies by +-1.5 ms per step (unequal work, no slow rank), with a constant per-rank
  offset of up to 50 us (a consistent order of arrival that costs nothing, as a clock offset left by the
  alignment would give);
- onset (2, 4, 16, 64 ranks): the last rank 1.3x slower from step 3 of 8 on (a GPU that slows down);
- equal (16, 64 ranks): every rank's GEMM +-noise us, nothing else: the ranks wait for each step's last one by
  jitter alone. Truth from the drawn times: load_imbalance when those waits average >= 2 % of the step
  (stragglers.STRAGGLER_MIN_WAIT_PCT, the bar for naming them), else no wait finding, and exposed_comm, if named, priced
  at no more than the all-reduce's own transfer (300 us of 16 ms, +0.5 pp): overlapping cannot hide a wait for a
  late rank;
- tp+dp (16 ranks, write_tp_dp_job): tensor-parallel groups of 4 and data-parallel groups across them, with one
  slow GPU, a slow TP group (one node's) or a slow DP column;
- pipeline (2, 4 and 8 stages, 8 micro-batches, GPipe: tests/trace/pipeline_builder.py): one stage's forward and
  backward 1.3x longer (the first, a middle or the last stage), or balanced stages; every compute kernel +-noise us.
  Right: the first of the straggler / load_imbalance / exposed_comm findings is the straggler naming the slow stage
  (balanced: exposed_comm, the schedule's bubble, and no straggler);
- pp+dp (4 stages x 2 data-parallel copies, 8 ranks; each stage's copies all-reduce their gradients at the end of
  the step): the slow stage's two ranks (stage 2: ranks 2 and 6), or balanced stages: exposed_comm, or
  load_imbalance where the copies' waits for each other at that all-reduce (read back from the written kernels)
  average >= 2 % of the step, as for the equal ranks; never a straggler.
Printed per job: the finding naming the waits (straggler / load_imbalance), its ranks, its gain, the truth, and the
diagnose time. With --collective all_to_all --routed tokens, each rank's all-to-all records receiving tokens in
proportion to its GEMM (its experts drew them: the slow and late ranks' work is routing's), --routed equal the same
on every rank (the GPU is slower): the tally says in how many jobs named right the fix names routing (stragglers.routed)
as the truth says.

    .venv/bin/python benchmarks/slow_ranks_jobs.py [--seeds 3] [--noise 100] [--only pipeline] [--collective all_to_all]
        [--pipeline-steps 5] [--routed tokens|equal]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from rich.progress import track

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402
from pipeline_builder import pipeline_job  # noqa: E402

from trainperf.corpus.kineto import read_events  # noqa: E402
from trainperf.diagnose import stragglers  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.findings import rank_list  # noqa: E402

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
# --collective all_to_all: expert parallelism's exchange, which NCCL runs as SendRecv kernels (the collective's name
# in the kernel's args, as PyTorch >= 2.1 records it)
COLLECTIVE_KERNELS = {"allreduce": NCCL, "all_to_all": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"}
STEPS, P, C, AR = 8, 16_000.0, 8_000.0, 300.0
TOKENS = 1_000_000  # elements of a fair share of the tokens in an all-to-all (--routed)


def write_job(path: Path, compute_us: dict[tuple[int, int], float], ranks: int,
              collective: str = "allreduce", routed: str = "", routing_noise: float = 0.0, seed: int = 0) -> None:
    """compute_us[(rank, step)]: that rank's GEMM in that step (µs); then one `collective` (COLLECTIVE_KERNELS).
    routed (all_to_all): each rank's all-to-all records what it received as PyTorch >= 2.1 does, in proportion to its
    GEMM ("tokens": its experts drew that many tokens) or the same on every rank ("equal": the GEMM is slower for
    another reason), beside an equal combine's worth (the combine returns each rank its own tokens); routing_noise: each
    rank's dispatch +- that share of a fair share a step, uniform, drawn apart from the scenario, its GEMM that share of
    C longer or shorter with it (the router's own noise, which the experts' work follows: among equally slow ranks the
    step's last is the one that drew the most)."""
    rng = random.Random(7919 + seed)  # apart from the scenario's draws (scenario() seeds with `seed`)
    drawn = {(r, s): rng.uniform(-routing_noise, routing_noise) if routed else 0.0
             for r in range(ranks) for s in range(STEPS)}
    gemm = {k: us + C * drawn[k] for k, us in compute_us.items()}
    for r in range(ranks):
        b = TraceBuilder(rank=r, world_size=ranks)
        for s in range(STEPS):
            T = s * P
            b.step(s, T, P)
            b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + 100, T + 110, gemm[r, s])
            last = T + 110 + max(gemm[q, s] for q in range(ranks))
            arrive = T + 110 + gemm[r, s]
            sizes = {}
            if routed:
                share = (compute_us[r, s] / C if routed == "tokens" else 1.0) + drawn[r, s]
                sizes = {"In msg nelems": 2 * TOKENS, "Out msg nelems": int(TOKENS * (1.0 + share)),
                         "dtype": "BFloat16", "Group size": ranks}
            b.launch(COLLECTIVE_KERNELS[collective], T + 140, arrive, last + AR - arrive,
                     **{"Collective name": collective, "Process Group Name": "0", **sizes})
            b.cpu("cudaDeviceSynchronize", T + 300, last + AR + 5 - (T + 300), cat="cuda_runtime")
        b.write(path / f"rank{r}.json.gz")


def write_tp_dp_job(path: Path, slow: set[int], ranks: int, rng: random.Random, noise: float, tp: int = 4,
                    layers: int = 4) -> None:
    """A tensor- and data-parallel job: per step, `layers` x (a 2-ms GEMM, then an all-reduce in each TP group of
    `tp` consecutive ranks), then an all-reduce in each DP group (ranks r, r + tp, ...); the ranks in `slow` run
    their GEMMs 1.3x longer, every GEMM +-noise us. The host launches a step's work at its start and waits at its
    end. Each collective ends 100 us (TP) or 300 us (DP) after its last rank arrives."""
    period = layers * 3000.0 + 1000.0
    builders = {r: TraceBuilder(rank=r, world_size=ranks) for r in range(ranks)}
    for s in range(STEPS):
        T = s * period
        t = {r: T + 110.0 for r in range(ranks)}  # where each rank's device is
        for b in builders.values():
            b.step(s, T, period)
        for layer in range(layers):
            gemm = {r: 2000.0 * (1.3 if r in slow else 1.0) + rng.uniform(-noise, noise) for r in range(ranks)}
            for r, b in builders.items():
                b.launch("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", T + 10 + 20 * layer, t[r], gemm[r])
            for g in range(ranks // tp):
                members = range(g * tp, (g + 1) * tp)
                last = max(t[q] + gemm[q] for q in members)
                for r in members:
                    builders[r].launch(NCCL, T + 20 + 20 * layer, t[r] + gemm[r], last + 100 - t[r] - gemm[r],
                                       **{"Collective name": "allreduce", "Process Group Name": f"tp{g}"})
                    t[r] = last + 100
        for g in range(tp):
            members = range(g, ranks, tp)
            last = max(t[q] for q in members)
            for r in members:
                builders[r].launch(NCCL, T + 95, t[r], last + 300 - t[r],
                                   **{"Collective name": "allreduce", "Process Group Name": f"dp{g}"})
                builders[r].cpu("cudaDeviceSynchronize", T + 99, last + 305 - (T + 99), cat="cuda_runtime")
    for r, b in builders.items():
        b.write(path / f"rank{r}.json.gz")


def scenario(name: str, ranks: int, rng: random.Random, noise: float) -> tuple[dict, list[int], str]:
    """(compute per rank and step, the ranks truly slow, the kind that names the waits)."""
    if name.startswith("slow"):
        g = int(name.split()[1])
        slow = list(range(ranks - g, ranks))
        comp = {(r, s): C * (1.3 if r in slow else 1.0) + rng.uniform(-noise, noise) for r in range(ranks)
                for s in range(STEPS)}
        return comp, slow, "straggler"
    if name == "onset":  # the last rank 1.3x from step 3 on: a GPU that slows down inside the window
        comp = {(r, s): C * (1.3 if r == ranks - 1 and s >= 3 else 1.0) + rng.uniform(-noise, noise)
                for r in range(ranks) for s in range(STEPS)}
        return comp, [ranks - 1], "straggler"
    if name == "rotating":
        return {(r, s): C + (3000.0 if r == s % ranks else 0.0) for r in range(ranks) for s in range(STEPS)}, [], \
            "load_imbalance"
    if name == "equal":  # jitter only: what its waits cost decides the truth (equal_truth)
        return {(r, s): C + rng.uniform(-noise, noise) for r in range(ranks) for s in range(STEPS)}, [], "none"
    offset = {r: rng.uniform(0, 50) for r in range(ranks)}
    return {(r, s): C + offset[r] + rng.uniform(-1500, 1500) for r in range(ranks) for s in range(STEPS)}, [], \
        "load_imbalance"


def equal_truth(comp: dict[tuple[int, int], float], ranks: int) -> str:
    """load_imbalance when equal ranks' jitter makes them wait >= stragglers.STRAGGLER_MIN_WAIT_PCT of the step on
    average (each rank waits for the step's slowest), else none."""
    waits = [max(comp[q, s] for q in range(ranks)) - comp[r, s] for r in range(ranks) for s in range(STEPS)]
    return "load_imbalance" if 100 * sum(waits) / len(waits) / P >= stragglers.STRAGGLER_MIN_WAIT_PCT else "none"


def all_reduce_wait_pct(path: Path) -> float:
    """The ranks' mean wait inside the gradient all-reduces of a pipeline_job with copies (its kernels' time beyond the
    builder's ALL_REDUCE_US), % of their steps but the last (as diagnose's window): read back from the written JSON."""
    from pipeline_builder import ALL_REDUCE, ALL_REDUCE_US

    waits, steps = [], []
    for f in sorted(path.glob("rank*.json.gz")):
        events = read_events(f)["traceEvents"]
        spans = sorted((e["ts"], e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))[:-1]
        waits += [e["dur"] - ALL_REDUCE_US for e in events if e["name"] == ALL_REDUCE
                  and any(t <= e["ts"] < t + d for t, d in spans)]
        steps += [d for _, d in spans]
    return 100 * sum(waits) / sum(steps) if steps else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--noise", type=float, default=100.0, help="+- us on every GEMM of the slow-group jobs")
    ap.add_argument("--only", default="", help="scenarios whose name starts with one of these, comma-separated "
                                               "(e.g. pipeline; slow,rotating,random for the all-reduce jobs)")
    ap.add_argument("--pipeline-steps", type=int, default=5,
                    help="profiled steps of the pipeline jobs (the last one, cut short, is not analysed)")
    ap.add_argument("--pipeline-schedule", default="gpipe", choices=("gpipe", "1f1b"),
                    help="the pipeline jobs' schedule (tests/trace/pipeline_builder.stage_order)")
    ap.add_argument("--collective", default="allreduce", choices=sorted(COLLECTIVE_KERNELS),
                    help="the one collective a step of the all-reduce and onset jobs ends with")
    ap.add_argument("--routed", default="", choices=("", "tokens", "equal"),
                    help="with --collective all_to_all: what each rank receives (write_job); the named finding's fix "
                         "is then checked for routing's (named with tokens, not with equal)")
    ap.add_argument("--routing-noise", type=float, default=0.0,
                    help="with --routed: each rank's dispatch +- this share of a fair share, apart from its GEMM")
    a = ap.parse_args()
    jobs = [(n, sc, seed) for n in (16, 64) for sc in ("slow 1", "slow 4", "slow 8", "rotating", "random")
            for seed in range(a.seeds)]
    # a rank that turns slow at step 3, in small and large jobs
    jobs += [(n, "onset", seed) for n in (2, 4, 16, 64) for seed in range(a.seeds)]
    # equal ranks, jitter only
    jobs += [(n, "equal", seed) for n in (16, 64) for seed in range(a.seeds)]
    # tensor x data parallel, 16 ranks: one slow GPU, a slow TP group (one node's), a slow DP column
    jobs += [(16, sc, seed) for sc in ("tp+dp: 5", "tp+dp: 4-7", "tp+dp: 1,5,9,13") for seed in range(a.seeds)]
    # pipelines of 2, 4 and 8 stages: a slow first, middle or last stage, or balanced ones
    jobs += [(n, f"pipeline: {slow}", seed) for n in (2, 4, 8) for slow in dict.fromkeys((0, n // 2, n - 1, "none"))
             for seed in range(a.seeds)]
    # the same pipeline with 2 data-parallel copies of it: a slow stage is two ranks
    jobs += [(8, f"pp+dp: {slow}", seed) for slow in (2, "none") for seed in range(a.seeds)]
    jobs = [j for j in jobs if j[1].startswith(tuple(a.only.split(",")))]
    print("| ranks | scenario | seed | truth | named | ranks named | gain % | diagnose s |")
    print("|---|---|---|---|---|---|---|---|")
    right: dict[str, list[int]] = {}  # family -> [named right, jobs]
    routed_fix: dict[str, list[int]] = {}  # --routed: scenario -> [fix names the routing as the truth says, jobs]
    for n, sc, seed in track(jobs, description="jobs", transient=True):
        with tempfile.TemporaryDirectory() as tmp:
            if sc.startswith(("pipeline", "pp+dp")):
                spec, copies = sc.split(": ")[1], 2 if sc.startswith("pp+dp") else 1
                stages = n // copies
                slow = [] if spec == "none" else [int(spec) + d * stages for d in range(copies)]
                kind = "pipeline_bubble" if spec == "none" else "straggler"
                pipeline_job(Path(tmp), [1000.0 * (1.3 if s in slow else 1.0) for s in range(stages)], micro=8,
                             noise_us=a.noise, rng=random.Random(seed), replicas=copies, steps=a.pipeline_steps,
                             schedule=a.pipeline_schedule)
                if copies > 1 and not slow and all_reduce_wait_pct(Path(tmp)) >= stragglers.STRAGGLER_MIN_WAIT_PCT:
                    kind = "load_imbalance"  # the copies' jitter costs as much as the equal ranks' does
            elif sc.startswith("tp+dp"):
                spec = sc.split(": ")[1]
                slow = (list(range(int(spec.split("-")[0]), int(spec.split("-")[1]) + 1)) if "-" in spec
                        else [int(v) for v in spec.split(",")])
                kind = "straggler"
                write_tp_dp_job(Path(tmp), set(slow), n, random.Random(seed), a.noise)
            else:
                comp, slow, kind = scenario(sc, n, random.Random(seed), a.noise)
                kind = equal_truth(comp, n) if sc == "equal" else kind
                write_job(Path(tmp), comp, n, a.collective, a.routed if a.collective == "all_to_all" else "",
                          a.routing_noise, seed)
            t0 = time.perf_counter()
            d = diagnose(tmp)
            secs = time.perf_counter() - t0
        piped = sc.startswith(("pipeline", "pp+dp"))
        waits = ("straggler", "load_imbalance") + (("pipeline_bubble",) if piped else ())
        named = next((f for f in d.findings if f.kind in waits), None)
        ok = named is not None and named.kind == kind and (kind != "straggler" or named.ranks == slow)
        if piped and kind in ("pipeline_bubble", "load_imbalance"):
            # a pipeline always has its bubble: the truth's kind found, wherever the gains rank it, and no straggler
            named = next((f for f in d.findings if f.kind == kind), named)
            ok = named is not None and named.kind == kind and not any(f.kind == "straggler" for f in d.findings)
        if kind == "none":  # no wait named, and overlapping priced at the transfer it can hide
            exposed = next((f for f in d.findings if f.kind == "exposed_comm"), None)
            named = exposed if named is None else named
            ok = (named is None or named.kind == "exposed_comm") and \
                (exposed is None or exposed.gain_pct <= 100 * AR / P + 0.5)
        family = "tensor x data parallel" if sc.startswith("tp+dp") else "turns slow at step 3" if sc == "onset" \
            else "pipeline stages" if sc.startswith("pipeline") else "pipeline x data parallel" if piped \
            else "equal ranks, jitter only" if sc == "equal" \
            else f"{a.collective} jobs"
        tally = right.setdefault(family, [0, 0])
        tally[0] += ok
        tally[1] += 1
        truth = f"straggler {rank_list(slow)}" if slow else kind
        routing = ""
        if a.routed and a.collective == "all_to_all" and not piped and not sc.startswith("tp+dp") and ok and named:
            said = "all-to-all data" in named.recommendation  # stragglers.routed: the fix names the routing
            routing = " (routing named)" if said else ""
            if kind in ("straggler", "load_imbalance"):
                fix = routed_fix.setdefault(sc.split()[0], [0, 0])
                fix[0] += said == (a.routed == "tokens")
                fix[1] += 1
        print(f"| {n} | {sc} | {seed} | {truth} | {named.kind if named else '-'}{routing} | "
              f"{(named.ranks if len(named.ranks) <= 8 else f'{len(named.ranks)} ranks') if named else '-'} | "
              f"{named.gain_pct if named else 0:.1f} | {secs:.1f} |")
    for family, (ok, n) in right.items():
        print(f"{family}: {ok} of {n}")
    for sc, (ok, n) in routed_fix.items():
        print(f"routing {'named' if a.routed == 'tokens' else 'not named'} in the fix, {sc} jobs: {ok} of {n}")
    print(f"\n{sum(v[0] for v in right.values())} of {len(jobs)} named as the truth (kind, and the slow ranks exactly)")


if __name__ == "__main__":
    main()
