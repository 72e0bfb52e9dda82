"""`trainperf diff`: step decomposition worked out by hand, and pairs built from real traces by
editing them here (a kernel inserted, a host stall injected) with the expected change known."""

import copy
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

from trainperf.diagnose.diff import diff, median_interval, rank_breakdown  # noqa: E402
from trainperf.trace import read_kineto  # noqa: E402

HTA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces" / "hta"


def _hand_trace(gemm_us: float = 30.0) -> TraceBuilder:
    """Two kept steps (the third, last one, is cut short: 10 µs, dropped). Times in µs; see the test."""
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.step(2, 100, 100)
    b.step(3, 200, 10)
    b.launch("ampere_sgemm_128x64_tn", 5, 10, gemm_us)
    b.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 6, 30, 30, stream=20)
    b.launch("void at::native::vectorized_elementwise_kernel<4>", 7, 62, 3, stream=9)
    b.launch("Memcpy DtoH (Device -> Pageable)", 66, 70, 30, cat="gpu_memcpy", runtime="cudaMemcpyAsync")
    b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 30, cat="user_annotation")
    b.launch("void at::native::vectorized_elementwise_kernel<4>", 135, 140, 10)
    b.cpu("cudaStreamSynchronize", 136, 16, cat="cuda_runtime")
    b.launch("ampere_sgemm_64x64_nn", 170, 180, 10)
    b.launch("ampere_sgemm_64x64_nn", 201, 202, 3)
    return b


def test_step_buckets_by_hand(tmp_path):
    # Launches at 5, 6, 7, 66, 135, 170, 201. An idle gap [g, S) ends when an op starts at S. If that op
    # was launched before g, the device idled with work queued: kernel gaps under 30 µs, else other
    # (test_queued_gaps_by_hand). Else the gap waits on the host's
    # launch L: it is charged to what the host did since its previous launch L' - DataLoader, then
    # allocator, then sync, each up to its host time in (L', L) - and the rest to host.
    # step 1 [0,100): gemm [10,40) 30; allreduce [30,60) exposed after the gemm: [40,60) 20; [60,62)
    #   kernel gaps (the elementwise kernel was launched at 7); elementwise [62,65) 3; [65,70) host
    #   (memcpy launched at 66 > 65); memcpy [70,100) 30; [0,10) host. host 15, kernel gaps 2. Sum 100.
    # step 2 [100,200): gap [100,140) (L'=66, L=135): DataLoader 30 of (66,135) -> DataLoader 30, host 10;
    #   elementwise 10; gap [150,180) (L'=135, L=170): cudaStreamSynchronize 16 -> sync 16, host 14;
    #   gemm 10; [190,200) host 10 (nothing in (170,201)). host 34. Sum 100.
    t = read_kineto(_hand_trace().write(tmp_path / "t.json.gz"))
    steps, span, parts = rank_breakdown(t)
    assert list(steps) == [1, 2] and list(span) == [100, 100]
    want = {"compute: gemm": [30, 10], "communication": [20, 0], "memcpy DtoH (Device -> Pageable)": [30, 0],
            "idle: host": [15, 34], "idle: kernel gaps": [2, 0], "idle: dataloader": [0, 30], "idle: sync": [0, 16],
            "compute: elementwise": [3, 10]}
    got = {k: list(np.round(v, 6)) for k, v in parts.items() if v.any()}
    assert got == want


def test_work_launched_before_the_trace_is_no_steps_work(tmp_path):
    # A GPU-bound loop profiled after its warm-up: the host runs ahead, so as the trace opens the device still runs
    # a warm-up step's 100-us GEMM (launched before the trace: a correlation id below every recorded launch, no launch
    # of its own), [0, 100). Steps 1-3 start on the host at 0, 5, 10 and each launches one 100-us GEMM, which runs
    # after the one before: [100, 200), [200, 300), [300, 400). Step 1 starts when the device is done with the
    # warm-up's work (100), not at its host span (0): each step then holds its own GEMM, 100 us, as steps 2 and 3.
    b = TraceBuilder()
    b._corr = 10
    b.events.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": 0.0,
                     "dur": 100.0, "args": {"correlation": 3, "stream": 7, "device": 0}})
    for n in range(3):
        b.step(n + 1, 5.0 * n, 5.0)
        b.launch("ampere_sgemm_128x64_tn", 5.0 * n + 1, 100.0 * (n + 1), 100.0)
    b.step(4, 15.0, 1.0)  # the last step, cut short by the profiler (dropped)
    t = read_kineto(b.write(tmp_path / "t.json.gz"))
    steps, span, parts = rank_breakdown(t)
    assert list(steps) == [1, 2, 3] and list(span) == [100.0, 100.0, 100.0]
    assert list(parts["compute: gemm"]) == [100.0, 100.0, 100.0]


