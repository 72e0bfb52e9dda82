"""Software stacks: what a training framework fuses, overlaps and launches, as physical features.

A stack is not a fudge factor: each field is a quantity the time model prices with the
hardware's own rates (bytes at HBM bandwidth, FLOPs at the attention kernel's rate, kernel
launches on the host, collectives on the links).

* Elementwise bytes: bytes read + written per element of the tensor, forward (backward is
  priced at 2x). Fused kernels (TransformerEngine, apex, XLA, Inductor) read the bf16 input
  once and write the output once; eager PyTorch runs one kernel per operator and up-casts
  to fp32. Counted operator by operator (sources in each stack's comment):

  - RMSNorm eager (``torch.nn.RMSNorm`` composite / HF ``LlamaRMSNorm``): to fp32 (r2 w4),
    pow (r4 w4), mean (r4), x*rsqrt (r4 w4), type_as (r4 w2), *weight (r2 w2) = 36 B;
    fused: r2 w2 = 4 B.
  - RoPE eager (torchtitan complex form): .float() (r2 w4), complex multiply (r4 w4),
    type_as (r4 w2) = 20 B per q/k element; fused: 4 B.
  - SwiGLU eager ``silu(w1 x) * w3 x``: silu (r2 w2) + mul (r4 w2) = 10 B per ffn element;
    fused: read gate and up, write once = 6 B.
  - Cross-entropy per logit: fused vocab-parallel (Megatron) 24 B; eager ``.float()`` +
    log_softmax + its backward + cast back ~36 B.
  - Attention scores without flash attention, per score element between the two batched
    GEMMs: Megatron's fused scale-mask-softmax (read 2, write 2) with dropout (mask 1, apply
    r2 w2) ~9 B; eager Hugging Face ``LlamaAttention`` (transformers 4.3x): ``/ sqrt(d)`` (r2
    w2), ``+ attention_mask`` (r2 + r2, w2), ``softmax(dtype=float32)`` (r2 w4), ``.to(bf16)``
    (r4 w2) = 22 B.

* Attention kernel: ``best`` (cuDNN / FlashAttention-3 on Hopper, FA2 on Ampere: the
  catalog's ``attn_eff``), ``fa2`` (FlashAttention-2, what PyTorch SDPA dispatches to: the
  catalog's ``fa2_eff``, lower on Hopper/Blackwell where FA2 cannot use wgmma/TMA), ``math``
  (no flash: the score matrix is materialised in HBM, as in 2021-22 Megatron-LM).
* Host: kernels launched per layer forward (backward 2x) and the CPU time to issue one;
  when issuing takes longer than the GPU work the difference is exposed.
* Overlap: share of tensor-parallel collectives hidden behind GEMMs (TE userbuffers with
  sequence parallel), whether data-parallel / FSDP collectives overlap backward and forward,
  whether pipeline sends overlap compute.
* Optimizer: bytes moved per local parameter by the Adam step; gradient reduction width.
* fp8 casts: Hopper's fp8 GEMMs take both operands K-major, so every fp8 GEMM input is
  written twice in fp8 (row- and column-wise, 1 B each). Fused stacks emit them from the
  kernel that produces the input (TransformerEngine's LayerNormLinear / LayerNormMLP and
  fp8-output activations, XLA's and Inductor's convert fusion): the two 1 B writes replace
  the 2 B bf16 write, so only the attention output, which the flash-attention kernel writes
  in bf16, needs its own pass (read 2 B, write 1 + 1 B). Unfused stacks pay that pass for
  every GEMM input (``fp8_cast_fused=False``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from trainperf.errors import TrainperfError

RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe")  # Megatron-Core's names


def recompute_module_set(modules) -> frozenset:
    """Return the selective-recompute modules named by ``modules`` ("core_attn+moe_act" or an iterable).

    Raises TrainperfError naming an unknown module and listing Megatron-Core's names.
    """
    names = [modules] if isinstance(modules, str) else list(modules)
    out = frozenset(n.strip().lower() for part in names for n in part.replace(",", "+").replace(" ", "+").split("+")
                    if n.strip())
    unknown = sorted(out - set(RECOMPUTE_MODULES))
    if unknown:
        raise TrainperfError(f"recompute modules: unknown {', '.join(unknown)} (known: {', '.join(RECOMPUTE_MODULES)})")
    return out


ATTENTION_KERNELS = ("best", "fa2", "math")


@dataclass(frozen=True, kw_only=True)
class Software:
    """One software stack's physical features (bytes, counts, seconds, fractions)."""

    name: str = "megatron-core"
    attention: str = "best"             # best | fa2 | math (see module docstring)
    norm_bytes: float = 4.0             # bytes per hidden element per norm, forward
    rope_bytes: float = 4.0             # bytes per q/k element, forward
    act_bytes: float = 6.0              # bytes per ffn element of a gated MLP, forward (plain GELU: 4)
    ce_bytes_per_logit: float = 24.0    # cross-entropy forward + backward, per logit
    score_bytes: float = 9.0            # bytes per attention score element, forward, without flash attention
    kernels_per_layer: float = 20.0     # kernels launched per layer, forward (backward: 2x)
    host_s_per_kernel: float = 5e-6     # CPU seconds to issue one kernel
    tp_overlap: float = 1.0             # share of TP collective time hidden (needs sequence parallel; fitted
                                        # for megatron-core; its SM cost is Efficiency.comm_sm_share)
    dp_overlap: bool = True             # DP/FSDP collectives overlap backward / forward
    p2p_overlap: bool = True            # pipeline sends overlap compute
    ep_overlap: float = 0.0             # share of MoE all-to-all hidden behind compute (DualPipe-style: ~1)
    optimizer_bytes_per_param: float = 34.0  # Adam step, bytes per local parameter
    grad_reduce_bytes: int = 2          # bytes per gradient element on the wire
    dropout: bool | None = None         # None: GPT-style models (linear biases) use dropout
    fp8_cast_fused: bool = True         # fp8 quantisation of GEMM inputs fused into the producing kernel
                                        # (module docstring); False: a separate cast pass per GEMM input
    # memory features (plan/memory.py MemoryFeatures)
    fp32_params: bool = False           # parameters kept in fp32 as the master weights (4 B + 8 B Adam):
                                        # FSDP2 mixed precision, JAX/MaxText; else bf16 weights + fp32 master copy
    caching_allocator: bool = True      # PyTorch's caching allocator (fragmentation margin); False: XLA buffers
    tp_shards_activations: bool = False  # hidden-wide activations split over tp without sp (GSPMD: MaxText maps
                                         # 'activation_embed' to the tensor axis)
    recompute_modules: str = "core_attn"  # selective recompute's modules, "+"-joined (Megatron-Core
                                          # --recompute-modules: core_attn, layernorm, mla_up_proj, moe_act, mlp, moe)
    eager_activations: bool = False     # unfused norms keep fp32 copies, SwiGLU keeps silu's output (eager PyTorch)
    moe_probs_in_activation: bool = False  # routing probabilities applied in the experts' activation (Megatron-Core
                                           # >= 0.13): the MoE combine keeps no expert outputs
    zero: int = 1                       # ZeRO stage of a layout that does not say (plan/implied.py): Megatron's
                                        # distributed optimizer (1); PyTorch FSDP, MaxText's fsdp axis (3)
    pue: float = 1.2                    # data-centre power usage effectiveness for kWh
    description: str = ""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KERNELS:
            raise TrainperfError(f"stack {self.name!r}: attention must be one of {', '.join(ATTENTION_KERNELS)}")
        if not 0.0 <= self.tp_overlap <= 1.0:
            raise TrainperfError(f"stack {self.name!r}: tp_overlap must be within 0..1")
        if self.zero not in (0, 1, 2, 3):
            raise TrainperfError(f"stack {self.name!r}: zero must be 0, 1, 2 or 3, got {self.zero}")
        recompute_module_set(self.recompute_modules)

    @property
    def flash_attention(self) -> bool:
        """True when the attention kernel never materialises the score matrix."""
        return self.attention != "math"

    def uses_dropout(self, linear_bias: bool) -> bool:
        """True when the model trains with dropout: as stated, else GPT-style models (``linear_bias``) do.
        The one rule the time model and the memory model both read."""
        return linear_bias if self.dropout is None else self.dropout

    def to_dict(self) -> dict:
        """Return the stack's features as a plain dict."""
        return asdict(self)


