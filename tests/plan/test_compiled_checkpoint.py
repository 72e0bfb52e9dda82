"""Full activation checkpointing under torch.compile re-runs the forward GEMMs, as the time model prices it.

The planner prices ``recompute=full`` as one more forward of every layer for every stack, compiled
ones included (plan/estimate.py). KempnerForge (a pytorch-fsdp-compile source of the dev rows)
wraps each block in ``checkpoint_wrapper(NO_REENTRANT)`` and then compiles the whole model; if
torch.compile's min-cut partitioner kept the GEMM outputs of checkpointed blocks instead, those rows
would need another price. Reference: the matmuls in the forward and backward graphs AOTAutograd
hands to the compiler, with inductor's partitioner, counted against the same model unwrapped.
"""

from functools import partial

import pytest

torch = pytest.importorskip("torch")


def _matmuls(checkpointed: bool) -> dict:
    import torch.nn as nn
    import torch.nn.functional as F
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                             apply_activation_checkpointing,
                                                                             checkpoint_wrapper)

    class Block(nn.Module):  # Llama-style: RMSNorm, q/k/v/o, causal SDPA, SwiGLU (7 GEMMs)
        def __init__(self, d=32, f=64):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
            self.w1, self.w3 = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
            self.w2 = nn.Linear(f, d, bias=False)

        def forward(self, x):
            h = self.n1(x)
            b, t, d = h.shape
            q, k, v = (p(h).view(b, t, 2, d // 2).transpose(1, 2) for p in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.o(a)
            h = self.n2(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block())
    if checkpointed:
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, Block))
    counts = {"fw": 0, "bw": 0}
    mm = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)

    def counting(name):
        def compiler(gm, _inputs):
            counts[name] += sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in mm)
            return gm.forward
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=counting("fw"), bw_compiler=counting("bw"),
                           partition_fn=min_cut_rematerialization_partition)
    x = torch.randn(2, 16, 32, requires_grad=True)
    torch.compile(model, backend=backend)(x).sum().backward()
    return counts


@pytest.mark.slow
def test_compiled_full_checkpointing_reruns_the_forward_gemms():
    plain, ckpt = _matmuls(False), _matmuls(True)
    assert plain["fw"] == ckpt["fw"] == 14                 # 7 GEMMs per block, 2 blocks
    assert plain["bw"] == 2 * plain["fw"]                   # dgrad + wgrad per GEMM
    # re-run forward: at least every GEMM whose output the backward reads (all but each block's last, w2)
    assert ckpt["bw"] - plain["bw"] >= 12
