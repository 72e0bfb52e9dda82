"""Communication that feeds the next computation: expert parallelism's all-to-all (DeepEP) and pipeline stages'
send/recv, on hand-built traces (answers worked by hand)."""

import gzip
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from kineto_builder import TraceBuilder  # noqa: E402
from pipeline_builder import SEND_RECV, pipeline_job  # noqa: E402

from trainperf.corpus.kineto import read_events  # noqa: E402
from trainperf.diagnose.api import diagnose  # noqa: E402
from trainperf.diagnose.facts import device_timing  # noqa: E402
from trainperf.diagnose.pipeline import (PeerExchange, ScheduleNames, p2p_group_role, peer_exchange,  # noqa: E402
                                         pipeline_end, schedule_bubble_pct, schedule_names, stages_from_openings)
from trainperf.diagnose.routing import SplitSkew, send_split_skew  # noqa: E402
from trainperf.diagnose.window import analysis_window  # noqa: E402
from trainperf.trace.load import load_trace  # noqa: E402

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
STEP_US = 4040.0


def _moe_trace(path: Path, dispatch: str, combine: str, backward: bool | str = False, ops: bool = True,
               comm_args: dict | None = None, comm_inside: str = "") -> Path:
    # one MoE layer per 4040-us step T: host launches at T, T+5, .., T+20, then cudaStreamSynchronize [T+25, T+4035)
    # (the loss read). Device: attention GEMM [T+30, +1000) on stream 7; dispatch [T+1030, +1000) on DeepEP's
    # stream 30; expert GEMM [T+2030, +1000) (waits for the dispatch); combine [T+3030, +500) on stream 30; output
    # GEMM [T+3530, +500) (waits for the combine). Four steps. backward: the launches inside an autograd backward
    # node [T, T+25) (as DDP's reducer launches its all-reduces, from hooks inside the nodes); "engine": from the
    # autograd engine's thread (2) after its node [T-20, T-10) ended (FSDP's end-of-backward callback), while the
    # training thread (1) runs an op of its own [T-30, T-25); else (the forward) inside an aten::linear [T, T+25), and
    # without ops (a profile of CUDA activity only) inside none. comm_args: the communication kernels' args (message
    # sizes); comm_inside: an op [T+4, T+16) around their launches (at T+5 and T+15)
    b = TraceBuilder()
    for s in range(4):
        T = STEP_US * s
        b.step(s, T, STEP_US)
        if backward is True:
            b.cpu("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", T, 25)
        elif backward == "engine":
            b.cpu("autograd::engine::evaluate_function: MmBackward0", T - 20, 10, tid=2)
            b.cpu("aten::add", T - 30, 5)
        elif ops:
            b.cpu("aten::linear", T, 25)
        if comm_inside:
            b.cpu(comm_inside, T + 4, 12)
        for i, (name, start, dur, stream) in enumerate(((GEMM, 30, 1000, 7), (dispatch, 1030, 1000, 30),
                                                         (GEMM, 2030, 1000, 7), (combine, 3030, 500, 30),
                                                         (GEMM, 3530, 500, 7))):
            b.launch(name, T + 5 * i, T + start, dur, stream=stream, tid=2 if backward == "engine" else 1,
                     **(comm_args or {} if stream == 30 else {}))
        b.cpu("cudaStreamSynchronize", T + 25, 4010, cat="cuda_runtime")
    return b.write(path)


def test_exposed_expert_all_to_all_is_named_and_priced(tmp_path):
    # overlapped, the GEMMs stop waiting for dispatch and combine: 30..1030, 1030..2030, 2030..2530 in each step;
    # the sync returns 5 us after the last (T+2535) and the next step starts 5 us later: 2540 us a step, 1500 us
    # less than 4040. The steps analysed are those before the last; each gains 1500 us: 1500 / 4040 = 37.1 %.
    # Nothing on the host waits for the all-to-all (the sync waits for the output GEMM): an upper bound, high ->
    # medium. DeepEP's kernels are an all-to-all (dispatch and combine of tokens): its fix, not bucketing's.
    d = diagnose(_moe_trace(tmp_path / "moe.json.gz", "void deep_ep::intranode::dispatch<8, 768>(int4*, float*)",
                            "void deep_ep::intranode::combine<8>(float*)"))
    f = d.findings[0]
    assert f.kind == "exposed_comm" and f.gain_is_upper_bound and f.severity == "medium"
    assert f.gain_pct == pytest.approx(100 * 1500 / STEP_US, abs=0.2)
    m = f.evidence["metrics"]
    assert m["all_to_all_share"]["value"] == pytest.approx(100.0)
    assert m["point_to_point_share"]["value"] == 0.0
    assert "another micro-batch" in f.recommendation and "bucket" not in f.recommendation
    # the same trace with all-reduces launched in the backward (DDP's gradients): the same gain, the collectives' fix
    ar = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)"
    d = diagnose(_moe_trace(tmp_path / "ar.json.gz", ar, ar, backward=True))
    f = d.findings[0]
    assert f.kind == "exposed_comm" and f.gain_pct == pytest.approx(100 * 1500 / STEP_US, abs=0.2)
    m = f.evidence["metrics"]
    assert m["all_to_all_share"]["value"] == 0.0 and m["forward_all_reduce_share"]["value"] == 0.0
    assert "bucket" in f.recommendation


