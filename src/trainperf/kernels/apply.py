"""Swap the fused kernels into a model: `apply(model)`.

Understands the reference trainer's model (trainperf.train.model: RMSNorm modules, the
`swiglu`, `rope` and `loss_fn` attributes) and Hugging Face Llama-style modules (any module
class named *RMSNorm with `variance_epsilon`, *MLP with gate_proj/up_proj/down_proj and a SiLU
or tanh-GELU act_fn), recognised by name and attributes so transformers is never imported.
Parameters are shared, not copied: the optimizer and checkpoints see the same tensors.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch
from torch import nn

from trainperf.kernels.cross_entropy import cross_entropy
from trainperf.kernels.glu import geglu, swiglu
from trainperf.kernels.rms_norm import RMSNorm
from trainperf.kernels.rope import rope


@dataclass
class Applied:
    """What apply() replaced: counts per kind."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str) -> None:
        """Count one replacement of kind."""
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def total(self) -> int:
        """Return the number of replacements."""
        return sum(self.counts.values())


def _norm_eps(module: nn.Module) -> float | None:
    for attr in ("eps", "variance_epsilon"):
        value = getattr(module, attr, None)
        if isinstance(value, float):
            return value
    return None


def _is_rms_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    weight = getattr(module, "weight", None)
    return (name.endswith("RMSNorm") and not isinstance(module, RMSNorm) and isinstance(weight, nn.Parameter)
            and weight.dim() == 1 and _norm_eps(module) is not None
            and not name.startswith("Gemma"))  # Gemma's RMSNorm scales by (1 + weight): a different op


def _hf_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(self._trainperf_glu(self.gate_proj(x), self.up_proj(x)))


def _hf_glu_for(act_fn) -> object | None:
    name = type(act_fn).__name__
    if name in ("SiLU", "SiLUActivation") or act_fn is torch.nn.functional.silu:
        return swiglu
    if name in ("PytorchGELUTanh", "GELUTanh") or (name == "GELU" and getattr(act_fn, "approximate", "") == "tanh"):
        return geglu
    return None


def _cross_entropy_loss(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                        reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """Drop-in for torch.nn.functional.cross_entropy on (rows, vocab) logits."""
    return cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                         label_smoothing=label_smoothing)


def apply(model: nn.Module, norms: bool = True, glu: bool = True, rope_: bool = True, loss: bool = True) -> Applied:
    """Swap fused kernels into model in place; return what was replaced (counts per kind).

    norms: RMSNorm modules -> trainperf RMSNorm (same weight); glu: `.swiglu` attributes and HF
    Llama MLPs -> fused SwiGLU/GeGLU; rope_: `.rope` attributes -> fused RoPE; loss: `.loss_fn`
    attributes -> fused cross-entropy.
    """
    applied = Applied()
    for parent in list(model.modules()):
        if norms:
            for child_name, child in list(parent.named_children()):
                if _is_rms_norm(child):
                    setattr(parent, child_name, RMSNorm(child.weight.shape[0], _norm_eps(child), weight=child.weight))
                    applied.add("rms_norm")
        if glu and callable(parent.__dict__.get("swiglu")):
            parent.swiglu = swiglu
            applied.add("swiglu")
        if glu and all(hasattr(parent, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            fused = _hf_glu_for(parent.act_fn)
            if fused is not None:
                parent._trainperf_glu = fused
                parent.forward = types.MethodType(_hf_mlp_forward, parent)
                applied.add("swiglu" if fused is swiglu else "geglu")
        if rope_ and callable(parent.__dict__.get("rope")):
            parent.rope = rope
            applied.add("rope")
        if loss and callable(parent.__dict__.get("loss_fn")):
            parent.loss_fn = _cross_entropy_loss
            applied.add("cross_entropy")
    return applied
