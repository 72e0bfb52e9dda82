"""One Perfetto timeline for a whole job: every rank's trace merged into one Chrome trace-event JSON.

Ranks are processes (pid = rank, named "rank N"); each rank's host threads and device streams are
its threads. Rank clocks are aligned on the matched collectives (crossrank: collectives end together
on every rank, so a rank's clock offset is the median difference of their end times) and the file's
time zero is the earliest aligned event, so µs floats keep ns precision. Launches are linked to
their kernels by flow arrows, as in a Kineto trace.

The findings are added per rank as slices on threads named "finding: <kind>": one slice over the
rank's whole trace carrying the finding (severity, gain, what-if, recommendation, metrics) and,
nested in it, one slice per evidence event at the moment it happens, with a flow arrow to the
traced event itself when the evidence names one. Clicking the arrow in Perfetto goes from the
finding to the kernel, copy or host span that shows it.

Format rules followed (Chrome trace-event format as Perfetto's JSON importer reads it): every
event has ph, pid, tid and ts (µs); "X" slices have dur >= 0 and nest properly on their thread
(an evidence slice that would overlap another goes to a further "finding: <kind> (2)" thread);
flows are "s"/"f" pairs with one id, the "f" bound to the enclosing slice ("bp": "e"); the allocator's samples of a
trace profiled with profile_memory=True are counter events ("C": a track a device, its allocated and reserved GiB).
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainperf.atomic import atomic_path
from trainperf.diagnose.memory import GIB, accelerator_samples
from trainperf.diagnose.window import times_us
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.events import CATEGORY_NAMES, DEVICE_KINDS, KIND_NAMES, EventTable

try:  # orjson serialises events ~5x faster than json; optional
    import orjson

    def _dumps(ev: dict) -> str:
        return orjson.dumps(ev).decode()
except ImportError:  # pragma: no cover - exercised where orjson is absent
    def _dumps(ev: dict) -> str:
        return json.dumps(ev, separators=(",", ":"))

FINDING_CAT = "trainperf_finding"
LAUNCH_FLOW_CAT = "ac2g"                 # Kineto's category for launch -> kernel flows
TIDS_PER_RANK = 100_000                  # tid = rank * TIDS_PER_RANK + k: unique across ranks
LANE_TIDS = 10_000                       # overlap lane j of a thread: its tid + j * LANE_TIDS
MAX_LANES = 8
MATCH_TOLERANCE_US = 1.0                 # evidence starts are rounded to 0.1 µs
_RANK_IN_TEXT = re.compile(r"\brank (\d+)")
_COUNT_PREFIX = re.compile(r"^\[\d+ launches\] ")


@dataclass(kw_only=True)
class PerfettoSummary:
    """What was written: events, finding slices, flows (launch and finding), per-rank clock offset (µs)."""

    path: str
    n_events: int
    n_finding_slices: int
    n_finding_flows: int
    n_launch_flows: int
    clock_offset_us: dict = field(default_factory=dict)


def write_job_timeline(out: str | Path, diagnosis) -> PerfettoSummary:
    """Write the merged timeline of the event tables a Diagnosis was made from (its --steps) to out."""
    return write_perfetto(out, diagnosis.tables, diagnosis.findings, diagnosis.cross_rank.get("clock_offset_us", {}))


def write_perfetto(out: str | Path, tables: dict[int, EventTable], findings: list,
                   clock_offset_us: dict) -> PerfettoSummary:
    """Write the merged timeline of tables (rank -> EventTable) with the findings' evidence to out
    (.json, or gzip when out ends in .gz); clock_offset_us: rank -> its clock minus the first rank's (µs)."""
    events, summary = merged_events(tables, findings, clock_offset_us)
    summary.path = str(out)
    offsets = {str(k): v for k, v in summary.clock_offset_us.items()}
    doc_head = json.dumps({"displayTimeUnit": "ms", "otherData": {
        "producer": "trainperf diagnose --perfetto", "clock_offset_us": offsets, "ranks": sorted(tables)}})[:-1]
    out = Path(out)
    with atomic_path(out) as tmp:
        gz = out.name.endswith(".gz")
        fh = gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) if gz else open(tmp, "w", encoding="utf-8")
        with fh:
            fh.write(doc_head + ', "traceEvents": [\n')
            fh.write(",\n".join(map(_dumps, events)))
            fh.write("\n]}\n")
    return summary


