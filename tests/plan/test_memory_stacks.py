"""Memory features that differ between stacks and accelerators (issue 11): fp32 parameters as the
master weights, Megatron-Core's selective recompute modules, XLA's allocator and the TPU runtime reserve.

References: PyTorch's own AdamW state (m and v, fp32), Megatron-Core's ``--recompute-modules``
(core_attn / mlp / moe re-run the module; layernorm / mla_up_proj / moe_act discard the module's
output), the TPU runtime's bytes_limit readings (catalog.yaml), and three published runs that fit
(KempnerForge Llama-3 8B on one H200, MaxText 64B on TPU v5e-256, DeepSeek-V3 with NVIDIA's H100 recipe).
"""

import pytest

from trainperf.errors import TrainperfError
from trainperf.hardware import get_accelerator
from trainperf.plan import memory
from trainperf.plan.stacks import get_stack
from trainperf.specs import Layout, LayoutArrays, ModelSpec

LLAMA8B = ModelSpec(name="llama3-8b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
                    vocab=128256, seq_len=4096)
DSV3 = ModelSpec(name="dsv3", n_layers=61, hidden=7168, n_heads=128, n_kv_heads=128, ffn_hidden=18432, vocab=129280,
                 seq_len=4096, head_dim=192, n_experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn_hidden=2048,
                 n_dense_layers=3, q_lora_rank=1536, kv_lora_rank=512, qk_rope_dim=64, v_head_dim=128)


def test_fp32_params_state_bytes_match_torch_adamw():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(64, 32)  # fp32 parameters: the master weights themselves
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    adam = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if t.dim() > 0)
    w, g, o = memory.model_state_terms(n, 1, 0, grad_bytes=4.0, fp32_params=True)
    assert (float(w), float(g), float(o)) == (weights, grads, adam)  # 4 + 4 + 8 B per parameter
    # bf16 weights beside an fp32 master copy (Megatron-Core, DeepSpeed): 2 + 12 B, and ZeRO shards as before
    assert float(memory.model_state_bytes(1e9, 8, 3, 4.0, fp32_params=True)) == pytest.approx(16e9 / 8)
    assert float(memory.model_state_bytes(1e9, 8, 1, 4.0, fp32_params=True)) == pytest.approx((4 + 4 + 8 / 8) * 1e9)


def test_recompute_modules_free_what_they_discard_by_hand():
    tp, sp = 2, True
    h, q, kv = DSV3.hidden, DSV3.q_dim, DSV3.kv_dim
    share = DSV3.n_moe_layers / DSV3.n_layers
    assert float(memory.recompute_dropped(DSV3, tp, sp, "core_attn")) == 0.0
    assert float(memory.recompute_dropped(DSV3, tp, sp, "layernorm")) == pytest.approx(4 * h / tp)  # 2 norm outputs
    assert float(memory.recompute_dropped(DSV3, tp, False, "layernorm")) == pytest.approx(4 * h)    # not sp-split
    assert float(memory.recompute_dropped(DSV3, tp, sp, "mla_up_proj")) == pytest.approx((2 * q + 4 * kv) / tp)
    assert float(memory.recompute_dropped(DSV3, tp, sp, "moe_act")) == pytest.approx(2 * 8 * 2048 * share / tp)
    assert float(memory.recompute_dropped(DSV3, tp, sp, "moe_act", fp8=True)) == pytest.approx(8 * 2048 * share / tp)
    # the whole MoE layer re-run: fc1 outputs + activation (6 B per ffn element) and permuted in / combined out
    moe = (6 * (8 * 2048 + 2048) + 4 * h * 8) * share / tp
    assert float(memory.recompute_dropped(DSV3, tp, sp, "moe+moe_act")) == pytest.approx(moe)
    assert float(memory.recompute_dropped(LLAMA8B, 1, False, "mla_up_proj")) == 0.0  # no MLA: nothing to drop
    assert float(memory.recompute_dropped(LLAMA8B, 1, False, "mlp")) == pytest.approx(6 * 14336)
    with pytest.raises(TrainperfError, match="unknown attn"):
        memory.recompute_module_set("attn+core_attn")


