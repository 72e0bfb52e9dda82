"""What the window and the steps say (issue 9, "insufficient evidence is a result"): one step finder for the window,
the per-step figures and the notes; a trace without ProfilerStep still diagnosed over the whole trace, with lowered
confidence and the step finder's note in the terminal, the JSON and the HTML; no false zeros.

References: hand-worked figures of traces built in the format PyTorch's profiler writes (tests/trace/kineto_builder),
HTA's real traces read as raw JSON by the corpus's own reader (trainperf.corpus.kineto: plain json, independent of
trainperf.trace and diagnose), and a trace PyTorch's profiler writes here (CPU, with_stack=True).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from trainperf.corpus import kineto as K
from trainperf.diagnose.api import diagnose
from trainperf.diagnose.facts import collect_facts
from trainperf.diagnose.render import print_summary
from trainperf.diagnose.window import analysis_window
from trainperf.report.diagnose import write_report
from trainperf.trace.load import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402

HTA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"
needs_hta = pytest.mark.skipif(not HTA.is_dir(), reason="../shared/data/traces/hta not present")
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _iterations(b: TraceBuilder, n: int = 4, steps: bool = False) -> TraceBuilder:
    """n iterations of 2000 µs: a 1500-µs DataLoader fetch, 5 launches of 100-µs GEMMs, then Optimizer.step."""
    for s in range(n):
        T = 2000.0 * s
        if steps:
            b.step(s, T, 2000)
        b.cpu(DL, T, 1500, cat="user_annotation")
        for i in range(5):
            b.launch("ampere_sgemm_128x64_tn", T + 1500 + 10 * i, T + 1510 + 100 * i, 100)
        b.cpu("Optimizer.step#SGD.step", T + 1560, 20, cat="user_annotation")
    return b


def _terminal(d) -> str:
    buf = io.StringIO()
    print_summary(d, Console(file=buf, width=400, color_system=None), top=10)
    return buf.getvalue()


def _one(path: Path):
    return next(iter(load_trace(path).values()))


def test_the_step_finders_note_reaches_terminal_json_and_html(tmp_path):
    d = diagnose(_iterations(TraceBuilder()).write(tmp_path / "t.json.gz"))
    why = "4 Optimizer.step annotations suggest 4 iterations"  # 4 built by hand
    r = d.ranks[0]
    assert r.steps == [] and r.step_times == [] and r.step_time_median_us is None and r.confidence == "medium"
    assert d.findings and all(f.confidence != "high" and any(why in n for n in f.notes) for f in d.findings)
    assert any(n.startswith("rank 0: no complete profiler step") and why in n for n in d.notes)
    doc = json.loads(json.dumps(d.to_json()))
    assert any(why in n for n in doc["notes"]) and any(why in n for n in doc["ranks"][0]["evidence_notes"])
    assert all(any(why in n for n in f["notes"]) for f in doc["findings"])
    assert doc["ranks"][0]["step_time_median_us"] is None and doc["ranks"][0]["gpu_lag_median_us"] is None
    out = _terminal(d)
    assert why in out and "of the traced time" in out and "of step time" not in out
    html = write_report(d, tmp_path / "r.html").read_text()
    assert why in html and "of the traced time" in html


def test_findings_over_the_whole_trace_without_steps(tmp_path):
    """The same job with and without ProfilerStep: without, the window is the whole trace (its first kernel start
    to its last kernel end, by hand: 1510 .. 6000 + 1510 + 400 + 100 µs) and the DataLoader is still the finding."""
    plain = diagnose(_iterations(TraceBuilder()).write(tmp_path / "n.json.gz"))
    stepped = diagnose(_iterations(TraceBuilder(), steps=True).write(tmp_path / "s.json.gz"))
    assert plain.ranks[0].window_us == pytest.approx(6000 + 1510 + 500 - 1510)
    assert stepped.ranks[0].steps == [0, 1, 2] and stepped.ranks[0].step_time_median_us == pytest.approx(2000)
    assert plain.findings[0].kind == stepped.findings[0].kind == "data_loader_stall"
    assert stepped.findings[0].confidence == "high" and plain.findings[0].confidence == "medium"


def test_without_steps_the_first_fetch_before_the_first_launch_is_priced_too(tmp_path):
    """Each of the 4 iterations waits 1500 us for the DataLoader before its launches, the GPU idle: removing the
    waits gives back all 4 (by hand: 4 x 1500 us), the first one too, which comes before any launch (the replay
    once started at the first launch and priced 3)."""
    f = diagnose(_iterations(TraceBuilder()).write(tmp_path / "n.json.gz")).findings[0]
    assert f.kind == "data_loader_stall" and f.gain_us == pytest.approx(4 * 1500.0)


def _behind_earlier_work(path: Path, steps: bool, closing_sync: bool = False) -> Path:
    """4 iterations of 2000 us (a 1500-us DataLoader fetch, then 5 launches of 100-us GEMMs), profiled from a moment
    the GPU still had 6000 us of earlier work queued (a kernel whose launch came before the trace: correlation id 0,
    no launch call); every GEMM queues behind it and behind the one before. closing_sync: a cudaDeviceSynchronize
    at 8000 us waits for the last GEMM (as before the profiler stops)."""
    b = TraceBuilder()
    b.events.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": 0.0,
                     "dur": 6000.0, "args": {"correlation": 0, "stream": 7, "device": 0}})
    free = 6000.0
    for s in range(4):
        T = 2000.0 * s
        if steps:
            b.step(s, T, 2000)
        b.cpu(DL, T, 1500, cat="user_annotation")
        for i in range(5):
            start = max(T + 1510 + 10 * i, free)
            b.launch("ampere_sgemm_128x64_tn", T + 1500 + 10 * i, start, 100)
            free = start + 100
    if closing_sync:
        b.cpu("cudaDeviceSynchronize", 8000, free + 5 - 8000, cat="cuda_runtime")
    return b.write(path)


def test_without_steps_a_profile_opened_behind_the_gpu_is_priced_as_its_steps_are(tmp_path):
    """By hand, per iteration: the host takes 2000 us, the GPU 500; without the fetch the GPU's 500 are the pace:
    75 %, what the same trace with its ProfilerSteps prices. Without steps the window's makespan (0 .. 8010 us) holds
    the GPU's 6000-us head behind work the trace did not launch, in which the first iterations' GEMMs only queued:
    removing the fetches shortened it by nothing and the stall went unreported. The window is now one step: the
    host's side (the first call to the last: 3 fetches) against the device's (its first launched GEMM to the last):
    6060 against 2010 us before, ~40 against 2000 after: (6060 - 2000) / 6060 = 67 % (73.5 with the replayed calls'
    own time). A closing synchronize, which waits for the queue to drain, does not end the host's side: its removal
    would otherwise be credited with the device's head."""
    with_steps = diagnose(_behind_earlier_work(tmp_path / "s.json.gz", steps=True)).findings[0]
    assert with_steps.kind == "data_loader_stall" and with_steps.gain_pct == pytest.approx(75.0, abs=0.01)
    for closing in (False, True):
        d = diagnose(_behind_earlier_work(tmp_path / f"n{closing}.json.gz", steps=False, closing_sync=closing))
        f = d.findings[0]
        assert f.kind == "data_loader_stall" and f.severity == "high"
        assert 100 * (6060 - 2000) / 6060 - 0.5 <= f.gain_pct <= with_steps.gain_pct
        assert not any(x.kind == "host_sync" for x in d.findings)
        assert d.ranks[0].steady_step_us is None  # no steps: no step figure


