"""Write the real CPU profiles of a small residual MLP's training step kept here (record_shapes=True).

none.json.gz: no activation checkpointing. reentrant.json.gz: every block under torch.utils.checkpoint with
use_reentrant=True (the forward re-runs inside a CheckpointFunctionBackward node). non_reentrant.json.gz: the same
with use_reentrant=False (the forward re-runs inside the backward node that first unpacks a saved tensor).
double_backward.json.gz: no checkpointing, a gradient penalty (torch.autograd.grad with create_graph=True): the
first backward's formula ops are recorded as forward ops inside its nodes, and repeat nothing the forward ran.
Made with torch 2.13.0+cpu on the 2-core CPU container (2026-12-03):
`python tests/data/recompute/make_traces.py OUT_DIR`, then `gzip -9` each file.
"""

import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profiling import profile_training  # noqa: E402


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(64), nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def profile_steps(out: Path, name: str, reentrant: bool | None, penalty: bool = False) -> None:
    """Profile 3 training steps (after 1 wait and 1 warm-up) of 2 blocks into out/name.json; reentrant None:
    no checkpointing; penalty: add the squared input gradient to the loss (a double backward)."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([Block(), Block()])
    opt = torch.optim.SGD(blocks.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def loss(i: int) -> torch.Tensor:
        h = x.requires_grad_(reentrant is not None or penalty)
        for b in blocks:
            h = b(h) if reentrant is None else checkpoint(b, h, use_reentrant=reentrant)
        value = h.pow(2).mean()
        if penalty:
            (grad,) = torch.autograd.grad(value, x, create_graph=True)
            value = value + grad.pow(2).sum()
        return value

    profile_training(out, name, loss, opt, 5, record_shapes=True)


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    profile_steps(out, "none", None)
    profile_steps(out, "reentrant", True)
    profile_steps(out, "non_reentrant", False)
    profile_steps(out, "double_backward", None, penalty=True)