_EAGER = dict(norm_bytes=36.0, rope_bytes=20.0, act_bytes=10.0, ce_bytes_per_logit=36.0, score_bytes=22.0)

STACKS: dict[str, Software] = {s.name: s for s in [
    Software(
        name="megatron-core", moe_probs_in_activation=True, description="Megatron-Core / NeMo with TransformerEngine: fused kernels, "
        "cuDNN flash attention, TP comm overlap, overlapped grad reduce / param gather and p2p"),
    Software(
        name="megatron-2021", attention="math", fp8_cast_fused=False, tp_overlap=0.0, dp_overlap=False, p2p_overlap=False,
        kernels_per_layer=25.0, description="Megatron-LM 2021-22 (SC21, Korthikanti et al.): apex fused "
        "layer norm and bias-GELU, no flash attention, no communication overlap"),
    Software(
        name="deepspeed", attention="math", fp8_cast_fused=False, tp_overlap=0.0, p2p_overlap=False, kernels_per_layer=30.0,
        host_s_per_kernel=8e-6, description="Megatron-DeepSpeed / DeepSpeed ZeRO 1-3 and its pipeline "
        "engine: fused norms, no flash attention (2021-23 recipes), ZeRO overlap_comm, blocking p2p"),
    Software(
        name="deepspeed-hf", fp8_cast_fused=False, tp_overlap=0.0, dp_overlap=False, p2p_overlap=False,
        kernels_per_layer=40.0, host_s_per_kernel=8e-6, **_EAGER, attention="math", eager_activations=True,
        description="the DeepSpeed engine (ZeRO 1-3) around an eager Hugging Face transformers model: "
        "unfused norms, RoPE and SwiGLU, eager attention unless the job enables FlashAttention-2 "
        "(attention=fa2), gradients reduced in the model dtype; ZeRO collectives priced as not hidden: "
        "ZeRO-3 gathers each submodule's parameters from its forward/backward hook and waits for "
        "them, ZeRO-1/2 gather the updated parameters after the optimizer step (overlap_comm can "
        "hide part of the gradient reduction: an upper bound there)"),
    Software(
        name="pytorch-fsdp", attention="fa2", fp8_cast_fused=False, tp_overlap=0.0, p2p_overlap=False, kernels_per_layer=40.0,
        host_s_per_kernel=8e-6, optimizer_bytes_per_param=32.0, grad_reduce_bytes=4, **_EAGER,
        fp32_params=True, eager_activations=True, zero=3,
        description="eager PyTorch with FSDP/FSDP2 (torchtitan eager, HF + accelerate): unfused norms, "
        "RoPE and SwiGLU, SDPA FlashAttention-2, fp32 gradient reduction, fused AdamW"),
    Software(
        name="pytorch-fsdp-compile", attention="fa2", tp_overlap=0.0, p2p_overlap=False,
        kernels_per_layer=14.0, host_s_per_kernel=4e-6, optimizer_bytes_per_param=32.0, grad_reduce_bytes=4,
        ce_bytes_per_logit=36.0, fp32_params=True, zero=3, description="PyTorch FSDP2 with torch.compile per block (torchtitan "
        "style): Inductor-fused elementwise, SDPA FlashAttention-2, eager loss, fp32 gradient reduction"),
    Software(
        name="jax", tp_overlap=0.0, p2p_overlap=False, kernels_per_layer=14.0, host_s_per_kernel=0.0,
        optimizer_bytes_per_param=32.0, grad_reduce_bytes=4, fp32_params=True, caching_allocator=False,
        tp_shards_activations=True, zero=3, description="JAX/XLA (MaxText): XLA-fused "
        "elementwise, cuDNN/Pallas flash attention, one compiled step (no per-kernel host cost), "
        "async collectives overlapped by XLA, fp32 weights and gradients"),
]}
DEFAULT_STACK = "megatron-core"