def merged_events(tables: dict[int, EventTable], findings: list,
                  clock_offset_us: dict) -> tuple[list[dict], PerfettoSummary]:
    """The events of the merged timeline (list of trace-event dicts) and their summary (path left empty)."""
    offsets = {r: float(clock_offset_us.get(r, clock_offset_us.get(str(r), 0.0)) or 0.0) for r in tables}
    starts = {r: times_us(t) for r, t in tables.items()}
    zero = min((float(s[0].min()) - offsets[r] for r, s in starts.items() if s[0].size), default=0.0)
    events: list[dict] = []
    n_launch = 0
    lanes: dict[int, _Lanes] = {}
    tids: dict[int, np.ndarray] = {}
    flow_ids = itertools.count(1)  # one id per arrow: a launch can have several device events (graphs)
    for r, t in sorted(tables.items()):
        ts, end = starts[r]
        shift = offsets[r] + zero
        tid = tids[r] = _thread_ids(t, r, ts, end)
        events += _metadata(t, r, tid)
        events += _slices(t, ts - shift, end - ts, tid)
        flows = _launch_flows(t, r, ts - shift, tid, flow_ids)
        n_launch += len(flows) // 2
        events += flows
        events += _memory_counters(t, r, ts, end, shift)
        lanes[r] = _Lanes(rank=r, first_us=float(ts.min()) - shift if ts.size else 0.0,
                          last_us=float(end.max()) - shift if end.size else 0.0)
    n_slices = n_flows = 0
    for f in findings:
        for r in f.ranks:
            if r not in tables:
                continue
            events.append(lanes[r].summary_slice(f))
            n_slices += 1
        for ev in f.evidence.get("events", []):
            r = _evidence_rank(f, ev, tables, starts)
            if r is None:
                continue
            t, (ts, end) = tables[r], starts[r]
            shift = offsets[r] + zero
            origin = float(ts.min())
            start = origin + float(ev["start_us"])
            sl = lanes[r].evidence_slice(f, ev, start - shift)
            events.append(sl)
            n_slices += 1
            row = _evidence_row(t, ev["name"], start, ts)
            if row < 0 and t.name_id(_evidence_name(ev["name"])) < 0:  # a described event ("all_reduce #3
                row = _device_row_at(t, start, ts)                     # (rank 1 arrived last)"): the kernel there
            if row >= 0:
                flow_id = next(flow_ids)
                events.append({"ph": "s", "id": flow_id, "pid": r, "tid": sl["tid"], "ts": sl["ts"],
                               "cat": FINDING_CAT, "name": f.kind})
                events.append({"ph": "f", "bp": "e", "id": flow_id, "pid": r, "tid": int(tids[r][row]),
                               "ts": round(float(ts[row] - shift), 3), "cat": FINDING_CAT, "name": f.kind})
                n_flows += 1
    for ln in lanes.values():
        events += ln.metadata()
    summary = PerfettoSummary(path="", n_events=len(events), n_finding_slices=n_slices, n_finding_flows=n_flows,
                              n_launch_flows=n_launch, clock_offset_us=offsets)
    return events, summary


def _memory_counters(t: EventTable, rank: int, ts: np.ndarray, end: np.ndarray, shift: float) -> list[dict]:
    """The allocator's samples (profile_memory=True) of each of the rank's accelerators inside its events' span, as
    one counter track a device ("device N memory (GiB)": allocated and reserved, Perfetto's "C" events)."""
    m = accelerator_samples(t)
    if not ts.size:
        return []
    at = m[:, 0] / 1e3
    keep = m[(at >= ts.min()) & (at <= end.max())]
    return [{"ph": "C", "name": f"device {int(dev)} memory (GiB)", "pid": rank, "tid": 0,
             "ts": round(float(ns) / 1e3 - shift, 3),
             "args": {"allocated": round(float(alloc) / GIB, 4), "reserved": round(float(res) / GIB, 4)}}
            for ns, _, dev, alloc, res in keep.tolist()]


