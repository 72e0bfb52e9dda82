"""A trace folder may hold other JSON beside its rank traces (labels, configs): skipped with a warning, never read as a
rank; a folder of such files alone is still an error, and a damaged trace is never skipped."""

import json
import shutil
import warnings
from pathlib import Path

import pytest

from trainperf.errors import TrainperfError
from trainperf.trace.load import NotATraceWarning, load_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "compile"


def test_labels_beside_a_trace_are_skipped_with_a_warning(tmp_path):
    shutil.copy(DATA / "steady.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "labels.json").write_text(json.dumps({"kind": "healthy", "ranks": [], "true_gain_pct": 0}))
    with pytest.warns(NotATraceWarning, match="labels.json: holds no trace events"):
        tables = load_trace(tmp_path)
    alone = load_trace(DATA / "steady.json.gz")
    assert list(tables) == [0] and len(tables[0]) == len(alone[0])


def test_a_folder_with_no_trace_is_an_error_naming_where_they_are(tmp_path):
    (tmp_path / "labels.json").write_text("{}")
    (tmp_path / "traces").mkdir()
    with pytest.raises(TrainperfError, match="its traces are in"):
        load_trace(tmp_path)
    (tmp_path / "traces").rmdir()
    with pytest.raises(TrainperfError, match="labels.json: no complete"):
        load_trace(tmp_path)


def test_a_damaged_trace_beside_a_good_one_is_still_an_error(tmp_path):
    shutil.copy(DATA / "steady.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "rank1.json").write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1')  # cut mid-event
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotATraceWarning)  # nothing may be skipped silently
        with pytest.raises(TrainperfError, match="rank1.json"):
            load_trace(tmp_path)


def test_a_memory_timeline_beside_a_trace_is_skipped_and_alone_named(tmp_path):
    # torch.profiler's export_memory_timeline beside the run's trace: its raw form is a JSON array of
    # [time, action, bytes, category] entries (HTA's memory_analysis test data), its plain form [times, sizes]; neither
    # holds an event. Before, the folder failed whole ("no complete ('ph': 'X') events among 3 entries")
    shutil.copy(DATA / "steady.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "memory_timeline.raw.json").write_text(json.dumps([[-1, 1, 37888, 7], [12, 2, 512, 7], [15, 1, 64, 3]]))
    (tmp_path / "memory_timeline.json").write_text(json.dumps([[0, 10, 20], [[1, 2], [3, 4], [5, 6]]]))
    with pytest.warns(NotATraceWarning, match="memory_timeline"):
        tables = load_trace(tmp_path)
    assert list(tables) == [0]
    (tmp_path / "rank0.json.gz").unlink()
    (tmp_path / "memory_timeline.json").unlink()
    with pytest.raises(TrainperfError, match="a JSON array of arrays, not of events: not a trace"):
        load_trace(tmp_path)


def test_diagnose_keeps_the_files_it_did_not_read_in_its_notes(tmp_path):
    # the terminal, the JSON and the HTML all show the notes: a JSON reader learns which files were left out
    from trainperf.diagnose.api import diagnose

    shutil.copy(DATA / "steady.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "labels.json").write_text("{}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotATraceWarning)  # a note now, not a warning as well
        d = diagnose(tmp_path)
    assert any(n.endswith("labels.json: holds no trace events (not a trace): skipped") for n in d.notes)
    assert any("labels.json" in n for n in d.to_json()["notes"])