def test_queued_gaps_by_hand(tmp_path):
    # one step [0,200): gemm k1 [0,10); k2 launched at 1 starts at 15 -> 5 µs gap with work queued:
    # kernel gaps; k3 launched at 2 starts at 105 -> 85 µs: other; [110,200) nothing launched: host.
    b = TraceBuilder()
    b.step(1, 0, 200)
    b.launch("ampere_sgemm_128x64_tn", 0.5, 1, 9)
    b.launch("ampere_sgemm_128x64_tn", 1, 15, 5)
    b.launch("ampere_sgemm_128x64_tn", 2, 105, 5)
    t = read_kineto(b.write(tmp_path / "q.json.gz"))
    _, _, parts = rank_breakdown(t)
    got = {k: list(np.round(v, 6)) for k, v in parts.items() if v.any()}
    assert got == {"compute: gemm": [19], "idle: kernel gaps": [5], "idle: other": [85], "idle: host": [91]}


def test_diff_by_hand(tmp_path):
    # candidate: the step-1 gemm takes 50 µs instead of 30, everything else equal. Step 1 [0,100):
    # gemm [10,60) 50, allreduce [30,60) now hidden under it -> comm 0; the other buckets do not move.
    # Mean step time does not change (host spans are fixed), so the gemm's +20 µs is paid by the
    # allreduce's -20 µs: per step (mean of 2 steps) gemm +10, communication -10.
    a = _hand_trace().write(tmp_path / "a.json.gz")
    b = _hand_trace(gemm_us=50.0).write(tmp_path / "b.json.gz")
    d = diff(a, b)
    dec = {n: c - x for n, x, c in d.decomposition}
    assert dec["compute: gemm"] == pytest.approx(10) and dec["communication"] == pytest.approx(-10)
    assert d.delta_mean_us == 0
    k = {c.name: c for c in d.kernels}["ampere_sgemm_128x64_tn"]
    assert (k.baseline_us, k.candidate_us, k.count_baseline_per_step) == (15, 25, 0.5)
    j = d.to_json()
    assert j["explained_pct"] == 100 and j["new"] == [] and j["gone"] == []
    assert {"name", "category", "delta_us_per_step", "count_baseline_per_step",
            "count_candidate_per_step"} <= set(j["contributions"][0])


def _comm_wait_trace(serialised: bool, wait_us: float = 72.0, collective: bool = True) -> TraceBuilder:
    """One step. An all-reduce on stream 20 (launched at 1) and GEMM A on stream 7 (launched at 2); GEMM B
    (launched at 3, stream 7) waits for the all-reduce (a stream wait event). Times in µs, see the tests.
    Not serialised: all-reduce [10,110) beside A [10,40); B ready at 40 (A done), starts at 112, 2 µs
    after the all-reduce ends. Serialised: all-reduce [10,110), then A [110,140), then B after `wait_us`
    with nothing running (a wait the trace does not explain). collective=False: the stream-20 op is an
    elementwise kernel instead: B's wait in the other trace is no collective's."""
    b = TraceBuilder()
    name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL" if collective else "void at::native::vectorized_elementwise_kernel<4>"
    b.launch(name, 1, 10, 100, stream=20)
    if serialised:
        b.launch("ampere_sgemm_128x64_tn", 2, 110, 30)
        b.launch("ampere_sgemm_64x64_nn", 3, 140 + wait_us, 30)
        b.step(1, 0, 170 + wait_us)
    else:
        b.launch("ampere_sgemm_128x64_tn", 2, 10, 30)
        b.launch("ampere_sgemm_64x64_nn", 3, 112, 30)
        b.step(1, 0, 142)
    return b


