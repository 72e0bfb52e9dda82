"""trainperf: plan, measure, diagnose, speed up and guard large-model training performance."""

__version__ = "0.1.0"

from trainperf.errors import TrainperfError  # noqa: E402
from trainperf.specs import Cluster, Layout, ModelSpec, load_model, make_cluster, parse_layout  # noqa: E402

__all__ = ["Cluster", "Layout", "ModelSpec", "TrainperfError", "load_model", "make_cluster", "parse_layout"]
