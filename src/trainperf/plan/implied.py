"""What a layout leaves unsaid: the settings a job that ran implies.

A published run, or a user's ``--layout "tp=8,pp=4"``, names some of the layout and not the rest.
The planner fills the rest the way such jobs run, in one place for `trainperf plan --layout` and
for the published-run validation (benchmarks/validate_planner.py), so that a run predicted
through the command line gets the prediction the validation measured:

* ``sp`` (sequence parallelism): on wherever tp > 1. Megatron-Core/NeMo recipes, torchtitan's
  tensor-parallel plan (``SequenceParallel`` on the norms) and Korthikanti et al. (2022) run TP
  with it; a run without it says so (``sp=0``).
* ``zero``: the stack's own (``Software.zero``): Megatron's distributed optimizer (1) for the
  Megatron and DeepSpeed stacks, full sharding (3) for PyTorch FSDP and for JAX/MaxText's
  ``fsdp`` mesh axis.
* ``recompute``: the least recomputation (none, selective, full) whose predicted memory fits:
  the job ran, so its activations fitted. When none fits, ``full``, and the estimate says it does
  not fit.
"""

from __future__ import annotations

from dataclasses import replace

from trainperf.plan.efficiency import Efficiency
from trainperf.plan.estimate import Estimate, estimate
from trainperf.plan.stacks import Software
from trainperf.specs import Cluster, Layout, ModelSpec

RECOMPUTE_LEAST_FIRST = ("none", "selective", "full")


def implied_layout(layout: Layout, stated: frozenset[str], sw: Software) -> Layout:
    """Return ``layout`` with ``sp`` and ``zero`` set as the job implies where ``stated`` does not name them."""
    kw: dict = {}
    if "sp" not in stated:
        kw["sp"] = layout.tp > 1
    if "zero" not in stated:
        kw["zero"] = sw.zero
    return replace(layout, **kw)


def estimate_as_run(m: ModelSpec, cluster: Cluster, layout: Layout, stated: frozenset[str],
                    global_batch: int | None = None, eff: Efficiency | None = None,
                    sw: Software | None = None) -> tuple[Estimate, dict[str, str]]:
    """Return (Estimate of the layout as the job ran it, {field: value and why} for each field filled in).

    ``stated``: the Layout fields the user or the source named (``specs.stated_layout_keys``).
    Raises TrainperfError for an impossible layout, as ``estimate`` does.
    """
    sw = sw or Software()
    lay = implied_layout(layout, stated, sw)
    assumed: dict[str, str] = {}
    if "sp" not in stated and lay.tp > 1:
        assumed["sp"] = "1 (tensor parallelism runs with sequence parallelism)"
    if "zero" not in stated:
        assumed["zero"] = f"{lay.zero} (the {sw.name.split(':')[0]} stack's)"
    if "recompute" in stated:
        return estimate(m, cluster, lay, global_batch, eff, sw), assumed
    for rc in RECOMPUTE_LEAST_FIRST:
        est = estimate(m, cluster, replace(lay, recompute=rc), global_batch, eff, sw)
        if est.fits:
            break
    assumed["recompute"] = (f"{est.layout.recompute} (the least whose memory fits)" if est.fits
                            else "full (nothing less fits; neither does full)")
    return est, assumed