def test_recompute_frees_what_eager_modules_keep():
    # eager SwiGLU keeps silu's output as well (8 B per ffn element, not 6); eager RMSNorm its fp32 copies
    # (6 B per hidden element per norm, not 2): re-running the module frees them (H4, issue 11 review)
    h, f = LLAMA8B.hidden, LLAMA8B.ffn_hidden
    assert float(memory.recompute_dropped(LLAMA8B, 1, False, "mlp", eager=True)) == pytest.approx(8 * f)
    assert float(memory.recompute_dropped(LLAMA8B, 2, True, "layernorm", eager=True)) == pytest.approx(2 * 6 * h / 2)
    # what recompute frees never exceeds what the layer keeps, eager or fused
    for eager in (False, True):
        kept, _, _ = memory.activation_parts(LLAMA8B, 1, False, eager=eager)
        freed = memory.recompute_dropped(LLAMA8B, 1, False, "layernorm+mlp", eager=eager)
        assert 0 < float(freed) < float(kept)


def test_selective_without_core_attn_keeps_the_scores():
    lay = LayoutArrays.of(Layout(dp=1, recompute="selective", zero=0, grad_accum=1))
    attn = memory.memory_bytes(LLAMA8B, lay, flash=False)
    no_attn = memory.memory_bytes(LLAMA8B, lay, flash=False, features=memory.MemoryFeatures(recompute_modules="mlp"))
    kept, scores, _ = memory.activation_parts(LLAMA8B, 1, False, False)
    per_token_layer = float(scores) - 6 * 14336  # scores kept again, the MLP's internals freed
    expect = LLAMA8B.n_layers * LLAMA8B.seq_len * per_token_layer * (1 + memory.FRAGMENTATION)
    assert float(no_attn - attn) == pytest.approx(expect, rel=1e-9)


def test_xla_and_tpu_margin_by_hand():
    v5e = get_accelerator("tpu-v5e")
    # catalog: HBM minus the largest bytes_limit reading on a 32 GiB TPU (33,014,415,360 B)
    assert v5e.runtime_reserved_bytes == pytest.approx(32 * 2**30 - 33_014_415_360, rel=0.01)
    assert get_accelerator("h100").runtime_reserved_bytes == memory.RESERVED_BYTES
    jax_like = get_stack("jax")  # fp32 parameters, XLA's buffer assignment (no caching allocator)
    feat = memory.stack_features(jax_like, v5e)
    assert (feat.fp32_params, feat.fragmentation, feat.reserved_bytes) == (True, 0.0, v5e.runtime_reserved_bytes)
    lay = LayoutArrays.of(Layout(dp=4, zero=3, recompute="full", mbs=1, grad_accum=1))
    with_xla = float(memory.stack_memory_bytes(LLAMA8B, lay, jax_like, v5e))
    gpu = memory.memory_bytes(LLAMA8B, lay, True, False, 4.0, True, features=memory.MemoryFeatures(fp32_params=True))
    transient = (float(gpu) - memory.RESERVED_BYTES - 16 * memory.stage_params(LLAMA8B, 1, 1, 1)[0] / 4) \
        / (1 + memory.FRAGMENTATION)
    states = 16.0 * float(memory.stage_params(LLAMA8B, 1, 1, 1)[0]) / 4  # 4 + 4 + 8 B, sharded over 4
    assert with_xla == pytest.approx(states + transient + v5e.runtime_reserved_bytes, rel=1e-9)