def test_window_steps_and_figures_come_from_one_step_finder(tmp_path):
    """A ProfilerStep span on another thread, starting after the last real step starts (a user's record function of
    that name): the window is still cut at the stepping thread's last step, whose number is the one left out, and
    the analysed steps are that thread's (the window once cut at whichever ProfilerStep started last)."""
    b = TraceBuilder()
    for k in range(3):
        b.step(k, 1000 + 100 * k, 100)
        b.launch("gemm", 1010 + 100 * k, 1020 + 100 * k, 30)
    b.cpu("ProfilerStep#9", 1250, 10, cat="user_annotation", tid=2)
    t = _one(b.write(tmp_path / "t.json.gz"))
    w = analysis_window(t)
    assert w.steps_excluded == [2] and w.steps == [0, 1]
    f = collect_facts(t, w)
    assert f.steps == [0, 1] and [s.step for s in f.step_times] == [0, 1]
    assert w.stop_us == pytest.approx(1120 + 30)  # the kernels of steps 0 and 1 only
    d = diagnose(tmp_path / "t.json.gz")
    assert any("1 ProfilerStep span(s) on another host thread" in n for n in d.notes)


def test_profiler_steps_only_on_the_gpu_do_not_cut_the_window(tmp_path):
    b = TraceBuilder()
    for k in range(3):
        b.launch("gemm", 1010 + 100 * k, 1020 + 100 * k, 30)
        b.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{k}", "pid": 0, "tid": 7,
                         "ts": 1020 + 100 * k, "dur": 30, "args": {}})
    t = _one(b.write(tmp_path / "t.json.gz"))
    w = analysis_window(t)
    assert w.keep.all() and w.steps == [] and w.steps_excluded == []
    assert "only on the GPU timeline" in w.note and "the whole trace is analysed" in w.note