def test_comm_wait_inferred_from_the_other_side(tmp_path):
    # Baseline (not serialised): [0,10) host (A launched at 2 > the step start 0: the device waits on the
    # launch), [10,40) gemm (the all-reduce under it), [40,110) communication 70, [110,112) kernel gaps 2 (B
    # queued, < 30 µs), [112,142) gemm 30: 142. Candidate (serialised, B waits 72): [0,10) host, [10,110)
    # communication 100, [110,140) gemm, [140,212) B queued with nothing running: 72 of "idle: other" on its
    # own, [212,242) gemm: 242. B's wait in the baseline ran from its ready time 40 to 112 (72 µs), and the
    # all-reduce ran 70 of them: B waits on the all-reduce, and 70/72 of the candidate's gap (up to 72 µs)
    # is that wait: idle: communication 70, idle: other 2. Delta +100 = communication +30, idle: communication
    # +70, kernel gaps -2, other +2 -> explained (100 - 2) / 100 = 98 %.
    a = _comm_wait_trace(False).write(tmp_path / "a.json.gz")
    b = _comm_wait_trace(True).write(tmp_path / "b.json.gz")
    _, _, alone = rank_breakdown(read_kineto(b))
    assert alone["idle: other"][0] == pytest.approx(72)  # the candidate by itself cannot say what B waited on
    d = diff(a, b)
    dec = {n: round(c - x, 6) for n, x, c in d.decomposition if round(c - x, 6)}
    assert d.delta_mean_us == pytest.approx(100)
    assert dec == {"communication": 30, "idle: communication": pytest.approx(70), "idle: kernel gaps": -2,
                   "idle: other": pytest.approx(2)}
    assert d.explained_pct == pytest.approx(98)
    assert "idle: communication" in d.headline()
    # the same diff the other way round: every bucket's change negated
    back = {n: round(c - x, 6) for n, x, c in diff(b, a).decomposition if round(c - x, 6)}
    assert back == {n: pytest.approx(-v) for n, v in dec.items()}


def test_comm_wait_inference_keeps_what_it_cannot_show(tmp_path):
    # B waits 100 µs in the candidate, 72 in the baseline: only the baseline's 72 µs wait is the same
    # dependency, 70/72 of it a collective's -> idle: communication 70 of the 100, idle: other 30.
    a = _comm_wait_trace(False).write(tmp_path / "a.json.gz")
    b = _comm_wait_trace(True, wait_us=100).write(tmp_path / "b.json.gz")
    br = {n: c for n, x, c in diff(a, b).decomposition}
    assert br["idle: communication"] == pytest.approx(70) and br["idle: other"] == pytest.approx(30)
    # the op B waited on in the baseline is an elementwise kernel, no collective: nothing moves
    a = _comm_wait_trace(False, collective=False).write(tmp_path / "a2.json.gz")
    b = _comm_wait_trace(True, collective=False).write(tmp_path / "b2.json.gz")
    br = {n: c for n, x, c in diff(a, b).decomposition}
    assert "idle: communication" not in br and br["idle: other"] == pytest.approx(72)


def test_headline_says_when_median_and_mean_disagree():
    # 3 steps each: baseline 100 µs, candidate 50, 110, 110 -> median +10 µs (+10 %), mean -10 µs
    from trainperf.diagnose.diff import StepProfile, diff_profiles

    def side(times):
        t = np.array(times, dtype=float)
        return StepProfile(source="x", ranks=[0], steps=[1, 2, 3], step_times_us=t,
                           breakdown_us={"compute: gemm": float(t.mean())}, kernels={}, operators={})

    h = diff_profiles(side([100, 100, 100]), side([50, 110, 110])).headline()
    assert h.startswith("candidate 10.0% slower per step (median 100") and "mean -10" in h


