"""End to end: `trainperf evaluate` on the committed corpus subset; the builder is deterministic."""

import json
from pathlib import Path

import pytest

from trainperf.cli import main
from trainperf.corpus.build import build_corpus, default_bases

DATA = Path(__file__).parent / "data"
HTA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"


def test_evaluate_on_the_committed_subset(tmp_path, capsys):
    out, page = tmp_path / "scores.json", tmp_path / "eval.html"
    with pytest.raises(SystemExit) as e:
        main(["evaluate", str(DATA), "--json", str(out), "--html", str(page)])
    assert e.value.code == 0
    s = json.loads(out.read_text())
    assert set(s["kinds"]) == {"data_loader_stall", "pageable_copy", "straggler"}
    assert [s["kinds"][k]["n"] for k in ("data_loader_stall", "pageable_copy", "straggler")] == [1, 1, 1]
    for v in s["kinds"].values():
        assert set(v) >= {"precision", "recall", "f1", "n"}
        assert all(x is None or 0 <= x <= 1 for x in (v["precision"], v["recall"], v["f1"]))
    assert set(s["healthy_false_findings"]) == {"high", "medium", "low"}
    assert 0 <= s["top1_accuracy"] <= 1 and s["n_cases"] == 4 and s["n_healthy"] == 1
    assert len(s["cases"]) == 4
    # each case says how it went: its top finding, and whether that is the labeled kind
    right = {c["name"]: c["top1"] for c in s["cases"]}
    assert right["healthy-trace_filter"] is None and right["data_loader_stall-high-trace_filter"] is True
    assert page.read_text().startswith("<!doctype html>") and "data_loader_stall-high-trace_filter" in page.read_text()
    # a DataLoader fetch holding 20 % of every step, named as PyTorch names it, must be found
    assert s["kinds"]["data_loader_stall"]["recall"] == 1.0
    assert "top-1 accuracy" in capsys.readouterr().out


@pytest.mark.skipif(not HTA.is_dir(), reason="../shared/data/traces/hta not present")
def test_builder_reproduces_a_committed_case(tmp_path):
    base = [b for b in default_bases(HTA) if b.name == "trace_filter"]
    build_corpus(tmp_path, base, kinds=("data_loader_stall",), severities=("high",), log=lambda s: None)
    name = "data_loader_stall-high-trace_filter"
    assert json.loads((tmp_path / name / "labels.json").read_text()) == \
        json.loads((DATA / name / "labels.json").read_text())


@pytest.mark.skipif(not HTA.is_dir(), reason="../shared/data/traces/hta not present")
def test_a_fresh_draw_places_and_sizes_the_injection_anew(tmp_path):
    """--seed-salt / --targets: the seed is the salted name's CRC-32, the measured gain lands on the new target
    (within the sizing search's 15 %), and the trace differs from the default draw's."""
    import zlib

    base = [b for b in default_bases(HTA) if b.name == "trace_filter"]
    name = "data_loader_stall-high-trace_filter"
    (label,) = [x for x in build_corpus(tmp_path, base, kinds=("data_loader_stall",), severities=("high",),
                                        log=lambda s: None, targets={"high": 30.0}, seed_salt="fresh-")
                if x["kind"] != "healthy"]
    assert label["seed"] == zlib.crc32(b"fresh-" + name.encode()) != zlib.crc32(name.encode())
    assert abs(label["true_gain_pct"] - 30.0) <= 0.15 * 30.0
    default = json.loads((DATA / name / "labels.json").read_text())
    assert abs(default["true_gain_pct"] - label["true_gain_pct"]) > 5.0


@pytest.mark.parametrize("case", sorted(p.name for p in DATA.iterdir() if p.is_dir()))
def test_committed_cases_are_physical(case):
    """Device ops never overlap on a stream nor start before their launch (Kineto/CUDA semantics)."""
    from trainperf.corpus import kineto as K

    for f in sorted((DATA / case / "traces").glob("*.json.gz")):
        ev = K.read_events(f)["traceEvents"]
        launch = K.launch_times(ev)
        streams: dict = {}
        for e in ev:
            if K.is_gpu_op(e):
                streams.setdefault((e["pid"], e["tid"]), []).append((float(e["ts"]), K.end(e)))
                c = K.correlation(e)
                assert c not in launch or float(e["ts"]) >= launch[c], (f, e["name"])
        for spans in streams.values():
            spans.sort()
            assert all(b[0] >= a[1] - 0.01 for a, b in zip(spans, spans[1:])), f


def _clear_waits(ev: list[dict]) -> list[tuple[int, int]]:
    """(waiting op, awaited op) event index pairs of the untouched trace: device ops whose stream was
    idle >= 100 µs before them and whose launch was >= 100 µs earlier (neither released them) that
    started within 10 µs after an op of another stream ended (so nothing but that op did)."""
    from trainperf.corpus import kineto as K

    launch = K.launch_times(ev)
    ops = sorted((float(e["ts"]), K.end(e), (e["pid"], e["tid"]), i, launch.get(K.correlation(e), float(e["ts"])))
                 for i, e in enumerate(ev) if K.is_gpu_op(e))
    last_end: dict = {}
    out = []
    for ts, te, st, i, lt in ops:
        idle = ts - last_end.get(st, -1e18)
        if idle >= 100.0 and ts - lt >= 100.0:
            out += [(i, j) for _, e2, st2, j, _ in ops if st2 != st and ts - 10.0 <= e2 <= ts]
        last_end[st] = max(last_end.get(st, -1e18), te)
    return out


@pytest.mark.parametrize("case", sorted(p.name for p in DATA.iterdir()
                                        if p.is_dir() and not p.name.startswith("healthy")))
def test_committed_cases_keep_the_waits_on_other_streams(case):
    """An op that waited for an op of another stream in the untouched trace still starts after it
    ends (the surgery keeps event order: index i is the same event in both)."""
    from trainperf.corpus import kineto as K

    base = json.loads((DATA / case / "labels.json").read_text())["base"]
    n = 0
    for f in sorted((DATA / case / "traces").glob("*.json.gz")):
        healthy = K.read_events(DATA / f"healthy-{base}" / "traces" / f.name)["traceEvents"]
        ev = K.read_events(f)["traceEvents"]
        for i, j in _clear_waits(healthy):
            assert float(ev[i]["ts"]) >= K.end(ev[j]) - 0.01, (f, ev[i]["name"], ev[j]["name"])
            n += 1
    assert n > 0