def _thread_ids(t: EventTable, rank: int, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """New tid of every row: one per (original pid, tid), unique across ranks, host threads first; a slice
    that overlaps an enclosing one without ending inside it (two tracers on one thread, as JAX's Python
    tracer and its TraceMe annotations) goes to an overlap lane of its thread, LANE_TIDS further."""
    base = _base_thread_ids(t, rank)
    lane = np.zeros(len(t), dtype=np.int64)
    order = np.lexsort((-(end - ts), ts, base))
    stacks: dict = {}
    for i in order.tolist():
        k = 0
        while True:
            stack = stacks.setdefault((int(base[i]), k), [])
            while stack and stack[-1] <= ts[i]:
                stack.pop()
            if not stack or end[i] <= stack[-1]:
                stack.append(end[i])
                break
            k += 1
        lane[i] = k
    return base + LANE_TIDS * np.minimum(lane, MAX_LANES)


def _base_thread_ids(t: EventTable, rank: int) -> np.ndarray:
    """One tid per (original pid, tid), unique across ranks, host threads first."""
    key = t.pid.astype(np.int64) * (1 << 31) + t.tid.astype(np.int64)
    dev = t.stream >= 0
    order_key = np.where(dev, 1, 0)  # host threads before device streams
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    rank_of = np.lexsort((uniq, order_key[first]))
    pos = np.empty_like(rank_of)
    pos[rank_of] = np.arange(rank_of.size)
    return rank * TIDS_PER_RANK + 1 + pos[inv.reshape(-1)]


def _metadata(t: EventTable, rank: int, tid: np.ndarray) -> list[dict]:
    """process_name / thread_name / sort-index "M" events of one rank."""
    out = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
           {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
           {"ph": "M", "name": "process_labels", "pid": rank, "tid": 0, "args": {"labels": Path(t.source).name}}]
    if not len(t):
        return out
    _, first = np.unique(tid, return_index=True)
    for i in first:
        pid, otid, new = int(t.pid[i]), int(t.tid[i]), int(tid[i])
        if t.stream[i] >= 0:
            name = f"GPU {pid} stream {int(t.stream[i])}"
        else:
            name = t.thread_names.get((pid, otid)) or f"thread {otid}"
            name = f"{name} (pid {pid})"
        lane = (new - rank * TIDS_PER_RANK) // LANE_TIDS
        if lane:
            name += f" (overlapping slices {lane})"
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": new, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": new,
                    "args": {"sort_index": (new % LANE_TIDS) * 16 + lane}})
    return out


def _slices(t: EventTable, ts: np.ndarray, dur: np.ndarray, tid: np.ndarray) -> list[dict]:
    """One "X" slice per row (times µs, aligned), with the table's ids as args."""
    names, rank = t.names, t.rank
    cols = (t.kind.tolist(), t.name.tolist(), t.cat.tolist(), tid.tolist(), ts.tolist(), np.maximum(dur, 0).tolist(),
            t.correlation.tolist(), t.external_id.tolist(), t.stream.tolist(), t.nbytes.tolist(), t.collective.tolist(),
            t.process_group.tolist(), t.category.tolist(), t.step.tolist())
    out = []
    order = np.lexsort((-dur, ts))  # equal starts: the longer (enclosing) slice first, so slices nest
    cols = tuple([c[i] for i in order.tolist()] for c in cols)
    for kind, name, cat, td, s, d, corr, ext, stream, nb, coll, pg, category, step in zip(*cols):
        args = {"kind": KIND_NAMES[kind]}
        if corr >= 0:
            args["correlation"] = corr
        if ext >= 0:
            args["External id"] = ext
        if stream >= 0:
            args["stream"] = stream
        if nb >= 0:
            args["bytes"] = nb
        if coll >= 0:
            args["Collective name"] = names[coll]
        if pg >= 0:
            args["Process Group Name"] = names[pg]
        if category >= 0:
            args["category"] = CATEGORY_NAMES[category]
        if step >= 0:
            args["step"] = step
        out.append({"ph": "X", "name": names[name], "cat": names[cat] if cat >= 0 else KIND_NAMES[kind], "pid": rank,
                    "tid": td, "ts": round(s, 3), "dur": round(d, 3), "args": args})
    return out


def _launch_flows(t: EventTable, rank: int, ts: np.ndarray, tid: np.ndarray, ids) -> list[dict]:
    """Flow arrows from each launch (host runtime call) to its device event, as Kineto writes them."""
    link = correlated_host_row(t)
    dev = np.flatnonzero((link >= 0) & (t.stream >= 0))
    out = []
    for row in dev.tolist():
        host = int(link[row])
        fid = next(ids)
        out.append({"ph": "s", "id": fid, "pid": rank, "tid": int(tid[host]), "ts": round(float(ts[host]), 3),
                    "cat": LAUNCH_FLOW_CAT, "name": LAUNCH_FLOW_CAT})
        out.append({"ph": "f", "bp": "e", "id": fid, "pid": rank, "tid": int(tid[row]), "ts": round(float(ts[row]), 3),
                    "cat": LAUNCH_FLOW_CAT, "name": LAUNCH_FLOW_CAT})
    return out


def _evidence_name(name: str) -> str:
    return _COUNT_PREFIX.sub("", name)


def _evidence_row(t: EventTable, name: str, start_us: float, ts: np.ndarray) -> int:
    """Row of the traced event an evidence event names (same name, start within MATCH_TOLERANCE_US), else -1."""
    nid = t.name_id(_evidence_name(name))
    if nid < 0:
        return -1
    rows = np.flatnonzero(t.name == nid)
    if not rows.size:
        return -1
    gap = np.abs(ts[rows] - start_us)
    best = int(np.argmin(gap))
    return int(rows[best]) if gap[best] <= MATCH_TOLERANCE_US else -1


