"""JAX profiles (real files made by jax.profiler on JAX's CPU device, tests/trace/data/jax/README.md)
read into the event table, and the same analyses run on them.

References: the trace JSON that jax.profiler's own converter wrote from the same XSpace (our wire
reader of the .xplane.pb must give the same events, times and durations to the ns), and sums done
by hand with plain Python over that JSON.
"""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from trainperf.diagnose.api import diagnose
from trainperf.errors import TrainperfError
from trainperf.trace.events import CPU_OP, KERNEL, PYTHON, USER_ANNOTATION
from trainperf.trace.load import load_trace
from trainperf.trace.producers import producer_of, read_any
from trainperf.trace.xplane import read_jax_trace_json, read_xplane, trace_json_rows, xspace_rows

DATA = Path(__file__).parent / "data" / "jax"
XPLANE = DATA / "jax_cpu.xplane.pb"
TRACE_JSON = DATA / "jax_cpu.trace.json.gz"
PERFETTO_JSON = DATA / "perfetto_trace.json.gz"


def _raw_json() -> dict:
    return json.loads(gzip.decompress(TRACE_JSON.read_bytes()))


def test_xplane_wire_reader_matches_the_profilers_own_json():
    ours = sorted(xspace_rows(XPLANE.read_bytes()), key=lambda r: (r[4], r[2], r[6]))
    theirs = sorted(trace_json_rows(_raw_json()), key=lambda r: (r[4], r[2], r[6]))
    assert len(ours) == len(theirs) == 119
    for a, b in zip(ours, theirs):
        assert (a[0], a[2], a[4], a[5], a[6]) == (b[0], b[2], b[4], b[5], b[6])
    t, u = read_xplane(XPLANE), read_jax_trace_json(TRACE_JSON)
    assert t.names == u.names
    for c in ("ts_ns", "dur_ns", "kind", "step", "category"):
        assert np.array_equal(getattr(t, c), getattr(u, c)), c
    assert np.array_equal(t.stream >= 0, u.stream >= 0)  # thread ids differ: the JSON converter renumbers them


def test_event_kinds_and_steps_by_hand():
    raw = _raw_json()["traceEvents"]
    hlo = [e for e in raw if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    steps = sorted(int(e["args"]["step_num"]) for e in raw if e.get("ph") == "X" and "step_num" in e.get("args", {}))
    frames = [e for e in raw if e.get("ph") == "X" and e["name"].startswith("$")]
    t = read_xplane(XPLANE)
    assert int((t.kind == KERNEL).sum()) == len(hlo) == 16  # 4 HLO ops a step, 4 steps
    assert int((t.kind == PYTHON).sum()) == len(frames)
    step_rows = t.kind == USER_ANNOTATION
    assert sorted(t.names[int(n)] for n in t.name[step_rows]) == [f"ProfilerStep#{s}" for s in steps] == \
        [f"ProfilerStep#{s}" for s in range(4)]
    assert int((t.kind == CPU_OP).sum()) == 119 - 16 - len(frames) - 4
    # a device event takes its step from its launch; XLA on the CPU device records no launch, so none
    assert set(t.step[t.kind == KERNEL].tolist()) == {-1}


def test_every_jax_file_loads_through_load_trace():
    assert producer_of(XPLANE) == "jax-xplane"
    assert producer_of(TRACE_JSON) == producer_of(PERFETTO_JSON) == "jax-trace-json"
    tables = [load_trace(p)[0] for p in (XPLANE, TRACE_JSON, PERFETTO_JSON)]
    for t in tables[1:]:
        assert np.array_equal(t.ts_ns, tables[0].ts_ns) and t.names == tables[0].names
    assert tables[0].metadata["producer"] == "jax-xplane"


def test_diagnose_runs_the_same_analyses_on_a_jax_profile():
    # the device busy time is the union of the HLO ops that start before the last step (HTA's window),
    # summed by hand from the profiler's JSON
    raw = _raw_json()["traceEvents"]
    last_step = max(e["ts"] for e in raw if e.get("ph") == "X" and "step_num" in e.get("args", {}))
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw
                   if e.get("ph") == "X" and "hlo_op" in e.get("args", {}) and e["ts"] < last_step)
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            busy += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    d = diagnose(XPLANE)
    r = d.ranks[0]
    assert r.gpu_analyses == "ok" and r.steps == [0, 1, 2]
    assert r.window_us == pytest.approx(spans[-1][1] - spans[0][0], abs=1e-3)
    assert r.window_us * (100 - r.idle_pct) / 100 == pytest.approx(busy, abs=1e-3)
    # XLA links no host launch to its device ops: the evidence says launch overhead cannot be measured, and does
    # not call the trace truncated (it is whole: every step's ops are in it)
    assert any("no GPU event is linked to a host launch" in n for n in d.notes)
    assert not any("truncated" in n for n in d.notes)


