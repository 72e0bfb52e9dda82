"""The fleet metric tree: where the allocated GPU-hours of a set of runs went.

Effective training throughput is the fraction of allocated GPU-hours that became model FLOPs
at the accelerator's peak (goodput x MFU). The tree breaks the gap into the factors an engineer
acts on, each in GPU-hours (and dollars)::

    allocated                        world_size x the job's wall time (all attempts)
    ├─ start-up                      process start to first step, per attempt
    ├─ restarts                      failure detection + relaunch
    ├─ lost work                     steps re-done after a resume (since the last checkpoint)
    └─ running
       ├─ data wait                  steps blocked on their next batch
       ├─ checkpoint stalls          the loop blocked saving checkpoints
       ├─ evaluation and other       the rest of the wall time (evaluation, logging, shutdown)
       └─ productive steps
          ├─ below plan              productive time beyond the planner's time for the same work
          ├─ layout overhead         the planner's time for the work minus the work at peak,
          │                          split by the planner's terms (bubble, communication, ...)
          └─ effective               the work at peak: productive x achieved MFU

The time split is the monitor's goodput (trainperf.monitor.goodput, stored in each training
run's ``config["summary"]["goodput"]``); achieved MFU during productive time is read from the
step samples (step MFU is computed over the whole step, data wait included); planned MFU is
trainperf.plan's prediction for the run's model, layout, GPU count and GPU type. ``account_run``
computes every number of one run; the tree is sums of those accounts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache

from trainperf.errors import TrainperfError
from trainperf.monitor.goodput import Goodput
from trainperf.store.record import RunRecord

# (key, label, kind, parent): the tree's shape, in display order. kind: "stage" (a total that
# splits further), "loss" (GPU-hours lost), "result" (what remains), "unsplit" (not measured)
NODES: tuple[tuple[str, str, str, str | None], ...] = (
    ("allocated", "allocated", "stage", None),
    ("startup", "start-up", "loss", "allocated"),
    ("restart", "restarts", "loss", "allocated"),
    ("lost_work", "lost work (since last checkpoint)", "loss", "allocated"),
    ("running", "running", "stage", "allocated"),
    ("data_wait", "data wait", "loss", "running"),
    ("checkpoint", "checkpoint stalls", "loss", "running"),
    ("eval_other", "evaluation and other", "loss", "running"),
    ("productive", "productive steps", "stage", "running"),
    ("below_plan", "below plan (slower than the planner's time)", "loss", "productive"),
    ("layout_overhead", "layout overhead (planned MFU vs 100%)", "stage", "productive"),
    ("kernels", "kernels below peak", "loss", "layout_overhead"),
    ("communication", "communication", "loss", "layout_overhead"),
    ("bubble", "pipeline bubble", "loss", "layout_overhead"),
    ("recompute", "recompute", "loss", "layout_overhead"),
    ("optimizer_host", "optimizer, host and other", "loss", "layout_overhead"),
    ("unplanned", "below 100% MFU (no plan for the run)", "loss", "productive"),
    ("mfu_unknown", "MFU not measured", "unsplit", "productive"),
    ("effective", "effective (model FLOPs at peak)", "result", "productive"),
)
LABELS = {k: label for k, label, _, _ in NODES}
KINDS = {k: kind for k, _, kind, _ in NODES}
LOSSES = tuple(k for k, _, kind, _ in NODES if kind == "loss")
# planner breakdown terms (trainperf.plan.estimate.TERMS) -> layout-overhead leaf
_TERM_LEAF = {"compute": "kernels", "embedding_lm_head": "kernels", "tp_comm": "communication",
              "cp_comm": "communication", "dp_comm": "communication", "pp_p2p": "communication",
              "pp_bubble": "bubble", "recompute": "recompute", "optimizer": "optimizer_host",
              "host_overhead": "optimizer_host"}  # a term not listed here counts as optimizer_host
# the monitor's goodput split, as stored in a training run's config["summary"]["goodput"]
GOODPUT_KEYS = tuple(f.name for f in fields(Goodput) if f.name.endswith("_s"))
# Per-run sums over the steps table, the only place they are computed (a store's steps view, or
# the samples of records in memory registered as a steps table): step time, data wait, and for the
# steps with an MFU the model-FLOP time at peak (mfu x step time) and their productive time.
STEP_SUMS_SQL = """SELECT run_id, SUM(step_time_s) AS step_s, SUM(COALESCE(data_wait_s, 0)) AS wait_s,
  SUM(CASE WHEN mfu IS NOT NULL THEN mfu * step_time_s ELSE 0 END) AS flops_s,
  SUM(CASE WHEN mfu IS NOT NULL THEN step_time_s - COALESCE(data_wait_s, 0) ELSE 0 END) AS mfu_busy_s
  FROM steps{where} GROUP BY run_id"""


@dataclass(kw_only=True, frozen=True)
class StepSums:
    """One run's sums over its step samples (seconds; see STEP_SUMS_SQL)."""

    step_s: float = 0.0
    wait_s: float = 0.0
    flops_s: float = 0.0
    mfu_busy_s: float = 0.0