def _device_row_at(t: EventTable, start_us: float, ts: np.ndarray) -> int:
    """The device event (kernel, copy, memset) starting within MATCH_TOLERANCE_US of start_us, else -1."""
    lo = np.searchsorted(ts, start_us - MATCH_TOLERANCE_US, side="left")
    hi = np.searchsorted(ts, start_us + MATCH_TOLERANCE_US, side="right")
    rows = np.arange(lo, hi)
    rows = rows[np.isin(t.kind[rows], DEVICE_KINDS) & (t.stream[rows] >= 0)]
    if not rows.size:
        return -1
    return int(rows[np.argmin(np.abs(ts[rows] - start_us))])


def _evidence_rank(f, ev: dict, tables: dict[int, EventTable], starts: dict) -> int | None:
    """The rank whose timeline an evidence event is on: the finding's only rank; the rank where the named
    event is traced at that time; the rank the event's text names; else the finding's first rank."""
    ranks = [r for r in f.ranks if r in tables]
    if len(ranks) <= 1:
        return ranks[0] if ranks else None
    for r in ranks:
        ts = starts[r][0]
        if ts.size and _evidence_row(tables[r], ev["name"], float(ts.min()) + float(ev["start_us"]), ts) >= 0:
            return r
    m = _RANK_IN_TEXT.search(ev["name"])
    if m and int(m.group(1)) in ranks:
        return int(m.group(1))
    return ranks[0]


def _finding_args(f) -> dict:
    metrics = {k: f"{v['value']:g} {v['unit']}" for k, v in f.evidence.get("metrics", {}).items()}
    return {"kind": f.kind, "severity": f.severity, "confidence": f.confidence, "gain_pct": f.gain_pct,
            "gain_us": f.gain_us, "what_if": f.what_if, "recommendation": f.recommendation, "ranks": f.ranks,
            "steps": f.steps, **metrics}


@dataclass
class _Lanes:
    """The finding threads of one rank: per kind, lanes whose slices do not overlap."""

    rank: int
    first_us: float
    last_us: float
    busy: dict = field(default_factory=dict)   # (kind, lane) -> end of its last evidence slice (µs)
    tids: dict = field(default_factory=dict)   # (kind, lane) -> tid

    def _tid(self, kind: str, lane: int) -> int:
        key = (kind, lane)
        if key not in self.tids:
            self.tids[key] = (self.rank + 1) * TIDS_PER_RANK - 1 - len(self.tids)
        return self.tids[key]

    def summary_slice(self, f) -> dict:
        """The finding over the rank's whole trace, on lane 0 of its kind."""
        return {"ph": "X", "name": f"{f.kind} ({f.severity}, gain {f.gain_pct:g}%)", "cat": FINDING_CAT,
                "pid": self.rank, "tid": self._tid(f.kind, 0), "ts": round(self.first_us, 3),
                "dur": round(max(self.last_us - self.first_us, 0.0), 3), "args": _finding_args(f)}

    def evidence_slice(self, f, ev: dict, start_us: float) -> dict:
        """One evidence event at its (aligned) time, on the first lane of its kind it does not overlap.
        Lane 0 holds the summary slice, which encloses every evidence slice inside the rank's trace."""
        dur = max(float(ev.get("dur_us", 0.0)), 0.0)
        start = min(max(start_us, self.first_us), self.last_us)
        dur = min(dur, self.last_us - start)
        lane = 0
        while self.busy.get((f.kind, lane), -np.inf) > start:
            lane += 1
        self.busy[(f.kind, lane)] = start + dur
        return {"ph": "X", "name": f"{f.kind}: {ev['name']}", "cat": FINDING_CAT, "pid": self.rank,
                "tid": self._tid(f.kind, lane), "ts": round(start, 3), "dur": round(dur, 3),
                "args": {"finding": f.kind, "severity": f.severity, "gain_pct": f.gain_pct, "evidence": ev["name"],
                         "evidence_dur_us": ev.get("dur_us")}}

    def metadata(self) -> list[dict]:
        """thread_name events of the finding lanes (listed first in the rank's process)."""
        out = []
        for (kind, lane), tid in self.tids.items():
            name = f"finding: {kind}" + (f" ({lane + 1})" if lane else "")
            out.append({"ph": "M", "name": "thread_name", "pid": self.rank, "tid": tid, "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": self.rank, "tid": tid,
                        "args": {"sort_index": -TIDS_PER_RANK + len(out)}})
        return out