def test_an_all_to_all_sending_one_rank_more_than_its_share_names_its_hot_experts(tmp_path):
    # the MoE step above, its dispatch and combine recording their per-rank splits as PyTorch writes them ("In split
    # size", the group's ranks): this rank sends 4000 of 8000 elements a call to global rank 8 (the second of 4), its
    # mean share 2000: 2.0x, the experts there named hot before the overlap; equal splits (an empty list) or a list
    # Kineto cut short ("...") name none
    def args(split: str) -> dict:
        return {"Collective name": "all_to_all", "In msg nelems": 8000, "Out msg nelems": 8000, "dtype": "BFloat16",
                "Group size": 4, "Process Group Ranks": "[0, 8, 16, 24]", "In split size": split}

    found = {}
    for name, split in (("skewed", "[1000, 4000, 1000, 2000]"), ("equal", "[]"), ("cut", "[1000, 4000, ...]")):
        d = diagnose(_moe_trace(tmp_path / f"{name}.json.gz", "ncclDevKernel_SendRecv(x)", "ncclDevKernel_SendRecv(x)",
                                comm_args=args(split)))
        found[name] = next(f for f in d.findings if f.kind == "exposed_comm")
    m = found["skewed"].evidence["metrics"]
    assert m["all_to_all_largest_send_share"]["value"] == pytest.approx(2.0)
    assert m["all_to_all_largest_send_to_rank"]["value"] == 8
    assert found["skewed"].recommendation.startswith("This rank sends 2.0x its mean share of its all-to-all data to "
                                                     "rank 8 (of 4)")
    assert "another micro-batch" in found["skewed"].recommendation
    for name in ("equal", "cut"):
        assert "all_to_all_largest_send_share" not in found[name].evidence["metrics"]
        assert found[name].recommendation.startswith("Most of the exposed communication is all-to-all")
    # beside FBGEMM's embedding lookups the all-to-all carries lookups to the tables' shards: the sharding plan's fix
    b = TraceBuilder()
    b.step(0, 0.0, 1000.0)
    b.step(1, 1000.0, 1000.0)
    b.launch("split_embedding_codegen_forward_unweighted_kernel", 5.0, 10.0, 300.0)
    b.launch("ncclDevKernel_SendRecv(x)", 10.0, 310.0, 200.0, stream=30, **args("[1000, 4000, 1000, 2000]"))
    t = load_trace(b.write(tmp_path / "tables.json.gz"))[0]
    assert send_split_skew(t, analysis_window(t)) == SplitSkew(ratio=2.0, peer=8, peers=4, carries="embeddings")


def test_exposed_all_reduce_in_the_forward_gets_tensor_parallel_fixes(tmp_path):
    # the all-reduces launched outside any backward node (a forward, or an inference step): tensor parallelism's
    # row-parallel outputs, which the next GEMM needs at once. Same gain; its fix names the TP levers, not DDP's
    ar = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)"
    d = diagnose(_moe_trace(tmp_path / "tp.json.gz", ar, ar))
    f = d.findings[0]
    assert f.kind == "exposed_comm" and f.gain_pct == pytest.approx(100 * 1500 / STEP_US, abs=0.2)
    assert f.evidence["metrics"]["forward_all_reduce_share"]["value"] == pytest.approx(100.0)
    assert "tensor parallel" in f.recommendation and "bucket" not in f.recommendation
    # launched by the autograd engine's thread outside its nodes (an end-of-backward callback): the backward's
    f = diagnose(_moe_trace(tmp_path / "cb.json.gz", ar, ar, backward="engine")).findings[0]
    assert f.evidence["metrics"]["forward_all_reduce_share"]["value"] == 0.0 and "bucket" in f.recommendation
    # a profile of CUDA activity only records no op: no node is seen because none is recorded, not because the
    # all-reduces run in the forward
    f = diagnose(_moe_trace(tmp_path / "cuda.json.gz", ar, ar, ops=False)).findings[0]
    assert f.evidence["metrics"]["forward_all_reduce_share"]["value"] == 0.0 and "bucket" in f.recommendation


def _in_group(path: Path, desc: str) -> Path:
    # the trace's communication kernels in process group "5", described in distributedInfo.pg_config as PyTorch >= 2.3
    # writes it
    doc = read_events(path)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel"):
            e["args"]["Process Group Name"] = "5"
    doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8},
                                           {"pg_name": "5", "pg_desc": desc, "pg_size": 8}]
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


@pytest.mark.parametrize("desc, backward, tensor", [
    ("DATA_PARALLEL_GROUP", False, False),  # Megatron's gradient all-reduce, launched outside any node (compiled)
    ("mesh_dp_shard_cp", False, False),     # a mesh's data x context dimension reduces gradients too
    ("TENSOR_MODEL_PARALLEL_GROUP", True, True),  # tensor parallelism's backward all-reduce, inside a node
    ("mesh_tp", True, True),
    ("default_pg", False, True),            # undescribed: by where it is launched, as without pg_config
    ("TENSOR_AND_DATA_PARALLEL_GROUP", True, False),  # two roles: undescribed, and inside a node
])
def test_all_reduces_of_a_described_group_take_its_role(tmp_path, desc, backward, tensor):
    ar = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)"
    f = diagnose(_in_group(_moe_trace(tmp_path / "g.json.gz", ar, ar, backward=backward), desc)).findings[0]
    assert f.kind == "exposed_comm"
    assert f.evidence["metrics"]["forward_all_reduce_share"]["value"] == pytest.approx(100.0 if tensor else 0.0)
    assert ("tensor parallel" in f.recommendation) == tensor


def test_all_reduces_of_a_handful_of_values_are_not_tensor_parallelism(tmp_path):
    # the forward's all-reduces of one float (a barrier, a loss or metric average, a gradient norm): no layer's
    # activations are 4 bytes. Same gain; the fix is about waiting for the slowest rank, not tensor parallelism's
    ar = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"
    one = {"In msg nelems": 1, "Out msg nelems": 1, "dtype": "Float", "Group size": 8}
    f = diagnose(_moe_trace(tmp_path / "s.json.gz", ar, ar, comm_args=one)).findings[0]
    m = f.evidence["metrics"]
    assert f.kind == "exposed_comm" and f.gain_pct == pytest.approx(100 * 1500 / STEP_US, abs=0.2)
    assert m["forward_all_reduce_share"]["value"] == 0.0 and m["scalar_collectives_share"]["value"] == 100.0
    assert "barrier" in f.recommendation and "tensor parallel" not in f.recommendation
    # 1 Mi floats (4 MiB: a layer's output) stay tensor parallelism's
    big = dict(one, **{"In msg nelems": 1 << 20, "Out msg nelems": 1 << 20})
    f = diagnose(_moe_trace(tmp_path / "b.json.gz", ar, ar, comm_args=big)).findings[0]
    assert f.evidence["metrics"]["forward_all_reduce_share"]["value"] == pytest.approx(100.0)
    assert f.evidence["metrics"]["scalar_collectives_share"]["value"] == 0.0 and "tensor parallel" in f.recommendation
    # without sizes (PyTorch < 2.1), launched inside dist.barrier() (c10d::barrier): a barrier's
    f = diagnose(_moe_trace(tmp_path / "n.json.gz", ar, ar, comm_inside="c10d::barrier")).findings[0]
    assert f.evidence["metrics"]["scalar_collectives_share"]["value"] == 100.0 and "barrier" in f.recommendation