@dataclass(kw_only=True, frozen=True)
class Plan:
    """The planner's prediction for one run: MFU and each overhead leaf's share of the step time."""

    mfu: float
    shares: dict  # layout-overhead leaf -> fraction of the predicted step time it costs (sums to 1 - mfu)


@dataclass(kw_only=True)
class RunAccount:
    """One run's GPU-hours by tree node (``parts``), with what it was computed from."""

    run_id: str
    attrs: dict  # job, host, version, config: the dimensions --explain segments by
    gpus: int
    usd_per_gpu_hour: float | None
    achieved_mfu: float | None  # over productive time (data wait excluded)
    planned_mfu: float | None
    parts: dict = field(default_factory=dict)  # node key -> GPU-hours
    notes: list = field(default_factory=list)
    # a multi-node run with per-rank compute times: host -> {node key -> GPU-hours} (host_parts)
    host_parts: dict = field(default_factory=dict)


@dataclass(kw_only=True)
class Node:
    """One factor of the tree: its GPU-hours, dollars (None when no run is priced) and children."""

    key: str
    label: str
    kind: str
    gpu_h: float
    usd: float | None
    share: float  # of allocated GPU-hours
    children: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """Return JSON-able data, children nested."""
        return {"key": self.key, "label": self.label, "kind": self.kind, "gpu_h": self.gpu_h, "usd": self.usd,
                "share": self.share, "children": [c.to_dict() for c in self.children]}

    def walk(self):
        """Yield this node and every node below it, depth first."""
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass(kw_only=True)
class MetricTree:
    """The tree over a set of runs, the accounts it sums, and fleet-level figures."""

    root: Node
    accounts: list[RunAccount]
    notes: list[str]

    @property
    def effective_gpu_h(self) -> float | None:
        """GPU-hours of model FLOPs at peak; None when no run measured its MFU (no "effective" node)."""
        return next((n.gpu_h for n in self.root.walk() if n.key == "effective"), None)

    @property
    def effective_fraction(self) -> float | None:
        """Effective GPU-hours over allocated GPU-hours (goodput x MFU; 0 when nothing is allocated,
        None when no run measured its MFU)."""
        eff = self.effective_gpu_h
        if eff is None:
            return None
        return eff / self.root.gpu_h if self.root.gpu_h > 0 else 0.0

    def node(self, key: str) -> Node:
        """Return the node ``key``; raise TrainperfError naming the keys when there is none."""
        for n in self.root.walk():
            if n.key == key:
                return n
        raise TrainperfError(f"no factor {key!r} (factors: {', '.join(LABELS)})")

    def largest_loss(self) -> Node:
        """Return the loss leaf with the most GPU-hours."""
        return max((n for n in self.root.walk() if n.kind == "loss"), key=lambda n: n.gpu_h)

    def to_dict(self) -> dict:
        """Return JSON-able data: the tree, the per-run accounts and notes."""
        return {"allocated_gpu_h": self.root.gpu_h, "effective_fraction": self.effective_fraction,
                "tree": self.root.to_dict(), "notes": self.notes,
                "runs": [{"run_id": a.run_id, **a.attrs, "gpus": a.gpus, "usd_per_gpu_hour": a.usd_per_gpu_hour,
                          "achieved_mfu": a.achieved_mfu, "planned_mfu": a.planned_mfu, "gpu_h": a.parts,
                          "notes": a.notes, **({"gpu_h_by_host": a.host_parts} if a.host_parts else {})}
                         for a in self.accounts]}


