"""Write the real CPU profiles of a small language model's training step kept here (record_shapes=True).

A token embedding (vocabulary 4096, width 64), one MLP block and the projection onto the vocabulary, 8 sequences of
64 tokens (512 rows of logits, 4096 wide), trained with AdamW; three losses:
cross_entropy.json.gz: F.cross_entropy on the flattened logits (aten::cross_entropy_loss: log-softmax, then NLL);
written_out.json.gz: F.nll_loss(F.log_softmax(logits, -1).view(-1, V), targets), the two spelled out with a view
between them; kl_div.json.gz: a distillation loss, F.kl_div of the log-softmax against fixed teacher probabilities
(a log-softmax without an NLL: no cross-entropy region); upcast.json.gz: the model in bf16, its logits cast to fp32
before F.cross_entropy (Hugging Face's eager `logits.float()`: aten::to holding aten::_to_copy, ToCopyBackward0);
autocast.json.gz: the fp32 model under torch.autocast("cpu", dtype=torch.bfloat16), F.cross_entropy on its bf16
logits (autocast runs it as an aten::cross_entropy_loss of the bf16 logits holding their upcast and an fp32 one).
hf_llama.json.gz: Hugging Face's own loss path (transformers 4.57.6, not a dependency of trainperf: installed apart
with `pip install --target DIR "transformers>=4.46,<5"` and put on PYTHONPATH), a 2-layer LlamaForCausalLM in bf16
(vocabulary 4096, width 64, 4 sequences of 64 tokens) called with labels: ForCausalLMLoss upcasts the logits, pads
and shifts the labels, then F.cross_entropy.
Made with torch 2.13.0+cpu on the 2-core CPU container (2026-12-06):
`python tests/data/loss/make_traces.py OUT_DIR`, then `gzip -9` each file.
"""

import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profiling import profile_training  # noqa: E402

V, D, B, S = 4096, 64, 8, 64  # vocabulary, width, sequences, tokens per sequence


def profile_steps(out: Path, name: str) -> None:
    """Profile 3 training steps (after 1 wait and 1 warm-up) of the model with loss `name` into out/name.json."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(V, D), nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D),
                          nn.Linear(D, V, bias=False)).to(torch.bfloat16 if name == "upcast" else torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, V, (B, S))
    targets = torch.randint(0, V, (B * S,))
    teacher = torch.softmax(torch.randn(B, S, V), dim=-1)

    def loss(i: int) -> torch.Tensor:
        if name == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.cross_entropy(model(tokens).view(-1, V), targets)
        logits = model(tokens)
        if name == "cross_entropy":
            return F.cross_entropy(logits.view(-1, V), targets)
        if name == "upcast":
            return F.cross_entropy(logits.float().view(-1, V), targets)
        if name == "written_out":
            return F.nll_loss(F.log_softmax(logits, dim=-1).view(-1, V), targets)
        return F.kl_div(F.log_softmax(logits, dim=-1), teacher, reduction="batchmean")

    profile_training(out, name, loss, opt, 5, record_shapes=True)


def profile_hf_llama(out: Path) -> None:
    """Profile 3 training steps of a tiny Hugging Face LlamaForCausalLM, its loss computed by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=176, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, V, (4, S))
    profile_training(out, "hf_llama", lambda i: model(input_ids=ids, labels=ids).loss, opt, 5, record_shapes=True)


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    for loss_name in ("cross_entropy", "written_out", "kl_div", "upcast", "autocast"):
        profile_steps(out, loss_name)
    try:
        profile_hf_llama(out)
    except ImportError:
        print("hf_llama: transformers is not installed, left as it is")