def test_bad_xplane_is_one_line_error(tmp_path):
    p = tmp_path / "broken.xplane.pb"
    p.write_bytes(XPLANE.read_bytes()[:5000])
    with pytest.raises(TrainperfError, match="broken.xplane.pb"):
        read_any(p)


def test_folder_of_hosts_named_by_rank(tmp_path):
    # JAX records no process index: one .xplane.pb per host, the rank in its file name
    for r in (0, 1):
        (tmp_path / f"rank{r}.xplane.pb").write_bytes(XPLANE.read_bytes())
    tables = load_trace(tmp_path)
    assert sorted(tables) == [0, 1] and len(tables[1]) == 119


def test_events_agree_with_xprofs_trace_viewer():
    # xprof's converter names a step "train <n>" and adds 4 derived "ThreadpoolListener::Region" spans;
    # every one of our events is in its output with the same start and duration (to 1 ns)
    doc = json.loads(gzip.decompress((DATA / "jax_cpu.xprof_trace_viewer.json.gz").read_bytes()))
    theirs = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            theirs.setdefault(e["name"], []).append((round(e["ts"] * 1000), round(e["dur"] * 1000)))
    t = read_xplane(XPLANE)  # both keep the XSpace's own time base
    for i in range(len(t)):
        name = t.names[int(t.name[i])]
        if name.startswith("ProfilerStep#"):
            name = "train " + name.split("#")[1]
        hits = theirs.get(name, [])
        assert any(abs(s - int(t.ts_ns[i])) <= 1 and abs(d - int(t.dur_ns[i])) <= 1 for s, d in hits), name


def test_jax_collectives_get_message_sizes_and_bus_bandwidth():
    # 4 JAX CPU devices, 2 steps of five collectives (data/jax/README.md); sizes by hand in test_hlo.py.
    # Reference: NCCL's busbw = S / duration x factor(n = 4), recomputed here from the kernels' own durations
    from trainperf.diagnose.collectives import bus_factor, collective_stats, comm_args
    from trainperf.trace.events import COMMUNICATION

    t = read_xplane(DATA / "jax_collectives.xplane.pb")
    sizes = {"all_reduce": 65536, "all_gather": 32768, "reduce_scatter": 65536, "all_to_all": 65536,
             "send_recv": 8192}
    comm = np.flatnonzero(t.category == COMMUNICATION)
    names = {t.name_of(r) for r in comm}
    assert names == {"psum_invariant.7", "all_gather.3", "reduce_scatter.7", "all-to-all", "ppermute.3"}
    assert comm.size == 4 * 2 * 5 and len(set(t.correlation[comm])) == comm.size  # own ids, one each
    assert len(comm_args(t)) == comm.size
    stats = {g.kind: g for g in collective_stats({0: t})}
    assert set(stats) == set(sizes)
    for kind, s in stats.items():
        rows = [r for r in comm if t.names[int(t.collective[r])] == kind]
        busbw = [sizes[kind] / (t.dur_ns[r] / 1e3 * 1e3) * bus_factor(kind, 4) for r in rows]
        assert s.count == 8 and s.bytes_median == sizes[kind]
        assert s.busbw_gbps_median == pytest.approx(float(np.median(busbw)), rel=1e-9), kind
    # a collective is priced against its link, not as an operator on the roofline
    from trainperf.diagnose.roofline import roofline

    assert not {r.op for r in roofline(t)} & {t.name_of(r) for r in comm}


def test_collective_with_unknown_group_keeps_no_size():
    # an all-reduce over empty replica groups (every device: a count the HLO does not hold) and a
    # collective-permute (bus factor 1 whatever the group): the first is communication without a size
    from trainperf.diagnose.collectives import comm_args
    from trainperf.trace.events import COMMUNICATION
    from trainperf.trace.hlo import CollectiveSize, HloCost
    from trainperf.trace.xplane import table_from_rows

    def cost(kind, group):
        return HloCost(flops=0.0, bytes=0.0, precision="fp32", shapes="f32[8] -> f32[8]",
                       collective=CollectiveSize(kind=kind, in_bytes=32, out_bytes=32, group_size=group,
                                                 dtype="Float"))

    costs = {("m", "all-reduce.1"): cost("all_reduce", 0), ("m", "collective-permute.2"): cost("send_recv", 0)}
    rows = [("/host:CPU", 1, "tf_XLACpu/1", 7, 1000 * i, 500, op, {"hlo_op": op, "hlo_module": "m"})
            for i, op in enumerate(["all-reduce.1", "collective-permute.2"])]
    t = table_from_rows(rows, "hand", "jax-xplane", 0, costs)
    assert (t.category[t.kind == KERNEL] == COMMUNICATION).all()
    sizes = comm_args(t)
    assert [a.nbytes for a in sizes.values()] == [32]  # the permute only
    assert t.name_of(int(np.flatnonzero(t.correlation == next(iter(sizes)))[0])) == "collective-permute.2"