# --------------------------------------------------------------------------- inputs of one run


def run_version(rec: RunRecord) -> str:
    """Return the run's software version: git sha, torch, CUDA, NCCL, driver (those recorded)."""
    parts = [(k, getattr(rec, k)) for k in ("git_sha", "torch", "cuda", "nccl", "driver")]
    return " ".join(f"{'git' if k == 'git_sha' else k}={v}" for k, v in parts if v) or "unknown"


def run_config(rec: RunRecord) -> str:
    """Return the run's configuration: model, layout and GPU type."""
    return " ".join(x for x in (rec.model, rec.layout, rec.gpu_model) if x) or "unknown"


def matches_version(rec: RunRecord, version: str) -> bool:
    """True when ``version`` is the run's git sha (or a prefix), torch, CUDA, NCCL or driver version."""
    v = version.strip()
    return bool(v) and ((rec.git_sha and rec.git_sha.startswith(v))
                        or v in (rec.torch, rec.cuda, rec.nccl, rec.driver, run_version(rec)))


def goodput_split(rec: RunRecord, sums: StepSums) -> tuple[dict, str | None]:
    """Return (the run's wall-time split in seconds, keyed as GOODPUT_KEYS; a note or None).

    From the monitor's goodput in ``config["summary"]["goodput"]``; a record without it (an
    imported run) counts its steps only: total = sum of step times, productive = total - data wait.
    """
    gp = ((rec.config or {}).get("summary") or {}).get("goodput")
    if isinstance(gp, dict) and all(isinstance(gp.get(k), (int, float)) for k in GOODPUT_KEYS):
        split = {k: float(gp[k]) for k in GOODPUT_KEYS}
        bad = [k for k, v in split.items() if v < 0 and k != "other_s"]
        if bad:
            raise TrainperfError(f"run {rec.run_id}: negative {bad[0]} in its goodput split")
        return split, None
    split = dict.fromkeys(GOODPUT_KEYS, 0.0)
    split.update(total_s=sums.step_s, productive_s=sums.step_s - sums.wait_s, data_wait_s=sums.wait_s)
    return split, "no goodput split in the record: allocated = its step time only"


def achieved_mfu(rec: RunRecord, sums: StepSums) -> float | None:
    """Return MFU over productive step time: sum(mfu x step time) / sum(step time - data wait).

    A step's MFU is its model FLOPs over (step time x peak), data wait included; weighting by
    step time gives the FLOP time at peak, dividing by the productive time removes the wait.
    Falls back to the record's summary MFU (data wait not removed) when no sample carries MFU.
    """
    if sums.mfu_busy_s > 0:
        return sums.flops_s / sums.mfu_busy_s
    return float(rec.mfu) if rec.mfu is not None else None


def step_sums(records: list[RunRecord]) -> dict[str, StepSums]:
    """Return STEP_SUMS_SQL over the samples of records held in memory: run id -> StepSums."""
    import duckdb
    import pyarrow as pa

    rows = [(r.run_id, s.step_time_s, s.data_wait_s, s.mfu) for r in records for s in r.samples]
    steps = pa.table({"run_id": pa.array([x[0] for x in rows], pa.string()),
                      **{c: pa.array([x[i + 1] for x in rows], pa.float64())
                         for i, c in enumerate(("step_time_s", "data_wait_s", "mfu"))}})
    con = duckdb.connect()
    try:
        con.register("steps", steps)
        return _sums(con.execute(STEP_SUMS_SQL.format(where="")).fetchall())
    finally:
        con.close()


def _sums(rows) -> dict[str, StepSums]:
    return {r[0]: StepSums(step_s=r[1] or 0.0, wait_s=r[2] or 0.0, flops_s=r[3] or 0.0, mfu_busy_s=r[4] or 0.0)
            for r in rows}


