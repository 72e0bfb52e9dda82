"""Chrome trace JSON as other writers (and older Kineto) write it: spans as begin/end ("B"/"E") pairs, numbers
written as inf/NaN, a file cut before its end. Reference: the same trace written as complete ("X") events with
finite numbers (a cut file: its events before the cut, written whole), read by the same loader; the begin/end
stream is made by an independent serialiser (a stack walk over the spans)."""

import gzip
import json

import numpy as np
import pytest

from kineto_builder import TraceBuilder
from trainperf.errors import TrainperfError
from trainperf.trace import kineto, read_kineto
from trainperf.trace.begin_end import pair_begin_end

HOST_CATS = ("cpu_op", "user_annotation", "python_function")


def _job() -> TraceBuilder:
    """Three steps of a forward with nested ops on the main thread, one op on a second thread, each launching a
    kernel; integer µs as Kineto writes them."""
    b = TraceBuilder()
    for k in range(3):
        s = 1000 + 500 * k
        b.step(k + 1, s, 480)
        b.cpu("aten::linear", s + 10, 200, input=k)
        b.cpu("aten::addmm", s + 20, 150)        # nested in linear
        b.cpu("aten::t", s + 20, 0)              # a zero-length op at the same start
        b.launch("sm90_gemm", s + 30, s + 60, 120)
        b.cpu("aten::relu", s + 250, 100)
        b.launch("relu_kernel", s + 260, s + 280, 30)
        b.cpu("Optimizer.step#AdamW.step", s + 400, 70, cat="user_annotation")
        b.cpu("aten::copy_", s + 100, 40, tid=2)  # another thread, overlapping the main one in time
    return b


def _as_begin_end(events: list[dict]) -> list[dict]:
    """The host spans rewritten as time-ordered B/E pairs per thread (an E before any B at the same instant,
    the inner span's E first), the other events kept as they are."""
    out = [e for e in events if e.get("cat") not in HOST_CATS]
    threads = sorted({(e["pid"], e["tid"]) for e in events if e.get("cat") in HOST_CATS})
    for key in threads:
        spans = sorted((e for e in events if e.get("cat") in HOST_CATS and (e["pid"], e["tid"]) == key),
                       key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in spans:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] and \
                    not (e["dur"] == 0 and stack[-1]["ts"] + stack[-1]["dur"] == e["ts"] == stack[-1]["ts"]):
                done = stack.pop()
                out.append({"ph": "E", "pid": done["pid"], "tid": done["tid"], "ts": done["ts"] + done["dur"]})
            out.append({k: v for k, v in e.items() if k != "dur"} | {"ph": "B"})
            stack.append(e)
        while stack:
            done = stack.pop()
            out.append({"ph": "E", "pid": done["pid"], "tid": done["tid"], "ts": done["ts"] + done["dur"]})
    return out


def _rows(t) -> list[tuple]:
    return sorted(zip(t.ts_ns.tolist(), t.dur_ns.tolist(), [t.names[i] for i in t.name], t.tid.tolist(),
                      t.kind.tolist(), t.correlation.tolist()))