def test_exposed_all_gather_and_reduce_scatter_get_sharded_data_parallel_fixes(tmp_path):
    # the same trace with FSDP's collectives, launched inside a backward node: the next unit's parameters gathered
    # (all-gather), its gradients reduce-scattered. Same gain; the fix names the units' prefetch and
    # reshard_after_forward, not DDP's bucketing
    d = diagnose(_moe_trace(tmp_path / "fsdp.json.gz", "ncclDevKernel_AllGather_RING_LL(x)",
                            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(x)", backward=True))
    f = d.findings[0]
    assert f.kind == "exposed_comm" and f.gain_pct == pytest.approx(100 * 1500 / STEP_US, abs=0.2)
    assert f.evidence["metrics"]["all_gather_reduce_scatter_share"]["value"] == pytest.approx(100.0)
    assert "prefetch" in f.recommendation and "reshard_after_forward" in f.recommendation
    assert "bucket_cap_mb" not in f.recommendation


def _two_stages(tmp_path: Path, last_stage_us: float) -> Path:
    # a forward-only 2-stage pipeline, 4 micro-batches a step: stage 0 computes micro-batch m in 990 us
    # ([T+1000 m + 10, +990)); its transfer (a SendRecv kernel on stream 20 of each rank) starts on each rank when
    # that rank gets to it (stage 0 when m is computed, stage 1 when it is free) and ends 50 us after both are
    # there; stage 1 then computes m in last_stage_us. Each rank ends a step with a sync that returns 5 us after
    # its GPU's last op; the next step starts 10 us after the later of the two.
    out = tmp_path / "pp"
    out.mkdir()
    builders = {r: TraceBuilder(rank=r, world_size=2) for r in (0, 1)}
    send = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    T = 0.0
    for s in range(4):
        free, host = T + 10, T
        for m in range(4):
            ready = T + 1000 * (m + 1)
            done = max(ready, free) + 50
            builders[0].launch(GEMM, host, ready - 990, 990, stream=7)
            builders[0].launch(send, host + 5, ready, done - ready, stream=20)
            builders[1].launch(send, host, free, done - free, stream=20)
            builders[1].launch(GEMM, host + 5, done, last_stage_us, stream=7)
            free = done + last_stage_us
            host += 10
        ends = {0: done + 5, 1: free + 5}
        for r, b in builders.items():
            b.cpu("cudaStreamSynchronize", host, ends[r] - host, cat="cuda_runtime")
            b.step(s, T, max(ends.values()) + 5 - T)
        T = max(ends.values()) + 10
    for r, b in builders.items():
        b.write(out / f"rank{r}.json.gz")
    return out


def test_a_slow_pipeline_stage_is_an_unequal_split(tmp_path):
    # stage 1 computes 1500 us per micro-batch against stage 0's 990: 1.5x its compute (6000 vs 3960 us a
    # step): the straggler, and with send/recv as all its communication the fix is the split of the layers
    d = diagnose(_two_stages(tmp_path, 1500.0))
    f = next(x for x in d.findings if x.kind == "straggler")
    assert f.ranks == [1]
    assert f.evidence["metrics"]["compute_vs_other_ranks"]["value"] == pytest.approx(6000 / 3960, rel=0.01)
    assert "pipeline stage" in f.recommendation and "account_for_loss_in_pipeline_split" in f.recommendation


def test_a_slow_stage_ranks_above_the_send_recv_it_makes_the_others_wait_in(tmp_path):
    # GPipe (tests/trace/pipeline_builder.py), 4 stages, 8 micro-batches, stage 2 1.5x slower (1500-us forwards
    # against 1000). The other stages wait in send/recv for it, which a one-rank replay of their send/recv halved
    # halves too: beside a slow stage the bubble is an upper bound, while stage 2 at the others' pace is measured:
    # (8 x 4500 + 3 x 3000) -> (8 + 3) x 3000 a step by the schedule, 27 % (the replay of stage 2 alone). The slow
    # stage comes first
    d = diagnose(pipeline_job(tmp_path / "slow", [1000.0, 1000.0, 1500.0, 1000.0], micro=8))
    kinds = [f.kind for f in d.findings]
    assert kinds.index("straggler") < kinds.index("pipeline_bubble") and "exposed_comm" not in kinds
    straggler, bubble = d.findings[kinds.index("straggler")], d.findings[kinds.index("pipeline_bubble")]
    assert straggler.ranks == [2] and "pipeline stage" in straggler.recommendation
    assert straggler.gain_pct == pytest.approx(100 * (1 - 33000 / 45000), abs=2.0)
    assert bubble.ranks == [0, 1, 2, 3] and bubble.gain_is_upper_bound
    # balanced stages: the bubble alone, (S - 1) / (M + S - 1) = 3 / 11 of the step; halved (16 micro-batches of
    # half the size, or 2 chunks per rank), a step of (M + S - 1) x 3 ms -> (2M + S - 1) x 1.5 ms: 33 -> 28.5 ms, 13.6 %
    d = diagnose(pipeline_job(tmp_path / "balanced", [1000.0] * 4, micro=8))
    top = d.findings[0]
    assert top.kind == "pipeline_bubble" and "micro-batches" in top.recommendation
    assert top.evidence["metrics"]["exposed_send_recv_share"]["value"] == pytest.approx(100 * 3 / 11, abs=1.5)
    assert top.gain_pct == pytest.approx(100 * (1 - 28.5 / 33), abs=1.0)
    assert "straggler" not in [f.kind for f in d.findings]


def test_a_pipeline_is_told_from_other_send_recv_by_its_later_stages_or_its_schedule(tmp_path):
    # the first stage's own trace shows send/recv waits but not that they are a pipeline's: its steps open on its
    # own forward. With the other stages' traces beside it, the later stages open every step waiting for their input
    # (pipeline.opens_on_receive_share): a pipeline, and the first stage's waits are its bubble too; so are they
    # when the schedule names its actions (torch.distributed.pipelining's "PP:0F3"), with 8 micro-batches a step
    import shutil

    for names in (False, True):
        job = pipeline_job(tmp_path / f"job{names}", [1000.0] * 4, micro=8, schedule_names=names)
        alone = tmp_path / f"first{names}"
        alone.mkdir()
        shutil.copy(job / "rank0.json.gz", alone / "rank0.json.gz")
        first = diagnose(alone).findings[0]
        assert first.kind == ("pipeline_bubble" if names else "exposed_comm")
        if names:
            assert first.evidence["metrics"]["micro_batches_per_step"]["value"] == 8
        whole = diagnose(job).findings[0]
        assert whole.kind == "pipeline_bubble" and whole.ranks == [0, 1, 2, 3]


def test_the_bubble_is_set_against_the_schedules_law_for_the_stages_counted_from_the_ranks(tmp_path):
    # 4 stages x 2 data-parallel copies: 2 ranks open no step on a receive (the copies' first stages), so 8 / 2 = 4
    # stages. With the schedule's names, 8 micro-batches: the law's (4 - 1) / (8 + 4 - 1) = 27.27 %; without them, the
    # micro-batches that make the law give the measured share, ~8
    for names in (True, False):
        d = diagnose(pipeline_job(tmp_path / str(names), [1000.0] * 4, micro=8, replicas=2, schedule_names=names))
        metrics = next(f for f in d.findings if f.kind == "pipeline_bubble").evidence["metrics"]
        assert metrics["pipeline_stages"]["value"] == 4
        if names:
            assert metrics["schedule_bubble"]["value"] == pytest.approx(100 * 3 / 11, abs=0.01)
        else:
            assert metrics["implied_micro_batches"]["value"] == pytest.approx(8, abs=0.6)
    assert stages_from_openings([0.0, 1.0, 1.0, 1.0]) == 4 and stages_from_openings([0.0, 0.0, 1.0]) == 0
    assert stages_from_openings([1.0, 1.0]) == 0 and stages_from_openings([0.0, 1.0, 1.0, 0.0, 1.0, 1.0]) == 3


def _described_groups(job: Path, desc: str) -> Path:
    # the job's send/recv kernels in process group "3", described in each trace's distributedInfo.pg_config as
    # PyTorch >= 2.3 writes it
    for path in job.glob("rank*.json.gz"):
        doc = read_events(path)
        for e in doc["traceEvents"]:
            if e["name"] == SEND_RECV:
                e["args"]["Process Group Name"] = "3"
        doc["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4},
                                               {"pg_name": "3", "pg_desc": desc, "pg_size": 4}]
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return job


def test_a_pipeline_is_told_by_its_process_groups_description(tmp_path):
    # Megatron-LM's PIPELINE_MODEL_PARALLEL_GROUP makes the first stage's trace alone a pipeline of 4 stages (the
    # group's size); DeviceMesh's "mesh_cp" says the send/recv is context parallelism's ring, whatever the steps
    # open on: exposed communication, not a bubble
    import shutil

    job = _described_groups(pipeline_job(tmp_path / "pp", [1000.0] * 4, micro=8), "PIPELINE_MODEL_PARALLEL_GROUP")
    alone = tmp_path / "first"
    alone.mkdir()
    shutil.copy(job / "rank0.json.gz", alone / "rank0.json.gz")
    top = diagnose(alone).findings[0]
    assert top.kind == "pipeline_bubble" and top.evidence["metrics"]["pipeline_stages"]["value"] == 4
    ring = _described_groups(pipeline_job(tmp_path / "cp", [1000.0] * 4, micro=8), "mesh_cp")
    found = diagnose(ring).findings
    assert "pipeline_bubble" not in [f.kind for f in found]
    exposed = next(f for f in found if f.kind == "exposed_comm")
    assert "ring attention" in exposed.recommendation and "micro-batches" not in exposed.recommendation
    t = load_trace(ring / "rank1.json.gz")[1]
    timing = device_timing(t, analysis_window(t))
    assert (timing.p2p_role, timing.p2p_group_size) == ("context", 4) and timing.opens_on_receive == 1.0
    assert p2p_group_role(t, np.array([], dtype=np.int64)) == ("", 0)  # no send/recv, no group


def test_a_first_or_last_stage_is_told_by_its_send_recv_partners(tmp_path):
    # PyTorch >= 2.5 names each send's and recv's partner ("Dst Rank" / "Src Rank") and its group's ranks in order;
    # PyTorch 2.1-2.4 its group's size, and ProcessGroupNCCL's span around each call the ranks within the group
    # ("nccl:send 0->1"). The first stage's trace alone, which opens its steps on its own forward and whose group is
    # not described, sends to and receives from rank 1 alone, the end of a chain of 4: a pipeline of 4 stages, its
    # waits the bubble (without the partners: exposed communication, test_a_pipeline_is_told_from_other_send_recv_...)
    import shutil

    for partners in ("args", "spans"):
        job = pipeline_job(tmp_path / partners, [1000.0] * 4, micro=8, schedule="1f1b", partners=partners)
        for rank in (0, 3):
            alone = tmp_path / f"{partners}{rank}"
            alone.mkdir()
            shutil.copy(job / f"rank{rank}.json.gz", alone / f"rank{rank}.json.gz")
            t = load_trace(alone / f"rank{rank}.json.gz")[rank]
            neighbour = 1 if rank == 0 else 2
            assert peer_exchange(t) == PeerExchange(group=(0, 1, 2, 3), own=rank, sent_to=frozenset({neighbour}),
                                                    received_from=frozenset({neighbour}))
            top = diagnose(alone).findings[0]
            assert top.kind == "pipeline_bubble" and top.evidence["metrics"]["pipeline_stages"]["value"] == 4
        middle = peer_exchange(load_trace(job / "rank1.json.gz")[1])
        assert middle.sent_to == {0, 2} and not pipeline_end(middle)
    # what the partners do not tell: a ring's first rank takes from the last (context parallelism, one way or both);
    # a group of two; a stage that only sends, or takes its input back from the last (a generation pipeline)
    four = (0, 1, 2, 3)
    ring = PeerExchange(group=four, own=0, sent_to=frozenset({1}), received_from=frozenset({3}))
    both_ways = PeerExchange(group=four, own=0, sent_to=frozenset({1, 3}), received_from=frozenset({1, 3}))
    pair = PeerExchange(group=(4, 5), own=4, sent_to=frozenset({5}), received_from=frozenset({5}))
    sends = PeerExchange(group=four, own=0, sent_to=frozenset({1}), received_from=frozenset())
    assert not any(pipeline_end(x) for x in (ring, both_ways, pair, sends))
    chain = (0, 8, 16)  # global ranks 8 apart: one stage a node
    assert not pipeline_end(PeerExchange(group=chain, own=8, sent_to=frozenset({16}), received_from=frozenset({16})))
    assert pipeline_end(PeerExchange(group=chain, own=16, sent_to=frozenset({8}), received_from=frozenset({8})))
    # a group the trace describes keeps its description's role: the same chain described as context parallelism's
    described = _described_groups(tmp_path / "args", "mesh_cp")
    t = load_trace(described / "rank0.json.gz")[0]
    assert pipeline_end(peer_exchange(t)) and device_timing(t, analysis_window(t)).p2p_role == "context"
    generation = pipeline_job(tmp_path / "generation", [1000.0] * 4, micro=4, schedule="forward", partners="args")
    first = peer_exchange(load_trace(generation / "rank0.json.gz")[0])
    assert first.received_from == {3} and not pipeline_end(first)


def _named_actions(path: Path, actions: list[str]) -> ScheduleNames:
    b = TraceBuilder()
    for step in range(3):
        b.step(step, 1000.0 * step, 1000.0)
        for i, name in enumerate(actions):
            b.cpu(name, 1000.0 * step + 10 + 20 * i, 10, cat="user_annotation")
    t = load_trace(b.write(path))[0]
    return schedule_names(t, analysis_window(t))


def test_a_schedules_names_give_its_micro_batches_chunks_and_split_backwards(tmp_path):
    # torch.distributed.pipelining's multi-stage actions on rank 0 of an interleaved schedule over 4 ranks: stages 0
    # and 4 (2 chunks), 3 micro-batches; the law for 4 stages, 3 micro-batches, 2 chunks: 3 / (2 x 3 + 3) = 33.3 %
    sc = _named_actions(tmp_path / "i.json.gz", [f"PP:{st}{x}{m}" for x in "FB" for st in (0, 4) for m in range(3)])
    assert (sc.named, sc.micro_batches, sc.chunks, sc.split_backward) == (True, 3, 2, False)
    assert schedule_bubble_pct(4, 3, 2) == pytest.approx(100 / 3)
    # a zero-bubble schedule splits each backward in its input (I) and weight (W) halves
    sc = _named_actions(tmp_path / "z.json.gz", [f"PP:1{x}{m}" for x in "FIW" for m in range(4)])
    assert (sc.micro_batches, sc.chunks, sc.split_backward) == (4, 1, True)
    # single-stage schedules name "Forward i" / "Backward i"; a user's own "Forward" annotation names none
    assert _named_actions(tmp_path / "s.json.gz", ["Forward 0", "Forward 1", "Backward 1"]).micro_batches == 2
    assert not _named_actions(tmp_path / "n.json.gz", ["Forward", "forward 1"]).named
    # a runtime's other actions name the schedule, not its micro-batches (DualPipeV's overlapped pairs)
    sc = _named_actions(tmp_path / "d.json.gz", ["PP:(0F1;1B0)OVERLAP_F_B", "PP:0SEND_F1"])
    assert sc.named and sc.micro_batches == 0


def test_a_bubble_beside_a_larger_exposed_all_reduce_is_named_with_it(tmp_path):
    # 4 stages x 32 micro-batches, 2 data-parallel copies whose 30-ms gradient all-reduce ends each step: send/recv is
    # 27 % of the communication time, so the all-reduce is exposed_comm's; the bubble is still measured on the
    # send/recv alone: 3 x 3 ms of a 135-ms step, 6.7 %, halved 3.3 %, and priced before overlapping the all-reduce.
    # Overlapping is priced on the all-reduce alone (overlap_comm's rows): hiding the send/recv too would claim the
    # bubble's other half, 3.4 pp more than overlapping the all-reduce gains on its own
    d = diagnose(pipeline_job(tmp_path, [1000.0] * 4, micro=32, replicas=2, all_reduce_us=30_000.0))
    kinds = [f.kind for f in d.findings]
    assert kinds[:2] == ["exposed_comm", "pipeline_bubble"]
    exposed, bubble = d.findings[:2]
    assert exposed.evidence["metrics"]["comm_time"]["value"] == pytest.approx(4 * 30_000, rel=0.01)  # 4 steps analysed
    assert exposed.gain_pct == pytest.approx(exposed.gain_alone_pct, abs=0.01)
    assert bubble.evidence["metrics"]["exposed_send_recv_share"]["value"] == pytest.approx(100 * 9 / 135, abs=0.5)
    assert bubble.gain_pct == pytest.approx(100 * 4.5 / 135, abs=0.3) and bubble.fix_order == 1


def test_a_forward_only_pipeline_has_its_bubble_and_the_serving_fix(tmp_path):
    # generation on 4 stages, 4 micro-batches a step, each step starting once the last stage's output is back at the
    # first: each stage idles (4 - 1) / (4 + 4 - 1) = 42.9 % of the step; halved 21.4 %. A forward-only loop
    # (operators, no backward node or optimizer) gets the serving engines' fix, after the law
    d = diagnose(pipeline_job(tmp_path, [1000.0] * 4, micro=4, schedule="forward", aten_ops=True))
    top = d.findings[0]
    assert top.kind == "pipeline_bubble"
    assert top.evidence["metrics"]["exposed_send_recv_share"]["value"] == pytest.approx(100 * 3 / 7, abs=1.0)
    assert top.gain_pct == pytest.approx(100 * (1 - 5.5 / 7), abs=0.5)
    assert top.recommendation.startswith("With 4 stages") and "max_num_seqs" in top.recommendation
    assert "gradient accumulation" not in top.recommendation


def test_a_pipeline_whose_host_waits_for_each_receive_is_still_its_bubble(tmp_path):
    # Megatron-LM synchronizes the device after each batched send/recv (batch_p2p_sync, on by default): the host of a
    # 1F1B stage blocks in cudaDeviceSynchronize while its receive waits for the neighbour. Those syncs wait for the
    # bubble, not for work the host queued: removing them gains next to nothing (the device still waits for the
    # data), and the bubble stays the finding, priced as without the syncs (14.3 % for 4 stages x 8 micro-batches)
    d = diagnose(pipeline_job(tmp_path, [1000.0] * 4, micro=8, schedule="1f1b", receive_syncs=True))
    top = d.findings[0]
    assert top.kind == "pipeline_bubble" and top.gain_pct == pytest.approx(100 * (1 - 28.5 / 33), abs=1.5)
    assert all(f.severity == "low" for f in d.findings if f.kind == "host_sync")


def test_tensor_parallel_stages_report_their_all_reduce_beside_the_bubble(tmp_path):
    # Megatron's usual layout: 1F1B over 4 stages x 8 micro-batches, each forward and backward ending in a 300-us
    # tensor-parallel all-reduce the stage's next work waits for. Send/recv (the bubble's waits) is most of the
    # communication, yet the all-reduces are exposed_comm's, measured on them alone (32 a step x 300 us, 4 steps) with
    # the shares of the collectives other than send/recv; by the schedule, hiding them on every stage makes a step
    # 11 x 3.0 ms instead of 11 x 3.6 (16.7 %) and halving the bubble 13.6 %: both named, the all-reduces first
    d = diagnose(pipeline_job(tmp_path, [1000.0] * 4, micro=8, schedule="1f1b", tp_all_reduce_us=300.0))
    kinds = [f.kind for f in d.findings]
    assert kinds[:2] == ["exposed_comm", "pipeline_bubble"]
    exposed, bubble = d.findings[:2]
    assert exposed.evidence["metrics"]["comm_time"]["value"] == pytest.approx(4 * 16 * 300, rel=0.01)
    assert exposed.evidence["metrics"]["all_to_all_share"]["unit"] == "% of comm but send/recv"
    assert "mostly send/recv" not in exposed.what_if
    assert bubble.gain_pct == pytest.approx(100 * (1 - 28.5 / 33), abs=1.5)


H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132}
# each activation or gradient: 8,388,608 bf16 values (16.8 MB) between stages on different nodes (ranks 8 apart)
ACROSS_NODES = {"In msg nelems": 8_388_608, "Out msg nelems": 8_388_608, "dtype": "BFloat16", "Group size": 4,
                "Process Group Name": "pp", "Process Group Ranks": "[0, 8, 16, 24]"}


def test_a_pipeline_whose_transfers_crawl_names_the_transport(tmp_path):
    # 16,777,216 B over one H100's 400-Gb/s NIC (50 GB/s one way, catalog): 335.5 us + 10 us fixed = 345.5 us. Sent
    # in 5 ms each (sockets instead of InfiniBand), the send/recv moves its data at 6.9 % of the link's rate: the
    # bubble's fix starts with the transport; in 400 us (86 %) it does not
    for us, slow in ((5000.0, True), (400.0, False)):
        job = pipeline_job(tmp_path / str(us), [10_000.0] * 4, micro=8, transfer_us=us, receive_floor_us=us,
                           transfer_args=ACROSS_NODES)
        for path in job.glob("rank*.json.gz"):
            doc = read_events(path)
            doc["deviceProperties"] = [H100]
            path.write_bytes(gzip.compress(json.dumps(doc).encode()))
        f = next(x for x in diagnose(job).findings if x.kind == "pipeline_bubble")
        m = f.evidence["metrics"]
        assert m["transfer_time_at_link_rate"]["value"] == pytest.approx(100 * 345.5 / us, abs=0.1)
        assert m["scale-out_link"]["value"] == 50
        assert f.recommendation.startswith("The collectives move their data at") == slow


def test_a_one_forward_one_backward_pipeline_has_gpipes_bubble(tmp_path):
    # 1F1B (Megatron's default) keeps fewer micro-batches in flight than GPipe but idles as long: (S - 1) / (M + S - 1)
    # = 3 / 11 of the step for 4 stages x 8 micro-batches. In its steady state a stage also waits out the transfer of
    # what it needs next (TRANSFER_US each), which the law leaves out: the measured bubble is 1.5 pp above it, and
    # halving it gains 14.3 % against the law's 13.6 %
    top = diagnose(pipeline_job(tmp_path, [1000.0] * 4, micro=8, schedule="1f1b")).findings[0]
    assert top.kind == "pipeline_bubble" and top.ranks == [0, 1, 2, 3]
    assert top.evidence["metrics"]["exposed_send_recv_share"]["value"] == pytest.approx(100 * 3 / 11, abs=2.0)
    assert top.gain_pct == pytest.approx(100 * (1 - 28.5 / 33), abs=1.0)


def test_an_interleaved_pipeline_is_a_pipeline_whose_bubble_its_chunks_divide(tmp_path):
    # Megatron's interleaved 1F1B, 4 stages x 2 model chunks x 8 micro-batches: the last stage sends each chunk's
    # activations on to the first (a ring of send/recv, not context parallelism's), and the bubble is
    # (4 - 1) / (2 x 8 + 4 - 1) = 15.8 % of the step by the law, which leaves out the chunks' twice as many transfers
    # in the warm-up (the trace shows 17.6 %). The reference for the gain is the fix simulated: 16 micro-batches of
    # half the work, each transfer half as long (half the bytes), step time against step time
    from statistics import median

    from pipeline_builder import TRANSFER_US

    def step_us(job):
        return median(r.step_time_median_us for r in diagnose(job).ranks)

    job = pipeline_job(tmp_path / "job", [1000.0] * 4, micro=8, schedule="interleaved", chunks=2, schedule_names=True)
    fixed = pipeline_job(tmp_path / "fixed", [500.0] * 4, micro=16, schedule="interleaved", chunks=2,
                         transfer_us=TRANSFER_US / 2)
    d = diagnose(job)
    top = d.findings[0]
    assert top.kind == "pipeline_bubble" and top.ranks == [0, 1, 2, 3]
    m = top.evidence["metrics"]
    assert m["model_chunks_per_rank"]["value"] == 2 and m["micro_batches_per_step"]["value"] == 8
    assert m["schedule_bubble"]["value"] == pytest.approx(100 * 3 / 19, abs=0.01)
    assert m["exposed_send_recv_share"]["value"] == pytest.approx(100 * 3 / 19, abs=2.5)
    assert top.gain_pct == pytest.approx(100 * (1 - step_us(fixed) / step_us(job)), abs=0.5)
    # without the schedule's names the later stages, opening their steps on a receive, still make it a pipeline
    unnamed = pipeline_job(tmp_path / "unnamed", [1000.0] * 4, micro=8, schedule="interleaved", chunks=2)
    assert diagnose(unnamed).findings[0].kind == "pipeline_bubble"


def test_the_first_stage_last_at_the_closing_all_reduce_by_its_schedule_is_no_straggler(tmp_path):
    # 1F1B's first stage runs the last backward, so at the step's closing all-reduce over the stages (Megatron's
    # gradient norm) the other stages wait for it in every step: 3 x 3 ms of drain. It computes what they compute
    # and its GPU idles no longer: its lateness is the bubble's, not a slow rank's (it was named a straggler, 18 %,
    # first). A first stage at 1.5x is still named, by its computation
    d = diagnose(pipeline_job(tmp_path / "equal", [1000.0] * 4, micro=8, schedule="1f1b", norm_all_reduce_us=50.0))
    assert [f.kind for f in d.findings] == ["pipeline_bubble"]
    assert d.findings[0].gain_pct == pytest.approx(100 * (1 - 28.5 / 33), abs=1.0)  # as without the all-reduce
    slow = pipeline_job(tmp_path / "slow", [1500.0] + [1000.0] * 3, micro=8, schedule="1f1b", norm_all_reduce_us=50.0)
    top = diagnose(slow).findings[0]
    assert (top.kind, top.ranks) == ("straggler", [0])
    # a slow middle stage: the first stage is still last at the all-reduce, by the schedule, and the stage that
    # computes longest is sought as where no collective is matched (it was lost: no straggler at all)
    slow = pipeline_job(tmp_path / "mid", [1000.0, 1000.0, 1400.0, 1000.0], micro=8, norm_all_reduce_us=50.0)
    top = diagnose(slow).findings[0]
    assert (top.kind, top.ranks) == ("straggler", [2])


def test_a_slow_one_forward_one_backward_stage_is_priced_near_the_schedule(tmp_path):
    # 1F1B, 4 stages x 16 micro-batches, stage 2 at 1.4x: the schedule's steps are 75.75 ms against 58.75 ms for
    # equal stages, 22.4 % to gain. Every micro-batch passes through the slow stage, so its receives start when it
    # is free: priced from its own replay, 25.7 % (the bubble it leaves behind at 18.1 % ranks below it). With the
    # receives starting before their stage was free (the builder until 2026-12-07), 7.4 %, under the bubble
    steps = {}
    for name, forward in (("equal", [1000.0] * 4), ("slow", [1000.0, 1000.0, 1400.0, 1000.0])):
        d = diagnose(pipeline_job(tmp_path / name, forward, micro=16, schedule="1f1b"))
        steps[name] = d.ranks[0].steady_step_us
    top = d.findings[0]
    assert (top.kind, top.ranks) == ("straggler", [2])
    truth = 100 * (1 - steps["equal"] / steps["slow"])
    assert truth == pytest.approx(22.4, abs=0.1) and truth - 1.0 < top.gain_pct < truth + 4.0


def test_a_slow_first_stage_is_priced_before_overlapping_its_send_recv(tmp_path):
    # 8 stages, the first 1.3x slower: the schedule gives 8 x 3900 + 7 x 3000 -> 15 x 3000 us a step, 13.8 %. On the
    # first stage's own replay, hiding its send/recv first (the gradients it waits for) left its computation at the
    # others' pace 1 % of it: the overlap is priced after the slow stage (findings.BROADER_FIX), which ranks first
    d = diagnose(pipeline_job(tmp_path / "first", [1300.0] + [1000.0] * 7, micro=8))
    top = d.findings[0]
    assert (top.kind, top.ranks) == ("straggler", [0])
    assert top.gain_pct == pytest.approx(top.gain_alone_pct) == pytest.approx(100 * (1 - 45000 / 52200), abs=1.5)


def test_a_stage_that_computes_more_only_in_some_steps_is_no_straggler(tmp_path):
    # stage 1's forwards take 1150, 1060, 900 and 1060 us in the 4 analysed steps (the others' 1000): 1.06x the
    # others' compute at the median, but less than them in step 3: per step +3.6, +1.44, -2.4, +1.44 ms. Shuffling
    # each step's computation among the 4 stages makes one stage stand out as much in ~half of the draws
    # (crossrank.slowest_rank_p_value 0.48): noise. A stage that computes 1.06x in every step is the slowest in all 4
    # steps, which shuffled stages do with chance 4 x (1/4)^4 = 1/64: a straggler
    noisy = [1000.0, [1150.0, 1060.0, 900.0, 1060.0, 1000.0], 1000.0, 1000.0]
    d = diagnose(pipeline_job(tmp_path / "noisy", noisy, micro=8))
    assert "straggler" not in [f.kind for f in d.findings] and d.findings[0].kind == "pipeline_bubble"
    d = diagnose(pipeline_job(tmp_path / "slow", [1000.0, 1060.0, 1000.0, 1000.0], micro=8))
    assert next(f for f in d.findings if f.kind == "straggler").ranks == [1]


def test_balanced_stages_with_noisy_kernels_have_no_straggler(tmp_path):
    # 4 equal stages whose every kernel takes +-1 ms uniform on its 1-ms forward and 2-ms backward (seed 0): stage 1
    # computes 1.06x the others' median by chance and more than their median in all 4 analysed steps, which the
    # recurrence heuristic named a straggler (medium, 4.5 %); it is not the slowest in every step, and within-step
    # shuffles of the stages' computation make one stand out as much often (p > 0.05): the bubble is the finding.
    # The same stages with stage 2 at 1.3x (+-100 us) name stage 2
    d = diagnose(pipeline_job(tmp_path / "balanced", [1000.0] * 4, micro=8, noise_us=1000.0, rng=random.Random(0)))
    assert "straggler" not in [f.kind for f in d.findings] and d.findings[0].kind == "pipeline_bubble"
    d = diagnose(pipeline_job(tmp_path / "slow", [1000.0, 1000.0, 1300.0, 1000.0], micro=8, noise_us=100.0,
                              rng=random.Random(0)))
    assert (d.findings[0].kind, d.findings[0].ranks) == ("straggler", [2])


def test_a_slow_stage_with_data_parallel_copies_names_every_copy(tmp_path):
    # 4 stages x 2 data-parallel copies (rank 4 d + s), stage 2 at 1.3x: ranks 2 and 6 compute alike, 1.3x the other
    # six (+-100 us per kernel), above the widest break of the ranks' median compute: both are the straggler, each
    # priced as its computation at the others' pace (~1.3x: 26 of every 1.3 x 24 ms of GEMMs a step). With +-1 ms
    # per kernel the copies also wait for each other at their gradient all-reduce (the jitter between copies,
    # load_imbalance: no one rank last in most steps), which hid the slow stage before; both are named now
    d = diagnose(pipeline_job(tmp_path / "quiet", [1000.0, 1000.0, 1300.0, 1000.0], micro=8, noise_us=100.0,
                              rng=random.Random(0), replicas=2))
    top = d.findings[0]
    assert (top.kind, top.ranks) == ("straggler", [2, 6])
    assert top.evidence["metrics"]["compute_vs_other_ranks"]["value"] == pytest.approx(1.3, abs=0.02)
    d = diagnose(pipeline_job(tmp_path / "noisy", [1000.0, 1000.0, 1300.0, 1000.0], micro=8, noise_us=1000.0,
                              rng=random.Random(1), replicas=2))
    kinds = {f.kind: f for f in d.findings}
    assert kinds["straggler"].ranks == [2, 6] and "load_imbalance" in kinds


def test_in_a_window_too_short_for_the_test_a_slow_stage_is_the_slowest_in_every_step(tmp_path):
    # 3 analysed steps of 4 stages: shuffled stages put one rank the slowest in all 3 with chance 4 x (1/4)^3 = 1/16,
    # so the test cannot reach 0.05, and a straggler must at least be the slowest in every step. Stage 1's forwards
    # take 1150, 1060 and 980 us (the others' 1000): 1.06x the others at the median step, +3.6, +1.44 and -0.48 ms a
    # step; its recurring extra (0.96 ms) outweighs the opposite excess (0.48), which named it a straggler before;
    # it is not the slowest in step 3: no straggler. At 1060 us in every step it is
    noisy = [1000.0, [1150.0, 1060.0, 980.0, 1000.0], 1000.0, 1000.0]
    d = diagnose(pipeline_job(tmp_path / "noisy", noisy, micro=8, steps=4))
    assert "straggler" not in [f.kind for f in d.findings]
    d = diagnose(pipeline_job(tmp_path / "slow", [1000.0, 1060.0, 1000.0, 1000.0], micro=8, steps=4))
    assert next(f for f in d.findings if f.kind == "straggler").ranks == [1]


def test_of_two_stages_in_a_short_window_the_slow_one_is_the_slower_in_every_step(tmp_path):
    # 2 stages, 4 analysed steps: the sign-flip test cannot go below 2 / 2^4 = 1/8. Stage 1's forwards take 1100 us
    # in 3 steps and 960 in the 4th (+2.4 ms a step thrice, then -0.96): 1.1x at the median step, and its recurring
    # extra (4.8 ms) outweighs the opposite excess, which named it before; it is the faster in step 4: no straggler.
    # At 1100 us in every step it is
    d = diagnose(pipeline_job(tmp_path / "noisy", [1000.0, [1100.0, 1100.0, 1100.0, 960.0, 1000.0]], micro=8))
    assert "straggler" not in [f.kind for f in d.findings]
    d = diagnose(pipeline_job(tmp_path / "slow", [1000.0, 1100.0], micro=8))
    assert next(f for f in d.findings if f.kind == "straggler").ranks == [1]