@lru_cache(maxsize=256)
def _plan(model: str, gpu: str, n_gpus: int, layout: str, seq: int | None, global_batch: int | None) -> Plan | None:
    from trainperf.plan.api import PlanRequest, run_layout

    try:
        est, _ = run_layout(PlanRequest(model=model, gpu=gpu, n_gpus=n_gpus, seq=seq, global_batch=global_batch),
                            layout)
    except TrainperfError:
        return None
    total = sum(est.breakdown.values())
    if total <= 0 or not 0 < est.mfu <= 1:
        return None
    shares = dict.fromkeys(("kernels", "communication", "bubble", "recompute", "optimizer_host"), 0.0)
    for term, seconds in est.breakdown.items():
        shares[_TERM_LEAF.get(term, "optimizer_host")] += seconds / total
    # the compute terms' time includes the model FLOPs themselves: only their excess over the
    # ideal (MFU) is a loss, so the shares add up to 1 - MFU
    shares["kernels"] -= est.mfu
    return Plan(mfu=float(est.mfu), shares=shares)


@lru_cache(maxsize=64)
def _accelerator(gpu_model: str):
    from trainperf.hardware import accelerator_for_device

    return accelerator_for_device(gpu_model) if gpu_model else None


def planned(rec: RunRecord) -> Plan | None:
    """Return trainperf.plan's prediction for the run's model, layout, GPU type and count, or None.

    None when the model is no preset name, the GPU is not in the catalog or the layout does not
    fit the GPU count. ``config`` may carry ``seq_len`` and ``global_batch``.
    """
    if not rec.model or not rec.layout or "/" in rec.model or rec.model.endswith(".json"):
        return None
    acc = _accelerator(rec.gpu_model)
    if acc is None:
        return None
    cfg = rec.config or {}
    seq = cfg.get("seq_len") if isinstance(cfg.get("seq_len"), int) else None
    gb = cfg.get("global_batch") if isinstance(cfg.get("global_batch"), int) else None
    return _plan(rec.model, acc.name, int(rec.world_size or 1), rec.layout, seq, gb)


def catalog_price(rec: RunRecord) -> float | None:
    """Return the catalog's USD per GPU-hour for the run's GPU type, or None when it is not listed."""
    acc = _accelerator(rec.gpu_model)
    return float(acc.usd_per_hour) if acc is not None and acc.usd_per_hour else None


# --------------------------------------------------------------------------- one run, then the tree


def account_run(rec: RunRecord, sums: StepSums, plan: Plan | None, usd_per_gpu_hour: float | None) -> RunAccount:
    """Return the run's GPU-hours per tree node: the one place every number of the tree is computed.

    GPU-hours = seconds x world_size / 3600. With achieved MFU ``a`` and planned MFU ``p``, the
    work done at peak is effective = productive x a; the planner would take effective / p for it,
    so layout overhead = effective x (1 - p) / p (split by ``plan.shares``) and below plan =
    productive - effective / p (negative when the run beats the plan). A slower run (same work,
    longer steps) thus adds exactly its extra time to "below plan" and nothing to the layout's
    overhead. Without a plan, productive x (1 - a) is "unplanned"; without a measured MFU, all
    productive time is "MFU not measured".
    """
    split, note = goodput_split(rec, sums)
    gpus = int(rec.world_size or 1)
    h = gpus / 3600.0
    p = {"allocated": split["total_s"] * h, "startup": split["startup_s"] * h, "restart": split["restart_s"] * h,
         "lost_work": split["lost_work_s"] * h, "data_wait": split["data_wait_s"] * h,
         "checkpoint": split["checkpoint_s"] * h, "eval_other": split["other_s"] * h,
         "productive": split["productive_s"] * h}
    p["running"] = p["allocated"] - p["startup"] - p["restart"] - p["lost_work"]
    a = achieved_mfu(rec, sums)
    if a is None:
        p["mfu_unknown"] = p["productive"]
    else:
        p["effective"] = p["productive"] * a
        if plan is None:
            p["unplanned"] = p["productive"] * (1.0 - a)
        else:
            planned_h = p["effective"] / plan.mfu  # the planner's GPU-hours for the same work
            p["below_plan"] = p["productive"] - planned_h
            p["layout_overhead"] = planned_h - p["effective"]
            for leaf, share in plan.shares.items():
                p[leaf] = planned_h * share
    attrs = {"job": rec.job, "host": rec.host or "unknown", "version": run_version(rec), "config": run_config(rec)}
    return RunAccount(run_id=rec.run_id, attrs=attrs, gpus=gpus, usd_per_gpu_hour=usd_per_gpu_hour,
                      achieved_mfu=a, planned_mfu=plan.mfu if plan else None, parts=p,
                      notes=[note] if note else [], host_parts=host_parts(rec, p))


