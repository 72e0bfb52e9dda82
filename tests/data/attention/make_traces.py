"""Write the real CPU profiles of a small transformer's training step kept here (record_shapes=True).

eager.json.gz: attention written out as most model code does (q @ k^T * scale, a causal masked_fill, softmax,
dropout, @ v: the S x S scores go through memory between ops), the MoE-style router softmax of a 2-D
[tokens, experts] tensor beside it. sdpa.json.gz: the same model with F.scaled_dot_product_attention without dropout
(the fused kernel, aten::_scaled_dot_product_flash_attention_for_cpu: no attention softmax in the step).
math.json.gz: SDPA with dropout and the math backend forced (what PyTorch falls back to for an unsupported mask,
dtype, dropout or head dim): the same unfused ops inside aten::_scaled_dot_product_attention_math.
Made with torch 2.13.0+cpu on the 2-core CPU container (2026-12-03):
`python tests/data/attention/make_traces.py OUT_DIR`, then `gzip -9` each file.
hf_eager.json.gz (2026-12-06): Hugging Face's own eager attention (transformers 4.57.6, not a dependency of
trainperf: installed apart with `pip install --target DIR "transformers>=4.46,<5"` and put on PYTHONPATH), a 2-layer
LlamaForCausalLM in fp32 (vocabulary 512, width 64, 4 heads, 4 sequences of 64 tokens) with
attn_implementation="eager", trained on its own loss.
"""

import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profiling import profile_training  # noqa: E402

B, S, H, D, E = 2, 64, 4, 16, 4  # batch, sequence, heads, head dim, experts


class Block(nn.Module):
    def __init__(self, attention: str):
        super().__init__()
        self.attention = attention
        self.qkv = nn.Linear(H * D, 3 * H * D)
        self.proj = nn.Linear(H * D, H * D)
        self.router = nn.Linear(H * D, E)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("causal", torch.tril(torch.ones(S, S, dtype=torch.bool)))

    def forward(self, x):
        q, k, v = self.qkv(x).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
        if self.attention == "eager":
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            scores = scores.masked_fill(~self.causal, float("-inf"))
            y = self.drop(F.softmax(scores, dim=-1)) @ v
        else:
            # no dropout: the CPU's fused kernel (flash_attention_for_cpu) takes none; with it SDPA runs its math path
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.attention == "math" else 0.0,
                                               is_causal=True)
        y = self.proj(y.transpose(1, 2).reshape(B, S, H * D))
        gate = F.softmax(self.router(y).view(B * S, E), dim=-1)  # a router: [tokens, experts], no value matmul
        return y * gate.max(dim=-1, keepdim=True).values.view(B, S, 1)


def profile_steps(out: Path, name: str, attention: str, backend=None) -> None:
    """Profile 3 training steps (after 1 wait and 1 warm-up) of a 2-block model into out/name.json."""
    torch.manual_seed(0)
    model = nn.Sequential(Block(attention), Block(attention))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(B, S, H * D)

    def loss(i: int) -> torch.Tensor:
        if backend is None:
            return model(x).pow(2).mean()
        with sdpa_kernel(backend):
            return model(x).pow(2).mean()

    profile_training(out, name, loss, opt, 5, record_shapes=True)


def profile_hf_eager(out: Path) -> None:
    """Profile 3 training steps of a tiny Hugging Face LlamaForCausalLM with its eager attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                         attn_implementation="eager")
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 512, (4, 64))
    profile_training(out, "hf_eager", lambda i: model(input_ids=ids, labels=ids).loss, opt, 5, record_shapes=True)


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    profile_steps(out, "eager", "eager")
    profile_steps(out, "sdpa", "sdpa")
    profile_steps(out, "math", "math", SDPBackend.MATH)
    try:
        profile_hf_eager(out)
    except ImportError:
        print("hf_eager: transformers is not installed, left as it is")
