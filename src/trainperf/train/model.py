"""A Llama-style decoder built from a ModelSpec: RMSNorm, RoPE, GQA, SwiGLU, SDPA attention.

Reads top to bottom like nanoGPT's model file. Every hot spot is a patch point that
``trainperf.kernels.apply(model)`` can swap for a fused Triton kernel:

* ``RMSNorm(dim, eps)`` with parameter ``weight`` and attribute ``eps``;
* ``FeedForward`` calls ``self.swiglu(gate, up)`` (reference: ``swiglu``);
* ``Attention`` calls ``self.rope(q, k, cos, sin)`` with q, k of shape
  (batch, seq, heads, head_dim) and cos, sin of shape (seq, head_dim), Hugging Face
  ``rotate_half`` convention (reference: ``apply_rope``);
* ``Transformer`` computes its loss with ``self.loss_fn(logits_2d, targets_1d)``
  (reference: ``F.cross_entropy``).

The weights are created on any device (``meta`` for large models: call ``to_empty`` then
``init_weights``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainperf.specs import ModelSpec

# ------------------------------------------------------------------ reference functions


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Return silu(gate) * up, the SwiGLU activation (reference for fused kernels)."""
    return F.silu(gate) * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Return cat(-x2, x1) of the two halves of the last dimension (Hugging Face convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Return (q, k) rotated by RoPE; q, k are (batch, seq, heads, head_dim), cos/sin (seq, head_dim)."""
    cos = cos[None, :, None, :].to(q.dtype)
    sin = sin[None, :, None, :].to(q.dtype)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_tables(seq_len: int, head_dim: int, theta: float = 500000.0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the fp32 (cos, sin) tables of shape (seq_len, head_dim), halves duplicated."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


# ------------------------------------------------------------------------- modules


class RMSNorm(nn.Module):
    """Root-mean-square norm: x * rsqrt(mean(x^2) + eps) * weight, computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return out.to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    """Grouped-query causal self-attention with RoPE; SDPA core (FlashAttention on GPU).

    Head counts are read from the projection widths at run time, so tensor parallelism
    (which shards wq/wk/wv by columns) needs no change here.
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.head_dim = spec.head_dim
        self.n_rep = spec.n_heads // spec.n_kv_heads
        self.wq = nn.Linear(spec.hidden, spec.q_dim, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_dim, bias=False)
        self.wo = nn.Linear(spec.q_dim, spec.hidden, bias=False)
        self.rope = apply_rope
        self.recompute_core = False  # selective activation checkpointing (set by train.parallel)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = self.rope(q, k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
        if self.recompute_core:
            o = checkpoint(_attention_core, q, k, v, self.n_rep, use_reentrant=False)
        else:
            o = _attention_core(q, k, v, self.n_rep)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_rep: int) -> torch.Tensor:
    # Repeat the kv heads instead of SDPA's enable_gqa: every SDPA backend (flash included)
    # accepts the repeated form on every torch >= 2.5.
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(swiglu(w1 x, w3 x)); w1 is the gate, w3 the up, w2 the down projection."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)
        self.swiglu = swiglu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.swiglu(self.w1(x), self.w3(x)))


class Block(nn.Module):
    """One pre-norm transformer layer: x + attn(norm(x)), then + ffn(norm(x))."""

    def __init__(self, spec: ModelSpec, norm_eps: float):
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden, norm_eps)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.hidden, norm_eps)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """The decoder: embedding, ``spec.n_layers`` blocks, final norm, LM head (tied if the spec says)."""

    def __init__(self, spec: ModelSpec, norm_eps: float = 1e-5, rope_theta: float = 500000.0):
        super().__init__()
        if not spec.gated_mlp or spec.norm != "rmsnorm" or spec.linear_bias or spec.learned_pos_emb:
            from trainperf.errors import TrainperfError

            raise TrainperfError(
                f"model {spec.name!r}: the reference trainer builds Llama-style models only "
                "(gated MLP, RMSNorm, no biases, RoPE); GPT-style presets are for the planner"
            )
        self.spec = spec
        self.rope_theta = rope_theta
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        # A ModuleDict keyed by layer index keeps parameter names stable when blocks are
        # wrapped (compile, activation checkpointing) or sharded (FSDP), as in torchtitan.
        self.layers = nn.ModuleDict({str(i): Block(spec, norm_eps) for i in range(spec.n_layers)})
        self.norm = RMSNorm(spec.hidden, norm_eps)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.loss_fn = F.cross_entropy
        cos, sin = rope_tables(spec.seq_len, spec.head_dim, rope_theta, device=self.tok_embeddings.weight.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when the spec says so (``to_empty`` unties them)."""
        if self.spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Initialise every weight in place (normal std 0.02; output projections std 0.02/sqrt(2L)).

        Deterministic for a given seed (drawn on CPU, so identical on every device); call after
        ``to_empty(device=...)`` for a meta-built model, before any sharding.
        """
        self.tie_weights()
        g = torch.Generator(device="cpu").manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.spec.n_layers)

        def normal_(p: torch.Tensor, std: float) -> None:
            # Draw on CPU so every device type gives the same initial weights for one seed.
            p.copy_((torch.randn(p.shape, generator=g) * std).to(p.device, p.dtype))

        normal_(self.tok_embeddings.weight, 0.02)
        for i in range(self.spec.n_layers):
            blk = self.layers[str(i)]
            for lin, std in ((blk.attention.wq, 0.02), (blk.attention.wk, 0.02), (blk.attention.wv, 0.02),
                             (blk.attention.wo, out_std), (blk.feed_forward.w1, 0.02),
                             (blk.feed_forward.w3, 0.02), (blk.feed_forward.w2, out_std)):
                normal_(lin.weight, std)
            blk.attention_norm.weight.fill_(1.0)
            blk.ffn_norm.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)
        if not self.spec.tied_embeddings:
            normal_(self.output.weight, 0.02)
        cos, sin = rope_tables(self.spec.seq_len, self.spec.head_dim, self.rope_theta, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Return the mean next-token loss when ``targets`` is given, else logits (batch, seq, vocab)."""
        s = tokens.shape[1]
        cos, sin = self.rope_cos[:s], self.rope_sin[:s]
        h = self.tok_embeddings(tokens)
        for blk in self.layers.values():
            h = blk(h, cos, sin)
        logits = self.output(self.norm(h))
        if targets is None:
            return logits
        return self.loss_fn(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def build_model(spec: ModelSpec, device: str | torch.device = "cpu", seed: int = 0) -> Transformer:
    """Return an initialised Transformer on ``device`` (built on ``meta`` first, then materialised)."""
    with torch.device("meta"):
        model = Transformer(spec)
    model.to_empty(device=device)
    model.init_weights(seed)
    return model