def rank_hosts(rec: RunRecord) -> list[tuple[str, float]] | None:
    """Return [(host, busy_s)] per rank from ``config["summary"]["ranks"]`` (each rank's host and its
    own compute time per step in seconds, collective waits excluded), or None when absent or unusable."""
    ranks = (rec.config.get("summary") or {}).get("ranks") if isinstance(rec.config, dict) else None
    if not isinstance(ranks, list) or not ranks:
        return None
    try:
        out = [(str(r["host"]), float(r["busy_s"])) for r in ranks]
    except (KeyError, TypeError, ValueError):
        return None
    return out if all(b >= 0 for _, b in out) else None


def host_parts(rec: RunRecord, parts: dict) -> dict:
    """Return the run's GPU-hours split by host, {host: {node key: GPU-hours}}, from its ranks; {} when
    the record has no per-rank hosts (only rank 0's host is known).

    A synchronous step waits for its slowest rank, so the host holding the slowest rank costs the
    whole job the difference between its compute time per step and the next slowest host's (the
    step would take that long were it as fast as the others; a host's time is its slowest rank's).
    That straggler loss, productive x difference / its compute time, capped at the run's "below
    plan", is that host's; every other GPU-hour, and the rest of "below plan", splits by each
    host's share of the ranks. The pieces sum to the run's parts exactly.
    """
    ranks = rank_hosts(rec)
    if not ranks:
        return {}
    busy: dict[str, float] = {}
    gpus: dict[str, int] = {}
    for host, b in ranks:
        busy[host] = max(busy.get(host, 0.0), b)
        gpus[host] = gpus.get(host, 0) + 1
    slowest = max(busy, key=busy.get)
    others = [b for h, b in busy.items() if h != slowest]
    lag = busy[slowest] - max(others) if others else 0.0
    below = max(parts.get("below_plan", 0.0), 0.0)
    straggler = min(below, parts.get("productive", 0.0) * lag / busy[slowest]) if busy[slowest] > 0 else 0.0
    out = {}
    for host, n in gpus.items():
        share = n / len(ranks)
        piece = {k: v * share for k, v in parts.items()}
        if "below_plan" in parts:
            piece["below_plan"] = (parts["below_plan"] - straggler) * share + (straggler if host == slowest else 0.0)
        out[host] = piece
    return out


def superseded(records: list[RunRecord]) -> set[str]:
    """Return the ids of records whose wall time a later attempt's record already covers.

    The monitor's goodput of attempt k covers attempts 0..k of the job; a record with
    ``attempts`` = k (k > 1) supersedes the k - 1 records of the same job, host, model and layout
    just before it that counted fewer attempts.
    """
    def attempts(r):
        gp = ((r.config or {}).get("summary") or {}).get("goodput") or {}
        return int(gp.get("attempts") or 1) if isinstance(gp, dict) else 1

    out: set[str] = set()
    by_key: dict = {}
    for r in sorted(records, key=lambda r: (r.started_at, r.run_id)):
        by_key.setdefault((r.job, r.host, r.model, r.layout), []).append(r)
    for rs in by_key.values():
        for i, r in enumerate(rs):
            k = attempts(r)
            earlier = [q for q in rs[:i] if q.run_id not in out and attempts(q) < k][-(k - 1):] if k > 1 else []
            out.update(q.run_id for q in earlier)
    return out