def test_median_interval_order_statistics():
    # n = 20: the 95% interval of the median is (x_(6), x_(15)) (binomial table, e.g. Conover 1999 Table A3)
    x = np.arange(1, 21, dtype=float)
    assert median_interval(x) == (6.0, 15.0)
    assert median_interval(np.array([3.0, 1.0, 2.0])) == (1.0, 3.0)  # too few for 95%: min-max


# ---- pairs built from real traces ---------------------------------------------------------------

def _load(path: Path) -> dict:
    return json.loads(gzip.open(path).read())


def _write(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def _is_device(e: dict) -> bool:
    return e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")


def _steps(doc: dict) -> list[dict]:
    return sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(
        "ProfilerStep#")), key=lambda e: e["ts"])


def _shift_after(doc: dict, p: float, d: float, device_from: dict | None = None) -> None:
    """Stall at time p for d µs: host events from p on move by d, host spans across p grow by d.
    Device events move by d when device_from says so (by id) or, without it, when they start >= p."""
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        if _is_device(e):
            move = device_from[id(e)] if device_from is not None else e["ts"] >= p
            if move:
                e["ts"] += d
        elif e["ts"] >= p:
            e["ts"] += d
        elif e["ts"] + e.get("dur", 0) > p:
            e["dur"] += d


def _insert_gemm(doc: dict, d: float, name: str) -> int:
    """In every step, a new GEMM kernel of d µs at the start of the step's first GEMM kernel that
    runs alone on the device: everything from there on moves by d. Returns how many were inserted."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    dev = sorted((e for e in ev if _is_device(e)), key=lambda e: e["ts"])
    steps = _steps(doc)
    corr = 10**9
    done = 0
    for s in steps:
        s = next(x for x in _steps(doc) if x["name"] == s["name"])  # as moved by the insertions so far
        for k in dev:
            if not (s["ts"] <= k["ts"] < s["ts"] + s["dur"] and "gemm" in k["name"].lower()):
                continue
            p = k["ts"]
            if any(o is not k and o["ts"] < p < o["ts"] + o["dur"] for o in dev):
                continue  # another device event runs across p: not alone
            _shift_after(doc, p, d)
            corr += 1
            launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                      "ts": p - 2, "dur": 1, "args": {"correlation": corr}}
            doc["traceEvents"] += [launch, {"ph": "X", "cat": "kernel", "name": name, "pid": k["pid"],
                                            "tid": k["tid"], "ts": p, "dur": d,
                                            "args": {"correlation": corr, "stream": k["args"]["stream"],
                                                     "device": k["args"].get("device", 0)}}]
            done += 1
            break
    return done


def _inject_stall(doc: dict, d: float, name: str) -> int:
    """In every step, a DataLoader span of d µs before its first operator: the host stalls there. Device
    work launched before the stall keeps its time, work launched after it moves by d (via correlation)."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    host = sorted((e for e in ev if not _is_device(e) and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    n = 0
    for step_name in [x["name"] for x in _steps(doc)]:
        s = next(x for x in _steps(doc) if x["name"] == step_name)  # as moved by the stalls so far
        launch_ts = {e["args"]["correlation"]: e["ts"] for e in ev if not _is_device(e)  # as moved so far
                     and "correlation" in e.get("args", {}) and e.get("cat") in ("cuda_runtime", "cuda_driver")}
        p = next(e["ts"] for e in host if e["ts"] > s["ts"])  # the step's first operator: no call is cut
        moves = {id(e): launch_ts.get(e.get("args", {}).get("correlation"), e["ts"]) >= p for e in ev if _is_device(e)}
        _shift_after(doc, p, d, moves)
        doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": name, "pid": s["pid"],
                                   "tid": s["tid"], "ts": p, "dur": d, "args": {}})
        n += 1
    return n


def _need(folder: str) -> Path:
    p = HTA / folder
    if not p.exists():
        pytest.skip(f"{p} absent (../shared/data not mounted)")
    return p


