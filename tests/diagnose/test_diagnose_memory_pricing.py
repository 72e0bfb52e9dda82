"""memory_bound_unfused priced by its own evidence, on hand-built GPU-bound traces (answers worked by hand).

At the HBM peak: each 2000-us step launches 10 aten::add of two 2^20-element float tensors (10 us apart, launch
2 us into the op, kernel queued 5 us after its launch), then cudaDeviceSynchronize at +100 us; every other add's
kernel is a GEMM's name (not fusable: no two elementwise kernels follow each other, so fusion removes nothing). An
add moves 3 x 4 x 2^20 bytes = 12,582,912 B; at the A100-40GB's 1.555 TB/s that takes 8.0918 us, and each kernel
takes 80 us: 10.115 % of the HBM peak, so the fix is 9.89x faster elementwise kernels (8.09 us). Measured: the
kernels run back to back from +7 us, the last ends at +807, the sync returns 5 us later (+812). Fixed: the first
add ends at +15.09, the next kernel starts at its launch + 5 = +17, and from there the queue never runs dry: 5 x 80
+ 4 x 8.09 us to +449.36, the sync 5 us later (+454.36), 357.64 us sooner per step.

Fused (fusion.fusion_chains): chains of elementwise and reduction kernels back to back on a stream fold into their
reductions, or into their longest kernel when they have none, the others neither launched nor run.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bound import K_US, N, P, STEPS, gpu_bound_trace, queued_steps  # noqa: E402

from trainperf.diagnose.api import diagnose  # noqa: E402

NBYTES = 3 * 4 * (1 << 20)
T_ROOF = NBYTES / 1.555e6  # µs at 1.555 TB/s
KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
          "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
MUL_K = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
         "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3> >(int, at::native::BinaryFunctor<"
         "float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3>)")
GELU_K = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
          "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2> >(int, "
          "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() "
          "const::{lambda(float)#1}, std::array<char*, 2>)")
REDUCTION_K = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
               "float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, "
               "float, float, float>, unsigned int, float, 4>)")
GEMM = "ampere_sgemm_128x64_tn"


def _trace(path: Path, shapes: bool = True) -> Path:
    args = {"Input Dims": [[1 << 20], [1 << 20], []], "Input type": ["float", "float", "Scalar"]} if shapes else None
    return gpu_bound_trace(path, op="aten::add", kernel=KERNEL, device={"id": 0, "name": "NVIDIA A100-SXM4-40GB"},
                           op_args=args, every_other_kernel=GEMM)


def _finding(d):
    return next((x for x in d.findings if x.kind == "memory_bound_unfused"), None)


def test_memory_bound_is_priced_at_the_hbm_peak(tmp_path):
    f = _finding(diagnose(_trace(tmp_path)))
    hbm = f.evidence["metrics"]["achieved_bandwidth"]["value"]
    assert hbm == pytest.approx(100.0 * T_ROOF / K_US, abs=0.01)
    assert "fusable_chains" not in f.evidence["metrics"]
    n = len(f.steps)
    assert n == STEPS - 1
    span = n * P  # the analysed steps, each closed by its Python after the sync, which no fix moves
    fixed_end = 7.0 + T_ROOF + (17.0 - (7.0 + T_ROOF)) + (N // 2) * K_US + (N // 2 - 1) * T_ROOF + 5.0
    gain = n * ((7.0 + K_US * N + 5.0) - fixed_end)
    assert f.gain_alone_pct == pytest.approx(100.0 * gain / span, abs=0.01)
    assert f.gain_is_upper_bound


def test_without_shapes_or_runs_it_is_reported_unpriced(tmp_path):
    f = _finding(diagnose(_trace(tmp_path, shapes=False)))
    assert f.gain_pct == 0.0 and f.severity == "low" and f.what_if.startswith("not priced")


def _run_trace(folder: Path, kernels: list[tuple[str, float]]) -> Path:
    # 5 GPU-bound steps of 2000 us, each launching the kernels ((name, us)) from aten ops 10 us apart from T, queued
    # back to back from T+10; a cudaDeviceSynchronize from T+60 returns 5 us after the last; Python to the next step
    return queued_steps(folder, [("aten::op", {}, name, us) for name, us in kernels], steps=STEPS, step_us=P)


def test_a_run_is_fused_into_its_reduction_or_its_longest_kernel(tmp_path):
    # GEMM 400, then an add 100, a reduction 150, a multiply 100 and a GELU 50 back to back, then GEMM 400 (their
    # 400 us are a third of the 1200 busy: over the 25 % bar). Fused, the run is its reduction: 250 us of kernels
    # gone from each 2000-us step, whose device work, queued, ends that much sooner: 12.5 %. Without a reduction
    # (add 100, multiply 60, GELU 30 between GEMMs of 200) the run is its longest kernel: 90 us gone, 4.5 %
    for name, gemm_us, run, gone in (
            ("reduction", 400.0, [(KERNEL, 100.0), (REDUCTION_K, 150.0), (MUL_K, 100.0), (GELU_K, 50.0)], 250.0),
            ("pointwise", 200.0, [(KERNEL, 100.0), (MUL_K, 60.0), (GELU_K, 30.0)], 90.0)):
        (tmp_path / name).mkdir()
        f = _finding(diagnose(_run_trace(tmp_path / name, [(GEMM, gemm_us), *run, (GEMM, gemm_us)])))
        m, n = f.evidence["metrics"], len(f.steps)  # one run in each analysed step
        assert m["fusable_chains"]["value"] == n and m["kernels_in_chains"]["value"] == n * (3 + (name == "reduction"))
        assert m["their_time"]["value"] == pytest.approx(n * gone)
        # named by the operators that launched the chain, the same chain of every step once
        chain = " > ".join(["op"] * (3 + (name == "reduction")))
        assert f.evidence["events"][0]["name"] == f"{n * gone / 1e3:.2f} ms folded in {n} chains: {chain}"
        assert f.gain_alone_pct == pytest.approx(100.0 * gone / P, abs=0.01), name
        assert f.gain_is_upper_bound and "not priced" not in f.what_if


def test_kernels_with_other_work_between_them_or_on_other_tensors_are_no_chain(tmp_path):
    # adds each between two GEMMs: half the busy time, but no two back to back; and a multiply then an add repeated
    # twice between two GEMMs (the same ops on 2 tensors, a per-parameter loop): 2 chains of 2, each fused into its
    # longest, the multiply of 60: 2 x 40 us gone, not the whole run but its longest kernel
    f = _finding(diagnose(_run_trace(tmp_path, [(GEMM, 100.0), (KERNEL, 100.0)] * 3)))
    assert f.gain_pct == 0.0 and f.what_if.startswith("not priced")
    (tmp_path / "loop").mkdir()
    f = _finding(diagnose(_run_trace(tmp_path / "loop", [(GEMM, 200.0), *[(MUL_K, 60.0), (KERNEL, 40.0)] * 2,
                                                          (GEMM, 200.0)])))
    assert f.evidence["metrics"]["fusable_chains"]["value"] == 2 * len(f.steps)
    assert f.gain_alone_pct == pytest.approx(100.0 * 2 * 40.0 / P, abs=0.01)
