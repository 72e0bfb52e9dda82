"""Apply a Layout to the model, in torchtitan's order: TP, activation checkpointing, compile, FSDP/DDP.

Supported by the reference trainer: tp (DTensor, Megatron column/row split of attention and
MLP), dp with zero=0 (DDP), zero=1/2 (FSDP2 without resharding after forward: gradients and
optimizer states sharded, a superset of ZeRO-1) and zero=3 (FSDP2 full shard),
recompute none/selective (attention core)/full (whole block), sequence parallel with tp.
pp, cp and fp8 are planner vocabulary that this trainer does not run; they raise a clear
error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainperf.errors import TrainperfError
from trainperf.specs import Layout, ModelSpec, layout_problems
from trainperf.train.model import Transformer


@dataclass
class ParallelDims:
    """The resolved layout of this job and this process's place in it."""

    layout: Layout
    world_size: int
    rank: int
    mesh: object | None  # DeviceMesh with dims ("dp", "tp"), None for one process

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def dp_rank(self) -> int:
        """This process's index along data parallel."""
        return self.mesh["dp"].get_local_rank() if self.mesh is not None else 0

    @property
    def strategy(self) -> str:
        """The data-parallel wrapper this layout uses: none, ddp, fsdp-no-reshard or fsdp."""
        if self.dp == 1:
            return "none"
        if self.layout.zero == 0:
            return "ddp"
        return "fsdp" if self.layout.zero == 3 else "fsdp-no-reshard"


def resolve_layout(layout: Layout, spec: ModelSpec, world_size: int) -> Layout:
    """Return ``layout`` resolved for ``world_size`` processes; raise TrainperfError naming every
    reason it cannot run here (``specs.layout_problems``, the trainer's rules)."""
    problems = layout_problems(spec, layout, world_size, for_trainer=True)
    if problems:
        raise TrainperfError("layout: " + "; ".join(problems))
    return layout.resolve(world_size)


def build_mesh(layout: Layout, device_type: str):
    """Return the ("dp", "tp") DeviceMesh of the initialised process group, or None for one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))


def _replace_blocks(model: Transformer, fn) -> None:
    for name, blk in list(model.layers.items()):
        model.layers[name] = fn(blk)


def apply_tp(model: Transformer, tp_mesh, sequence_parallel: bool = False) -> None:
    """Shard attention and MLP Megatron-style: q/k/v and w1/w3 by columns, wo and w2 by rows.

    With ``sequence_parallel`` (Korthikanti et al.) the residual stream between the blocks
    and the norms are sharded along the sequence: each block all-gathers its input before
    the column-parallel projections and reduce-scatters after the row-parallel ones. The
    embedding and the LM head stay replicated (the tied presets share one weight).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    if not sequence_parallel:
        plan = {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        }
        for blk in model.layers.values():
            parallelize_module(blk, tp_mesh, plan)
        return
    seq = Shard(1)
    plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=seq),
    }
    for blk in model.layers.values():
        parallelize_module(blk, tp_mesh, plan)
    first = next(iter(model.layers))
    parallelize_module(model, tp_mesh, {
        # the embedding output (replicated) enters the first block as this rank's sequence shard
        f"layers.{first}": PrepareModuleInput(input_layouts=(Replicate(), None, None),
                                              desired_input_layouts=(seq, None, None), use_local_output=True),
        "norm": SequenceParallel(),
        "output": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                     use_local_output=True),
    })


def apply_ac(model: Transformer, recompute: str) -> None:
    """Activation checkpointing: ``full`` wraps every block, ``selective`` the attention core only."""
    if recompute == "selective":
        for blk in model.layers.values():
            blk.attention.recompute_core = True
    elif recompute == "full":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        _replace_blocks(model, lambda blk: checkpoint_wrapper(blk, preserve_rng_state=False))


def apply_compile(model: Transformer, backend: str) -> None:
    """torch.compile every block separately (fast compile, the graph reused across layers)."""
    _replace_blocks(model, lambda blk: torch.compile(blk, backend=backend, fullgraph=True))


def _fsdp_api():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def apply_fsdp(model: Transformer, dp_mesh, reshard_after_forward: bool, param_dtype: torch.dtype | None) -> None:
    """FSDP2 ``fully_shard`` per block, then the root (embedding, final norm, head)."""
    fully_shard, MixedPrecisionPolicy = _fsdp_api()
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for blk in model.layers.values():
        fully_shard(blk, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)


def _low_precision_dtype(precision: str) -> torch.dtype | None:
    """Return the compute dtype of a mixed-precision ``precision`` (bf16, fp16); None for fp32."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def parallelize(model: Transformer, dims: ParallelDims, device: torch.device, compile_backend: str | None) -> nn.Module:
    """Return the model with TP, AC, compile and FSDP/DDP applied in that order (torchtitan's)."""
    layout = dims.layout
    if dims.tp > 1:
        apply_tp(model, dims.mesh["tp"], sequence_parallel=layout.sp)
    apply_ac(model, layout.recompute)
    if compile_backend:
        apply_compile(model, compile_backend)
    strategy = dims.strategy
    if strategy.startswith("fsdp"):
        apply_fsdp(model, dims.mesh["dp"], reshard_after_forward=strategy == "fsdp",
                   param_dtype=_low_precision_dtype(layout.precision))
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        # the model's only buffers are its rotary tables, computed alike on every rank and never changed: DDP's default
        # broadcast of them from rank 0 before every forward is work for nothing (diagnose's ddp_buffer_broadcast);
        # gradients as views of the all-reduce buckets: no copy of each reduced gradient out of its bucket every step
        # and one gradient-sized buffer less (diagnose's ddp_gradient_copies; the optimizer sets them to None, which
        # DDP re-points at the buckets)
        return DDP(model, device_ids=ids, process_group=dims.mesh["dp"].get_group(), broadcast_buffers=False,
                   gradient_as_bucket_view=True)
    return model


def autocast_dtype(dims: ParallelDims) -> torch.dtype | None:
    """Return the autocast dtype (bf16/fp16) when mixed precision is not already done by FSDP."""
    if dims.strategy.startswith("fsdp"):
        return None
    return _low_precision_dtype(dims.layout.precision)


def no_grad_sync(model: nn.Module, enabled: bool):
    """Return a context that skips the gradient all-reduce (gradient accumulation micro-steps)."""
    from contextlib import contextmanager, nullcontext

    if not enabled:
        return nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2

        @contextmanager
        def _fsdp():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return _fsdp()
    return nullcontext()


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip gradients to a global L2 norm ``max_norm``; return the norm before clipping.

    Gradients may be plain tensors and DTensors on different meshes (TP shards beside
    replicated norms and embeddings): the norm is taken per group and combined.
    """
    groups: dict[object, list[nn.Parameter]] = {}
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        key = (id(g.device_mesh), tuple(g.placements)) if hasattr(g, "device_mesh") else "local"
        groups.setdefault(key, []).append(p)
    norms = []
    for group in groups.values():
        n = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0)
        if hasattr(n, "full_tensor"):
            n = n.full_tensor()
        norms.append(n.float())
    if not norms:
        return torch.zeros(())
    total = torch.linalg.vector_norm(torch.stack(norms))
    if max_norm > 0:
        for group in groups.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total