def test_pair_inserted_gemm_two_ranks(tmp_path):
    # trace_filter: 2 ranks of an A100 job, 2 steps. Candidate: a 5 ms GEMM kernel inserted in each step
    # of each rank, at a moment the device runs only that step's first GEMM: every step grows 5 ms.
    src = _need("trace_filter")
    d_us = 5000.0
    for f in sorted(src.glob("*.json.gz")):
        doc = _load(f)
        _write(doc, tmp_path / "base" / f.name)
        assert _insert_gemm(doc, d_us, "sm80_xmma_gemm_injected_kernel") == 2
        _write(doc, tmp_path / "cand" / f.name)
    d = diff(tmp_path / "base", tmp_path / "cand")
    assert d.delta_mean_us == pytest.approx(d_us, abs=1e-6)
    dec = {n: c - b for n, b, c in d.decomposition}
    assert dec["compute: gemm"] == pytest.approx(d_us, rel=0.02)
    assert d.explained_pct >= 90
    new = [c.name for c in d.new]
    assert new == ["sm80_xmma_gemm_injected_kernel"]
    k = d.kernels[0]
    assert k.name == new[0] and k.count_candidate_per_step == 1 and k.delta_us_per_step == pytest.approx(d_us)
    assert "compute: gemm" in d.headline() and "injected" in d.headline()


def test_pair_host_stall(tmp_path):
    # rank 0 of 2, A100, 3 profiler steps: a 20 ms DataLoader stall at the start of each step. Step
    # time +20 ms; the device drains what was queued, then idles on the DataLoader.
    src = _need("nccl_parser_config") / "nccl_data.json.gz"
    doc = _load(src)
    base = _write(copy.deepcopy(doc), tmp_path / "base.json.gz")
    assert _inject_stall(doc, 20000.0, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__") == 3
    cand = _write(doc, tmp_path / "cand.json.gz")
    d = diff(base, cand)
    assert d.delta_mean_us == pytest.approx(20000.0, abs=1e-6)
    assert d.delta_median_us == pytest.approx(20000.0, abs=1e-6)
    dec = {n: c - b for n, b, c in d.decomposition}
    assert d.decomposition[0][0] == "idle: dataloader" and dec["idle: dataloader"] > 0.9 * 20000
    assert d.explained_pct >= 90
    assert [c.name for c in d.new] == ["enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"]
    assert "idle: dataloader" in d.headline()
    assert d.to_json()["step_time_delta_pct"] == pytest.approx(100 * 20000 / d.baseline.median_us, rel=1e-3)


def test_cli_diff_json_and_html(tmp_path):
    from typer.testing import CliRunner

    from trainperf.cli import app

    a = _hand_trace().write(tmp_path / "a.json.gz")
    b = _hand_trace(gemm_us=50.0).write(tmp_path / "b.json.gz")
    r = CliRunner().invoke(app, ["diff", str(a), str(b), "--json", str(tmp_path / "d.json"),
                                 "--html", str(tmp_path / "d.html")])
    assert r.exit_code == 0, r.output
    assert "where the change went" in r.output
    j = json.loads((tmp_path / "d.json").read_text())
    assert j["baseline"]["step_time_us"] == 100 and j["candidate"]["step_time_us"] == 100
    assert "compute: gemm" in (tmp_path / "d.html").read_text()
    r = CliRunner().invoke(app, ["diff", str(a), str(tmp_path / "missing")])
    assert "no such file or folder" in str(r.exception)  # main() prints it on one line, exit code 2


def test_findings_that_appear_or_disappear(tmp_path):
    # the hand-built trace without and with its DataLoader fetch: the diagnoses of both sides compared
    # by kind (reference: trainperf diagnose's own findings on each side)
    from trainperf.diagnose.api import diagnose

    b = _hand_trace()
    b.events = [e for e in b.events if "DataLoader" not in e["name"]]
    base = b.write(tmp_path / "base.json.gz")
    cand = _hand_trace().write(tmp_path / "cand.json.gz")
    d = diff(base, cand, findings=True)
    a = {f.kind for f in diagnose(base, top=10_000).findings}
    b = {f.kind for f in diagnose(cand, top=10_000).findings}
    assert "data_loader_stall" in b - a
    got = {f.kind: f.change for f in d.findings}
    assert {k for k, c in got.items() if c == "appeared"} == b - a
    assert {k for k, c in got.items() if c == "disappeared"} == a - b
    assert d.to_json()["findings"][0]["kind"]


def test_host_only_steps_split_by_host_activity(tmp_path):
    # CPU training (no device events): step 1 [0,100) holds a DataLoader fetch [0,30) and an
    # optimizer step [70,95); step 2 [100,200) an optimizer step [150,190) -> per step: dataloader
    # 30 / 0, optimizer 25 / 40, other 45 / 60. Step 3 (5 µs) is cut short.
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.step(2, 100, 100)
    b.step(3, 200, 5)
    b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 30, cat="user_annotation")
    b.cpu("Optimizer.step#AdamW.step", 70, 25, cat="user_annotation")
    b.cpu("Optimizer.step#AdamW.step", 150, 40, cat="user_annotation")
    b.cpu("aten::mm", 40, 20)
    t = read_kineto(b.write(tmp_path / "t.json.gz"))
    steps, span, parts = rank_breakdown(t)
    got = {k: list(np.round(v, 6)) for k, v in parts.items() if v.any()}
    assert got == {"host: dataloader": [30, 0], "host: optimizer": [25, 40], "host: other": [45, 60]}