def test_published_runs_that_ran_are_predicted_to_fit():
    # KempnerForge (2026-04-05 MFU table, experiment 01): Llama-3 8B shape (ffn 14336) on one H200, torch.compile,
    # full activation checkpointing, micro batch 2: FSDP2-style fp32 parameters, fp32 gradients
    kf = ModelSpec(name="kf7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, ffn_hidden=14336, vocab=128256,
                   seq_len=4096)
    h200 = get_accelerator("h200")
    lay = LayoutArrays.of(Layout(dp=1, zero=0, recompute="full", mbs=2, grad_accum=4))
    megatron_states = memory.memory_bytes(kf, lay, grad_bytes=4.0)
    fsdp2 = memory.memory_bytes(kf, lay, grad_bytes=4.0, features=memory.MemoryFeatures(fp32_params=True))
    assert float(megatron_states) > h200.hbm_bytes >= float(fsdp2)
    # MaxText 64B on TPU v5e-256 (README table; configs/v5e/64b.sh): FSDP over 256 chips, full remat, batch 2
    mt = ModelSpec(name="mt64b", n_layers=64, hidden=8192, n_heads=64, n_kv_heads=64, ffn_hidden=28672, vocab=32000,
                   seq_len=2048, head_dim=128)
    v5e = get_accelerator("tpu-v5e")
    lay = LayoutArrays.of(Layout(dp=256, zero=3, recompute="full", mbs=2, grad_accum=1))
    xla = memory.MemoryFeatures(fp32_params=True, fragmentation=0.0, reserved_bytes=v5e.runtime_reserved_bytes)
    assert float(memory.memory_bytes(mt, lay, grad_bytes=4.0)) > v5e.hbm_bytes >= \
        float(memory.memory_bytes(mt, lay, grad_bytes=4.0, features=xla))
    # DeepSeek-V3, NVIDIA dgxc-benchmarking H100 recipe: TP2 PP16 EP64 DP32 MBS1 GA256, RecomputeModule=mla_up_proj
    lay = LayoutArrays.of(Layout(tp=2, pp=16, dp=32, sp=True, zero=1, recompute="selective", mbs=1, grad_accum=256,
                                 ep=64, etp=1))
    h100 = get_accelerator("h100")
    assert float(memory.memory_bytes(DSV3, lay)) > h100.hbm_bytes >= \
        float(memory.memory_bytes(DSV3, lay, features=memory.MemoryFeatures(recompute_modules="mla_up_proj")))


def test_fp8_keeps_the_routed_experts_permuted_input_in_one_byte():
    # fp8 vs bf16, per token and layer: QKV and MLP inputs (2h, hidden wide, sp-split), attention output (q),
    # activation output (f, average layer), and the grouped GEMM's permuted input (h per expert choice)
    tp, share = 2, DSV3.n_moe_layers / DSV3.n_layers
    bf16, _, _ = memory.activation_parts(DSV3, tp, True, fp8=False)
    fp8, _, _ = memory.activation_parts(DSV3, tp, True, fp8=True)
    f_avg = (3 * 18432 + 58 * (8 * 2048 + 2048)) / 61
    saved = 2 * DSV3.hidden / tp + (DSV3.q_dim + f_avg + DSV3.hidden * 8 * share) / tp
    assert float(bf16 - fp8) == pytest.approx(saved)


def test_gspmd_sharded_residual_stream_counts_like_sequence_parallel():
    # full remat keeps each layer's input: 2h bytes per token split over tp when the compiler shards the
    # residual stream over the tensor axis (MaxText: 'activation_embed' -> 'tensor'), as Megatron's sp does
    lay = Layout(tp=4, dp=2, zero=3, recompute="full", mbs=1, grad_accum=1)
    feat = memory.MemoryFeatures(tp_shards_activations=True)
    gspmd = memory.memory_bytes(LLAMA8B, LayoutArrays.of(lay), features=feat)
    sp = memory.memory_bytes(LLAMA8B, LayoutArrays.of(Layout(**{**lay.to_dict(), "sp": True})))
    plain = memory.memory_bytes(LLAMA8B, LayoutArrays.of(lay))
    assert float(gspmd) == pytest.approx(float(sp), rel=1e-12)
    # the stored layer inputs (2h each) and the rebuilt layer's hidden-wide tensors (norm inputs and
    # outputs, 8h) shrink by 1 - 1/tp
    h, s, n = LLAMA8B.hidden, LLAMA8B.seq_len, LLAMA8B.n_layers
    expect = s * (n * 2 * h + 8 * h) * (1 - 1 / 4) * (1 + memory.FRAGMENTATION)
    assert float(plain - gspmd) == pytest.approx(expect, rel=1e-9)


def _saved_bytes(fn, *args, skip=()):
    """Bytes of the distinct tensors autograd saves while ``fn(*args)`` runs (PyTorch's saved-tensor hooks)."""
    torch = pytest.importorskip("torch")
    seen, skip_ptrs = {}, {t.untyped_storage().data_ptr() for t in skip}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip_ptrs:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(seen.values())


