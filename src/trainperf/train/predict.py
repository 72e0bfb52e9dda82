"""Predicted (by the planner) versus measured step time and memory of a training run."""

from __future__ import annotations


def predict_step(spec, layout, world: int, accelerator: str | None, summary, stack: str = "pytorch-fsdp") -> dict:
    """Return {"measured", "predicted", "ratio"} for step time (s) and peak memory (bytes), or a note.

    The prediction is ``trainperf.plan.estimate`` for the same model, layout and GPU count, with
    the planner's software ``stack`` (``pytorch-fsdp``: what this trainer is) (imported here so the trainer runs where the planner is absent). A CPU run has no
    prediction: the planner models accelerators from the hardware catalog.
    """
    measured = {"step_time_s": summary.step_time_s, "mem_peak_bytes": summary.mem_peak_bytes, "mfu": summary.mfu}
    if accelerator is None:
        return {"measured": measured, "note": "no prediction: the planner models catalog accelerators, not this device"}
    try:
        from trainperf.plan.estimate import estimate
        from trainperf.plan.stacks import get_stack
        from trainperf.specs import make_cluster
    except ImportError as e:
        return {"measured": measured, "note": f"no prediction: the planner is not available ({e})"}
    try:
        est = estimate(spec, make_cluster(accelerator, world), layout, sw=get_stack(stack))
    except Exception as e:  # noqa: BLE001 - a planner failure must not fail a finished run
        return {"measured": measured, "note": f"no prediction: the planner failed ({type(e).__name__}: {e})"}
    predicted = {"step_time_s": est.step_time_s, "mem_peak_bytes": est.memory_bytes_per_gpu, "mfu": est.mfu}
    ratio = {k: (measured[k] / predicted[k] if measured.get(k) and predicted.get(k) else None) for k in predicted}
    return {"measured": measured, "predicted": predicted, "measured_over_predicted": ratio}
