"""The args the analyses need beyond the columns (shapes, collective sizes), kept by the loader in
EventTable.args: against json.load of the same file, and alike on the typed and the dict path."""

import gzip
import json
from pathlib import Path

import pytest

from trainperf.trace import kineto, read_kineto
from trainperf.trace.chunk import KEPT_ARGS

DATA = Path(__file__).resolve().parents[2] / "../shared/data/traces/hta"


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/traces/hta not present")
@pytest.mark.parametrize("trace", ["negative_queue_length_values_check/rank0.json.gz",
                                   "nccl_parser_config/nccl_data.json.gz",
                                   # records "Input Strides" (PyTorch 2.x on ROCm 6.2)
                                   "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
def test_kept_args_equal_the_files_args(trace):
    # reference: json.load of the whole file; every event with "Input Dims" or "In msg nelems" keeps
    # exactly its KEPT_ARGS, and no other event keeps any
    f = DATA / trace
    t = read_kineto(f)
    events = [e for e in json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]
              if e.get("ph") == "X" and isinstance(e.get("args"), dict)]
    want = sorted(json.dumps({k: e["args"][k] for k in KEPT_ARGS if k in e["args"]}, sort_keys=True)
                  for e in events if "Input Dims" in e["args"] or "In msg nelems" in e["args"])
    kept = t.kept_args()
    got = sorted(json.dumps(kept[i], sort_keys=True) for i in t.args[t.args >= 0])
    assert want and got == want


def test_values_beyond_64_bits_read_alike_on_both_paths(tmp_path, monkeypatch):
    # orjson (the dict path's parser) reads an integer beyond 64 bits as a float: the raw text the
    # typed path keeps is read by the same parser, so both tables agree
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2,
           "args": {"In msg nelems": 1 << 64, "dtype": "Float"}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2,
           "args": {"Input Dims": [[1, -(1 << 64)]], "Input type": ["float"], "Concrete Inputs": ["", "x\u00e9"]}}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}, indent=1))
    fast = read_kineto(p)
    monkeypatch.setattr(kineto, "_typed_decode", None)
    slow = read_kineto(p)
    assert fast.arg_texts == slow.arg_texts and list(fast.args) == list(slow.args)
    assert slow.kept_args()[slow.args[slow.name == slow.name_id("aten::mm")][0]]["Concrete Inputs"] == ["", "x\u00e9"]


def test_any_mix_of_kept_args_reads_alike_on_both_paths(tmp_path, monkeypatch):
    # shapes beside collective args (hypothesis found the typed path dropping these once)
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 0,
           "args": {"correlation": 0, "Process Group Ranks": "[0, 1]", "Input Dims": []}},
          {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 0, "args": {"dtype": "Float"}}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    fast = read_kineto(p)
    monkeypatch.setattr(kineto, "_typed_decode", None)
    slow = read_kineto(p)
    assert fast.arg_texts == slow.arg_texts == ['{"Input Dims":[],"Process Group Ranks":"[0, 1]"}']