def test_eager_norm_and_swiglu_keep_what_pytorch_saves():
    torch = pytest.importorskip("torch")
    tokens, h, f = 8, 64, 96
    x = torch.randn(tokens, h, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(h, dtype=torch.bfloat16, requires_grad=True)
    lin = torch.nn.Linear(h, h, bias=False).to(torch.bfloat16)
    up = torch.nn.Linear(h, 2 * f, bias=False).to(torch.bfloat16)
    down = torch.nn.Linear(f, h, bias=False).to(torch.bfloat16)
    params = (w, lin.weight, up.weight, down.weight)

    def hf_rmsnorm_then_linear(x):  # transformers' LlamaRMSNorm, then the QKV / MLP input GEMM
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return lin(w * xf.to(x.dtype))

    def swiglu_then_linear(x):
        gate, u = up(x).chunk(2, dim=-1)
        return down(torch.nn.functional.silu(gate) * u)

    norm = _saved_bytes(hf_rmsnorm_then_linear, x, skip=params)
    assert norm == tokens * (4 * h + 2 * h + 2 * h + 4)  # fp32 input, bf16 normalised, output, fp32 rsqrt
    mlp = _saved_bytes(swiglu_then_linear, x, skip=params + (x,))
    assert mlp == tokens * (2 * f + 2 * f + 2 * f + 2 * f)  # gate, up, silu(gate), product
    # a fused norm keeps its bf16 input and output (4h), fused SwiGLU gate, up and product (6f)
    spec = ModelSpec(name="t", n_layers=2, hidden=h, n_heads=4, n_kv_heads=4, ffn_hidden=f, vocab=100, seq_len=8)
    fused, _, _ = memory.activation_parts(spec, 1, False)
    eager, _, _ = memory.activation_parts(spec, 1, False, eager=True)
    per_norm = norm / tokens - 4 - 4 * h  # rsqrt's 4 B per token are not counted
    assert float(eager - fused) == pytest.approx(2 * per_norm + (mlp / tokens - 6 * f))


def test_combine_weighted_by_probs_keeps_the_expert_outputs():
    torch = pytest.importorskip("torch")
    tokens, k, h = 8, 4, 64
    out = torch.randn(tokens, k, h, dtype=torch.bfloat16, requires_grad=True)  # expert outputs, per choice
    probs = torch.rand(tokens, k, dtype=torch.bfloat16, requires_grad=True)
    weighted = _saved_bytes(lambda o, p: (p.unsqueeze(-1) * o).sum(1), out, probs, skip=(probs,))
    plain = _saved_bytes(lambda o: o.sum(1), out)  # probs already applied in the activation (Megatron-Core >= 0.13)
    assert (weighted, plain) == (tokens * k * h * 2, 0)
    tp, share = 2, DSV3.n_moe_layers / DSV3.n_layers
    keep, _, _ = memory.activation_parts(DSV3, tp, True)
    drop, _, _ = memory.activation_parts(DSV3, tp, True, probs_in_activation=True)
    per_element = weighted / (tokens * k * h)  # 2 B: one bf16 copy of every expert output
    assert float(keep - drop) == pytest.approx(per_element * DSV3.hidden * DSV3.top_k * share / tp)


def test_estimate_prices_memory_with_the_stack_on_its_accelerator():
    from trainperf.plan.estimate import estimate
    from trainperf.specs import make_cluster
    # MaxText on TPU v5e: XLA's buffers (no fragmentation margin), the TPU runtime reserve, fp32 parameters,
    # the residual stream split over the tensor axis without sp (stated by hand here, not read from the stack)
    v5e = make_cluster("tpu-v5e", 16)
    layout = Layout(tp=2, dp=8, zero=3, recompute="full", mbs=1)
    est = estimate(LLAMA8B, v5e, layout, 16, sw=get_stack("jax"))
    xla = memory.MemoryFeatures(fp32_params=True, fragmentation=0.0, tp_shards_activations=True,
                                reserved_bytes=v5e.accelerator.runtime_reserved_bytes)
    lay = LayoutArrays.of(layout.resolve(16, 16))
    assert est.memory_bytes_per_gpu == pytest.approx(float(memory.memory_bytes(LLAMA8B, lay, grad_bytes=4.0,
                                                                               features=xla)), rel=1e-12)
    # eager PyTorch keeps the unfused norms' fp32 copies and silu's output; compiled blocks do not
    h100 = make_cluster("h100", 8)
    eager = estimate(LLAMA8B, h100, Layout(zero=3, mbs=1), 8, sw=get_stack("pytorch-fsdp:attention=fa2"))
    compiled = estimate(LLAMA8B, h100, Layout(zero=3, mbs=1), 8, sw=get_stack("pytorch-fsdp-compile"))
    assert eager.memory_bytes_per_gpu > compiled.memory_bytes_per_gpu
    with pytest.raises(TrainperfError, match="unknown attn"):
        get_stack("megatron-core:recompute_modules=attn")
