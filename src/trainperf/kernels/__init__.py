"""Fused Triton training kernels with PyTorch references, autograd, torch.library ops and modules.

Functional API: rms_norm, layer_norm, swiglu, geglu, rope, softmax, cross_entropy,
fused_linear_cross_entropy; modules: RMSNorm, LayerNorm, CrossEntropyLoss,
FusedLinearCrossEntropyLoss; apply(model) swaps them into a model. PyTorch references of each
live in trainperf.kernels.reference. Every op is a torch.library custom op (namespace
`trainperf::`) with a registered autograd formula, so torch.compile traces through it.

Importing this package settles where kernels run first (`_runtime`: the Triton interpreter on a
machine without a CUDA device), so it must stay the first import here.
"""

from trainperf.kernels import _runtime  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from trainperf.kernels.apply import Applied, apply
from trainperf.kernels.cross_entropy import CrossEntropyLoss, cross_entropy
from trainperf.kernels.linear_cross_entropy import FusedLinearCrossEntropyLoss, fused_linear_cross_entropy
from trainperf.kernels.glu import geglu, swiglu
from trainperf.kernels.layer_norm import LayerNorm, layer_norm
from trainperf.kernels.rms_norm import RMSNorm, rms_norm
from trainperf.kernels.rope import rope
from trainperf.kernels.softmax import softmax

__all__ = ["Applied", "CrossEntropyLoss", "FusedLinearCrossEntropyLoss", "LayerNorm", "RMSNorm", "apply",
           "cross_entropy", "fused_linear_cross_entropy", "geglu", "layer_norm", "rms_norm", "rope", "softmax",
           "swiglu"]