def get_stack(name: str | None = None) -> Software:
    """Return the named stack (default ``megatron-core``), features optionally overridden.

    ``"megatron-core:ep_overlap=1,attention=fa2"`` is Megatron-Core with the MoE all-to-all
    hidden (DualPipe-style) and FlashAttention-2: a stack is its features, and a job that
    sets a switch differently says so. Raises TrainperfError (one line) for an unknown stack,
    feature or value, listing the known ones.
    """
    text = (name or DEFAULT_STACK).strip()
    base, _, over = text.partition(":")
    key = base.strip().lower().replace("_", "-")
    if key not in STACKS:
        raise TrainperfError(f"unknown stack {base!r} (known: {', '.join(STACKS)})")
    sw = STACKS[key]
    if not over.strip():
        return sw
    kw: dict = {}
    types = {f.name: bool if getattr(sw, f.name) is None else type(getattr(sw, f.name))
             for f in fields(Software) if f.name not in ("name", "description")}
    for item in filter(None, (p.strip() for p in over.split(","))):
        k, eq, v = (x.strip() for x in item.partition("="))
        if not eq or k not in types:
            raise TrainperfError(f"stack {text!r}: {item!r} is not feature=value (features: {', '.join(types)})")
        try:
            if types[k] is bool:
                if v.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(v)
                kw[k] = v.lower() in ("1", "true", "yes", "on")
            elif types[k] in (int, float):
                kw[k] = types[k](float(v)) if types[k] is int else float(v)
            else:
                kw[k] = v
        except ValueError:
            raise TrainperfError(f"stack {text!r}: bad value {v!r} for {k}") from None
    return replace(sw, name=f"{key}:{','.join(f'{k}={v}' for k, v in kw.items())}", **kw)


def with_features(sw: Software, **kw) -> Software:
    """Return ``sw`` with some features replaced (validation uses it to state a source's switches)."""
    return replace(sw, **kw)
