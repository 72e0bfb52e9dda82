"""The hand-built reconstructions of the cases diagnose was judged on (allocator off on ROCm, pageable copies, a DDP
rank whose GPU trails its host, DeepEP's all-to-all, .item() reads, a DataLoader-bound step), the cross-rank waits
(a straggler, load imbalance, hosts paused in turn), gradients synchronised every micro-batch, a CUDA-graph
decode loop reading its token each step and a pipeline's bubble, rewritten as other set-ups write traces
(trainperf.corpus.formats: ROCm names, no flows, no operator ids, no distributedInfo, rank clocks apart, no Python
stack, PyTorch 1.8 categories, no ProfilerStep): the top finding must not change."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
import test_diagnose_expert_pipeline as E  # noqa: E402
import test_diagnose_grad_sync as G  # noqa: E402
import test_diagnose_graphs as D  # noqa: E402
import test_diagnose_kinds as K  # noqa: E402
import test_diagnose_load_imbalance as L  # noqa: E402
import test_diagnose_rules as R  # noqa: E402
import test_diagnose_syncs as S  # noqa: E402

from trainperf.corpus.formats import TIMING_VARIANTS, VARIANTS  # noqa: E402
from trainperf.corpus.kineto import read_events  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.trace.load import rank_from_name  # noqa: E402

CASES = {  # name -> (builder writing into a folder, the top finding)
    "allocator": (lambda d: K._allocator_trace(d / "a.json.gz"), "allocator_stall"),
    "pageable": (lambda d: K._pageable_trace(d / "p.json.gz"), "pageable_copy"),
    "gpu_trails_host": (lambda d: K._rocm_ddp(d / "r.json.gz"), "exposed_comm"),
    "item": (lambda d: S._item_trace(d / "i.json.gz"), "host_sync"),
    "deepep": (lambda d: E._moe_trace(d / "m.json.gz", "void deep_ep::intranode::dispatch<8, 768>(int4*, float*)",
                                      "void deep_ep::intranode::combine<8>(float*)"), "exposed_comm"),
    "dataloader": (lambda d: R._dataloader_bound_with_small_kernels(d / "dl.json.gz"), "data_loader_stall"),
    "straggler": (lambda d: L._job(d, rotating=False), "straggler"),
    "load_imbalance": (lambda d: L._job(d, rotating=True), "load_imbalance"),
    "paused_in_turn": (lambda d: L._job(d, rotating=True, paused=True), "straggler"),
    "grad_sync": (G._accumulating_trace, "grad_sync_per_microbatch"),
    "grad_sync_fsdp": (lambda d: G._accumulating_trace(d, fsdp=True), "grad_sync_per_microbatch"),
    "decode_graphed": (lambda d: D._decode(d / "g.json.gz", graphed=True), "host_sync"),
    "pipeline": (lambda d: E.pipeline_job(d, [1000.0] * 4, micro=8), "pipeline_bubble"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_top_finding_does_not_depend_on_the_trace_format(tmp_path, case):
    build, kind = CASES[case]
    src = tmp_path / "src"
    src.mkdir()
    build(src)
    assert diagnose(src).findings[0].kind == kind
    for name, rewrite in ((n, f) for n, f in VARIANTS.items() if n not in TIMING_VARIANTS):
        out = tmp_path / name
        out.mkdir()
        for trace in src.iterdir():
            doc = rewrite(read_events(trace), rank_from_name(trace) or 0)
            (out / trace.name.removesuffix(".gz")).write_text(json.dumps(doc))
        assert diagnose(out).findings[0].kind == kind, name