def test_host_only_communication_wait(tmp_path):
    # CPU training over gloo, one step [0,100) on the loop thread (tid 1): DDP forward [0,60) holds aten::mm
    # [0,20), the c10d::broadcast_ call [20,21), then blocks while gloo's worker (tid 2) broadcasts [21,50),
    # then aten::mm [50,60); backward's aten::mm [60,80) runs beside a gloo all-reduce [60,90) (overlapped),
    # then the loop waits for it [80,90); [90,100) nothing. Communication: [20,21) + [21,50) + [80,90) = 40;
    # other: the loop's own work and the rest, 20 + 10 + 20 + 10 = 60. Step 2 (5 µs) is cut short.
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.step(2, 100, 5)
    b.cpu("DistributedDataParallel.forward", 0, 60, cat="user_annotation")
    b.cpu("aten::mm", 0, 20)
    b.cpu("c10d::broadcast_", 20, 1)
    b.cpu("gloo:broadcast", 21, 29, cat="user_annotation", tid=2)
    b.cpu("aten::mm", 50, 10)
    b.cpu("aten::mm", 60, 20)
    b.cpu("gloo:all_reduce", 60, 30, cat="user_annotation", tid=2)
    t = read_kineto(b.write(tmp_path / "t.json.gz"))
    _, span, parts = rank_breakdown(t)
    got = {k: list(np.round(v, 6)) for k, v in parts.items() if v.any()}
    assert list(span) == [100] and got == {"host: communication": [40], "host: other": [60]}


def test_step_is_the_slowest_ranks(tmp_path):
    # two ranks, one step each: [0,5) idle: host (the GEMM is launched at 1), the GEMM [5,T-5), [T-5,T) idle:
    # host. Baseline T = 100 on both; candidate: rank 1's GEMM is 30 µs longer (T = 130). The job steps at
    # its slowest rank's pace: candidate step 130; rank 0 idles 30 waiting for rank 1. Per rank and step:
    # gemm (90 + 120) / 2 = 105 (+15), idle: slower rank (30 + 0) / 2 = 15 (+15): +30 in all.
    def side(folder, t1):
        for rank, t in ((0, 100), (1, t1)):
            b = TraceBuilder(rank=rank, world_size=2)
            b.step(1, 0, t)
            b.launch("ampere_sgemm_128x64_tn", 1, 5, t - 10)
            (tmp_path / folder).mkdir(exist_ok=True)
            b.write(tmp_path / folder / f"rank{rank}.json.gz")
        return tmp_path / folder

    d = diff(side("a", 100), side("b", 130))
    assert list(d.baseline.step_times_us) == [100] and list(d.candidate.step_times_us) == [130]
    dec = {n: round(c - x, 6) for n, x, c in d.decomposition if round(c - x, 6)}
    assert dec == {"compute: gemm": 15, "idle: slower rank": 15} and d.explained_pct == 100