def test_memcpy_bandwidth_unknown_without_bytes(tmp_path):
    """1,000,000 bytes in 100 µs is 10 GB/s (by hand); copies whose size the trace does not record have no
    bandwidth (None, JSON null), never 0."""
    b = TraceBuilder()
    for s in range(3):
        T = 1000.0 * s
        b.step(s, T, 1000)
        b.launch("Memcpy HtoD (Pinned -> Device)", T + 10, T + 20, 100, cat="gpu_memcpy", runtime="cudaMemcpyAsync",
                 bytes=1_000_000)
        b.launch("Memcpy DtoH (Device -> Pinned)", T + 200, T + 210, 50, cat="gpu_memcpy", runtime="cudaMemcpyAsync")
    doc = json.loads(json.dumps(diagnose(b.write(tmp_path / "m.json.gz")).to_json()))
    assert doc["ranks"][0]["memcpy_gbps"] == {"HtoD": pytest.approx(10.0), "DtoH": None}


@needs_hta
@pytest.mark.parametrize("rel, why", [
    ("ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "Optimizer.step annotations suggest"),
    ("amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "only on the GPU timeline")])
def test_real_trace_with_its_profiler_steps_dropped(tmp_path, rel, why):
    """HTA's real traces with the host ProfilerStep spans removed (Kineto's GPU copies kept): the diagnosis covers
    the whole trace (window = the raw JSON's first GPU op start to its last end), finds what it found with the
    steps, at lowered confidence, and says why (the counts in the note are the raw JSON's)."""
    doc = K.read_events(HTA / rel)
    events = [e for e in doc["traceEvents"] if not (K.STEP_RE.match(str(e.get("name", ""))) and not K.is_gpu(e))]
    path = K.write_events(tmp_path / "nostep.json.gz", {**doc, "traceEvents": events})
    ops = [e for e in events if K.is_gpu_op(e)]
    n_opt = sum(1 for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#"))
    n_dev = sum(1 for e in events if K.is_gpu(e) and K.STEP_RE.match(e["name"]))
    d, ref = diagnose(path), diagnose(HTA / rel)
    r = d.ranks[0]
    assert r.steps == [] and r.step_time_median_us is None
    assert r.window_us == pytest.approx(max(map(K.end, ops)) - min(float(e["ts"]) for e in ops), abs=1.0)
    assert d.findings and {f.kind for f in d.findings} == {f.kind for f in ref.findings}
    assert all(f.confidence != "high" for f in d.findings)
    note = next(n for n in d.notes if "no complete profiler step" in n)
    assert why in note and (f"{n_opt} Optimizer.step" in note if n_dev == 0 else f"({n_dev} device annotations" in note)


@needs_hta
def test_real_trace_that_never_had_profiler_steps():
    """HTA's with_gpu_user_annotation (a Quadro GP100 training loop, Optimizer.step annotations, no ProfilerStep):
    findings over the whole trace, none at high confidence, and the note counts the loop's 5 Optimizer.step spans."""
    path = HTA / "with_gpu_user_annotation/step_based_trace_2543932.json.gz"
    events = K.read_events(path)["traceEvents"]
    ops = [e for e in events if K.is_gpu_op(e)]
    d = diagnose(path)
    assert d.ranks[0].window_us == pytest.approx(max(map(K.end, ops)) - min(float(e["ts"]) for e in ops), abs=1.0)
    assert d.findings and all(f.confidence != "high" for f in d.findings)
    assert any("5 Optimizer.step annotations" in n for n in d.notes)


def _profile(tmp_path: Path, save: bool) -> Path:
    """A CPU training loop of 4 activation-checkpointed blocks profiled by PyTorch with stacks; save: each step
    also serialises the model (torch.save to memory), a real checkpoint save."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule
    from torch.utils.checkpoint import checkpoint

    blocks = torch.nn.ModuleList([torch.nn.Linear(128, 128) for _ in range(4)])
    opt = torch.optim.SGD(blocks.parameters(), lr=0.01)
    x = torch.randn(32, 128)
    out = tmp_path / f"ckpt_{save}.json"
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as p:
        for _ in range(4):
            h = x
            for b in blocks:
                h = checkpoint(lambda v, b=b: torch.relu(b(v)), h, use_reentrant=False)
            opt.zero_grad()
            h.sum().backward()
            opt.step()
            if save:
                torch.save(blocks.state_dict(), io.BytesIO())
            p.step()
    return out


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
def test_activation_checkpointing_is_not_a_checkpoint_save(tmp_path):
    """with_stack Python frames of torch.utils.checkpoint (recomputation, model work) once made this healthy loop a
    high checkpoint_stall (43 % of the step); a real torch.save each step is still found."""
    path = _profile(tmp_path, save=False)
    frames = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("cat") == "python_function" and "torch/utils/checkpoint.py" in e.get("name", "")]
    assert frames  # the trace holds the activation-checkpointing frames
    t = _one(path)
    assert collect_facts(t, analysis_window(t)).checkpoint.count == 0
    d = diagnose(path)
    assert "checkpoint_stall" not in {f.kind for f in d.findings}
    assert any("with_stack=True" in n for n in d.notes)  # the overhead caveat, on a rank without GPU events too
    saved = _one(_profile(tmp_path, save=True))
    ck = collect_facts(saved, analysis_window(saved)).checkpoint
    assert ck.count > 0 and all("torch/serialization.py" in name for name, _, _ in ck.longest)


def test_python_frames_are_neither_a_cause_nor_host_work_of_their_own(tmp_path):
    """with_stack=True adds python_function spans over host work the trace shows anyway (the gaps between ops):
    the same host-bound trace (tests/diagnose/host_bound.py) with its Python work as python_function frames, and
    without any span there (a profile without stacks), gives the same findings, gains and critical path."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from host_bound import host_bound_trace

    doc = K.read_events(host_bound_trace(tmp_path / "hb.json.gz"))
    framed = [{**e, "cat": "python_function", "name": "train.py(12): step"} if e["name"] == "python_work" else e
              for e in doc["traceEvents"]]
    bare = [e for e in doc["traceEvents"] if e["name"] != "python_work"]
    a = diagnose(K.write_events(tmp_path / "py.json.gz", {**doc, "traceEvents": framed}))
    b = diagnose(K.write_events(tmp_path / "bare.json.gz", {**doc, "traceEvents": bare}))
    assert [(f.kind, f.gain_pct) for f in a.findings] == [(f.kind, f.gain_pct) for f in b.findings]
    # the Python work (2 ms of each 3-ms step plus the tail, launching nothing while the GPU idles) is host work;
    # the launches' own cost (10 x 60 us a step) comes after it
    assert [f.kind for f in a.findings][:2] == ["host_work", "launch_bound"]
    assert a.ranks[0].critical_path_pct == pytest.approx(b.ranks[0].critical_path_pct)