@pytest.mark.parametrize("chunk", [1 << 20, 512])  # 512 bytes: the pairs fall in different batches
def test_begin_end_pairs_read_as_the_complete_events_they_write(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(kineto, "CHUNK_BYTES", chunk)
    b = _job()
    reference = read_kineto(b.write(tmp_path / "x.json", gz=False))
    doc = b.doc()
    doc["traceEvents"] = _as_begin_end(doc["traceEvents"])
    assert not [e for e in doc["traceEvents"] if e.get("cat") in HOST_CATS and e["ph"] == "X"]
    (tmp_path / "be.json").write_text(json.dumps(doc, indent=1))
    got = read_kineto(tmp_path / "be.json")
    assert _rows(got) == _rows(reference)
    assert got.n_skipped == reference.n_skipped == 0
    # an op's args, written on its "B", stay with it
    linear = np.flatnonzero(got.name == got.names.index("aten::linear"))
    assert len(linear) == 3 and all(got.args[i] == -1 or "input" not in got.arg_texts[got.args[i]] for i in linear)


def test_the_steps_of_a_begin_end_trace_are_found(tmp_path):
    """What the pairing buys: ProfilerStep spans, written as B/E, make the analysis window (3 steps, the last left
    out as cut short), where dropping them left no step at all."""
    from trainperf.diagnose.window import analysis_window

    doc = _job().doc()
    doc["traceEvents"] = _as_begin_end(doc["traceEvents"])
    (tmp_path / "be.json").write_text(json.dumps(doc))
    w = analysis_window(read_kineto(tmp_path / "be.json"))
    assert w.note == "" and w.steps_excluded == [3]


def test_unclosed_begins_and_stray_ends_are_left_out_and_counted():
    events = [{"ph": "E", "pid": 1, "tid": 1, "ts": 5},                              # nothing open: stray
              {"ph": "B", "pid": 1, "tid": 1, "ts": 10, "name": "outer", "cat": "cpu_op", "args": {"a": 1}},
              {"ph": "B", "pid": 1, "tid": 2, "ts": 11, "name": "other", "cat": "cpu_op"},
              {"ph": "B", "pid": 1, "tid": 1, "ts": 12, "name": "inner", "cat": "cpu_op"},
              {"ph": "E", "pid": 1, "tid": 1, "ts": 20, "args": {"b": 2}},            # closes inner
              {"ph": "E", "pid": 1, "tid": 1, "ts": 30}]                             # closes outer
    spans, unpaired = pair_begin_end(events)                                          # "other" never closed
    assert unpaired == 2
    assert [(s["name"], s["ts"], s["dur"], s["ph"]) for s in spans] == [("inner", 12, 8, "X"), ("outer", 10, 20, "X")]
    assert spans[0]["args"] == {"b": 2} and spans[1]["args"] == {"a": 1}


def _with_non_finite(tmp_path, text_of_bandwidth: str):
    """Kineto's event of pytorch/kineto#105 (a copy of zero duration, its bandwidth written as inf) in a trace of
    one launch and kernel; the same trace with the bandwidth finite is the reference."""
    b = TraceBuilder()
    b.step(1, 1000, 400)
    b.launch("gemm", 1010, 1030, 100)
    c = b.launch("Memcpy HtoD (Pageable -> Device)", 1200, 1220, 0, cat="gpu_memcpy", runtime="cudaMemcpyAsync",
                 bytes=200)
    ref = b.write(tmp_path / "finite.json", gz=False)
    text = ref.read_text().replace(f'"correlation": {c},\n    "stream"',
                                   f'"correlation": {c},\n    "memory bandwidth (GB/s)": {text_of_bandwidth},\n'
                                   '    "stream"')
    assert f'"memory bandwidth (GB/s)": {text_of_bandwidth},' in text
    (tmp_path / "odd.json").write_text(text)
    return ref, tmp_path / "odd.json"


@pytest.mark.parametrize("token", ["inf", "-inf", "nan", "NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("typed", [True, False])
def test_numbers_written_as_inf_or_nan_read_as_absent(tmp_path, monkeypatch, token, typed):
    if not typed:
        monkeypatch.setattr(kineto, "_typed_decode", None)
    ref, odd = _with_non_finite(tmp_path, token)
    assert _rows(read_kineto(odd)) == _rows(read_kineto(ref))


def _events_text(events: list[dict], array: bool = False, closed: bool = True) -> str:
    """A trace's text with one event per line: Kineto's object format, or Chrome's bare array of events."""
    body = ",\n".join(json.dumps(e) for e in events)
    if array:
        return "[\n" + body + ("\n]" if closed else "\n")
    return '{"schemaVersion": 1, "traceEvents": [\n' + body + '\n], "traceName": "x"}'


@pytest.mark.parametrize("where", [0.3, 0.5, 0.9])  # inside a string, a number or a key of event k
def test_a_cut_trace_reads_the_events_before_the_cut(tmp_path, where):
    events = _job().events
    k = len(events) * 2 // 3
    text = _events_text(events)
    line = json.dumps(events[k])
    at = text.index(line) + int(len(line) * where)
    (tmp_path / "cut.json").write_text(text[:at])
    (tmp_path / "first_k.json").write_text(_events_text(events[:k]))
    got, reference = read_kineto(tmp_path / "cut.json"), read_kineto(tmp_path / "first_k.json")
    assert _rows(got) == _rows(reference)
    assert got.metadata["truncated"] == {"events_read": k}
    assert "truncated" not in reference.metadata


def test_a_file_cut_in_the_keys_after_its_events_reads_them_but_the_last(tmp_path):
    # cut inside "traceName"'s value: the events are whole but the last, which the cut's batch leaves out
    events = _job().events
    text = _events_text(events)
    (tmp_path / "cut.json").write_text(text[:text.index('"traceName": "x"') + 15])
    (tmp_path / "first_k.json").write_text(_events_text(events[:-1]))
    got = read_kineto(tmp_path / "cut.json")
    assert _rows(got) == _rows(read_kineto(tmp_path / "first_k.json"))
    assert got.metadata["truncated"] == {"events_read": len(events) - 1}


def test_a_cut_gzip_reads_what_it_inflates(tmp_path):
    events = _job().events
    data = gzip.compress(_events_text(events).encode())
    (tmp_path / "cut.json.gz").write_bytes(data[:len(data) * 3 // 4])
    got = read_kineto(tmp_path / "cut.json.gz")
    k = got.metadata["truncated"]["events_read"]
    assert 0 < k < len(events)
    (tmp_path / "first_k.json").write_text(_events_text(events[:k]))
    assert _rows(got) == _rows(read_kineto(tmp_path / "first_k.json"))


def test_a_chrome_array_without_its_closing_bracket_is_whole(tmp_path):
    """Chrome's array format may leave out its "]" (a writer streaming its events): every event, nothing cut."""
    events = _job().events
    (tmp_path / "open.json").write_text(_events_text(events, array=True, closed=False))
    (tmp_path / "closed.json").write_text(_events_text(events, array=True))
    got = read_kineto(tmp_path / "open.json")
    assert _rows(got) == _rows(read_kineto(tmp_path / "closed.json")) and "truncated" not in got.metadata


@pytest.mark.parametrize("text, why", [
    ('{"traceEvents": [{"ph": "X", "cat": "kernel"', "cut before any whole event"),
    ('{"traceEvents": [{"ph": "X"}, ]}', "a trailing comma: written wrong, not cut"),
])
def test_what_is_not_a_cut_trace_stays_invalid(tmp_path, text, why):
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(TrainperfError, match="bad.json: invalid JSON .*is the trace complete"):
        read_kineto(tmp_path / "bad.json")


def test_damage_before_the_last_events_stays_invalid(tmp_path):
    events = _job().events
    text = _events_text(events)
    first = json.dumps(events[3])
    (tmp_path / "bad.json").write_text(text.replace(first, first[:-1] + ', "oops": }'))
    with pytest.raises(TrainperfError, match="bad.json: invalid JSON"):
        read_kineto(tmp_path / "bad.json")


def test_a_cut_trace_says_so_and_its_findings_are_of_low_confidence(tmp_path):
    from trainperf.diagnose.api import diagnose

    events = _job().events
    text = _events_text(events)
    (tmp_path / "rank0.json").write_text(text[:text.index(json.dumps(events[-3])) + 10])
    d = diagnose(tmp_path / "rank0.json")
    assert any("the trace file ends inside its events" in n and f"{len(events) - 3} complete events read" in n
               for n in d.notes)
    assert all(f.confidence == "low" for f in d.findings)


def test_a_file_cut_among_the_host_operators_blames_the_cut_not_the_profiler_set_up(tmp_path):
    """Kineto writes the host's operators first, then the runtime calls and kernels: cut among the former, the file
    holds no GPU event, and the advice is to re-export the file, not to profile CUDA activity."""
    from trainperf.diagnose.api import diagnose

    events = _job().events
    host = [e for e in events if e["cat"] in HOST_CATS]
    text = _events_text(host + [e for e in events if e["cat"] not in HOST_CATS])
    (tmp_path / "rank0.json").write_text(text[:text.index(json.dumps(host[-2]))])
    skipped = [f for f in diagnose(tmp_path / "rank0.json").findings if f.kind == "gpu_analyses_skipped"]
    assert skipped and "cut before its end" in skipped[0].recommendation