def build_tree(records: list[RunRecord], usd_per_gpu_hour: float | None = None,
               sums: dict[str, StepSums] | None = None) -> MetricTree:
    """Return the metric tree over ``records`` (training runs; benchmark records are skipped).

    ``usd_per_gpu_hour`` prices every run; default: each run's GPU at its catalog price.
    ``sums``: run id -> StepSums from the store (default: computed from the records' samples).
    """
    runs = [r for r in records if r.kind != "bench"]
    gone = superseded(runs)
    runs = [r for r in runs if r.run_id not in gone]
    if sums is None:
        sums = step_sums(runs)
    accounts = [account_run(r, sums.get(r.run_id, StepSums()), planned(r),
                            usd_per_gpu_hour if usd_per_gpu_hour is not None else catalog_price(r)) for r in runs]
    notes = []
    if gone:
        notes.append(f"{len(gone)} earlier-attempt record(s) left out: a later attempt's goodput covers them")
    for text in sorted({n for a in accounts for n in a.notes}):
        notes.append(f"{sum(text in a.notes for a in accounts)} run(s): {text}")
    beat = sum(a.planned_mfu is not None and a.achieved_mfu is not None and a.achieved_mfu > 1.1 * a.planned_mfu
               for a in accounts)
    if beat:
        notes.append(f"{beat} run(s) beat the planner's MFU by more than 10% (negative 'below plan'): check the "
                     "planner's calibration for their model and GPU (`trainperf calibrate`)")
    unpriced = sum(a.usd_per_gpu_hour is None for a in accounts)
    if unpriced:
        notes.append(f"{unpriced} run(s) on a GPU without a catalog price: dollars leave them out "
                     "(pass --usd-per-hour)")
    return MetricTree(root=_node("allocated", accounts), accounts=accounts, notes=notes)


def _node(key: str, accounts: list[RunAccount]) -> Node:
    total = sum(a.parts.get("allocated", 0.0) for a in accounts)
    gpu_h = sum(a.parts.get(key, 0.0) for a in accounts)
    priced = [a for a in accounts if a.usd_per_gpu_hour is not None]
    usd = sum(a.parts.get(key, 0.0) * a.usd_per_gpu_hour for a in priced) if priced else None
    children = [_node(k, accounts) for k, _, _, parent in NODES if parent == key
                and any(k in a.parts for a in accounts)]
    return Node(key=key, label=LABELS[key], kind=KINDS[key], gpu_h=gpu_h, usd=usd,
                share=gpu_h / total if total > 0 else 0.0, children=children)


# --------------------------------------------------------------------------- over the store


def parse_since(text: str, now: float) -> float:
    """Return unix seconds for ``text``: unix seconds, an ISO date/time (UTC unless stated), or an
    age before ``now`` such as ``90m``, ``12h``, ``7d``, ``2w``."""
    from datetime import datetime, timezone

    s = text.strip()
    units = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
    try:
        if s[-1:].lower() in units and s[:-1].replace(".", "", 1).isdigit():
            return now - float(s[:-1]) * units[s[-1].lower()]
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise TrainperfError(f"--since {text!r}: give unix seconds, an ISO date/time or an age like 7d") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def fleet_tree(store: str | None = None, *, since: float | None = None, job: str | None = None,
               host: str | None = None, version: str | None = None,
               usd_per_gpu_hour: float | None = None) -> MetricTree:
    """Return the metric tree over the store's runs matching the filters (see ``matches_version``).

    Raises TrainperfError when no training run matches.
    """
    from trainperf.store import RunFilter, open_store

    if usd_per_gpu_hour is not None and not usd_per_gpu_hour > 0:
        raise TrainperfError(f"--usd-per-hour must be positive, got {usd_per_gpu_hour}")
    st = open_store(store)
    filt = RunFilter(job=job, since=since, host=host)
    records = st.read(filt, samples=False)  # the steps are summed in the store, not read
    if version is not None:
        records = [r for r in records if matches_version(r, version)]
    if not any(r.kind != "bench" for r in records):
        what = ", ".join(f"{k} {v!r}" for k, v in (("job", job), ("host", host), ("version", version)) if v)
        raise TrainperfError("store: no training runs" + (f" matching {what}" if what else "")
                             + (" since the given time" if since is not None else ""))
    where, params = filt.where(mark="?", member="")
    where = f" WHERE run_id IN (SELECT run_id FROM runs{where})" if where else ""
    table = st.query(STEP_SUMS_SQL.format(where=where), params or None)
    sums = _sums(zip(*(table.column(c).to_pylist() for c in ("run_id", "step_s", "wait_s", "flops_s",
                                                               "mfu_busy_s"))))
    return build_tree(records, usd_per_gpu_hour, sums)
