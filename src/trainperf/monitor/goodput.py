"""Goodput: productive training time over total wall time, with the badput split by cause.

Pure functions over the monitor's records, so a run of several attempts (crash, relaunch,
resume) is accounted for as one job:

* ``steps``: one dict per optimizer step and attempt with ``attempt``, ``step``,
  ``step_time_s``, ``data_wait_s`` and ``t_end`` (unix seconds at the end of the step);
* ``events``: ``{"kind": "attempt_start", "attempt", "t"}`` (t = the process start) and
  ``{"kind": "checkpoint", "attempt", "t", "blocking_s"}``.

Definitions (seconds):

* productive = sum over the steps that count (the last attempt's record of each step
  number) of step time minus data wait;
* start-up = per attempt, from the process start to the start of its first step;
* data wait = time the surviving steps were blocked on their next batch;
* checkpoint = time the training loop was blocked saving checkpoints;
* restart = per relaunch, from the last sign of life of the previous attempt to the start of
  the new process (failure detection + relaunch);
* lost work = step time of steps whose result was thrown away (re-done after a resume);
* other = the rest of the wall time (logging, profiler export, evaluation, shutdown).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Goodput:
    """The split of a job's wall time (seconds) and goodput = productive_s / total_s."""

    total_s: float
    productive_s: float
    startup_s: float
    data_wait_s: float
    checkpoint_s: float
    restart_s: float
    lost_work_s: float
    other_s: float
    attempts: int

    @property
    def goodput(self) -> float:
        """Return productive / total (fraction; 0 for an empty job)."""
        return self.productive_s / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        """Return the split and the goodput as a plain dict."""
        return {**asdict(self), "goodput": self.goodput}


def compute_goodput(steps: list[dict], events: list[dict], end_time: float | None = None) -> Goodput:
    """Return the Goodput of a job from its step records and events (see module doc).

    ``end_time`` (unix s) closes the job; default: the last step end or event.
    """
    starts = {int(e["attempt"]): float(e["t"]) for e in events if e.get("kind") == "attempt_start"}
    attempts = sorted(set(starts) | {int(s["attempt"]) for s in steps})
    if not attempts:
        return Goodput(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    last_seen: dict[int, float] = {}
    first_step_start: dict[int, float] = {}
    for s in steps:
        a = int(s["attempt"])
        begin = float(s["t_end"]) - float(s["step_time_s"])
        first_step_start[a] = min(first_step_start.get(a, begin), begin)
        last_seen[a] = max(last_seen.get(a, 0.0), float(s["t_end"]))
    ckpts = [e for e in events if e.get("kind") == "checkpoint"]
    for e in ckpts:
        a = int(e["attempt"])
        last_seen[a] = max(last_seen.get(a, 0.0), float(e["t"]))

    # The record that counts for each step number is the one of the latest attempt.
    latest: dict[int, dict] = {}
    for s in steps:
        k = int(s["step"])
        if k not in latest or int(s["attempt"]) >= int(latest[k]["attempt"]):
            latest[k] = s
    kept = {id(s) for s in latest.values()}
    productive = sum(float(s["step_time_s"]) - float(s.get("data_wait_s") or 0.0) for s in latest.values())
    data_wait = sum(float(s.get("data_wait_s") or 0.0) for s in latest.values())
    lost = sum(float(s["step_time_s"]) for s in steps if id(s) not in kept)

    startup = restart = 0.0
    for i, a in enumerate(attempts):
        t0 = starts.get(a, first_step_start.get(a))
        if t0 is None:
            continue
        if a in first_step_start:
            startup += max(first_step_start[a] - t0, 0.0)
        elif a in last_seen:  # an attempt that never finished a step: all of it was start-up
            startup += max(last_seen[a] - t0, 0.0)
        if i > 0:
            prev = attempts[i - 1]
            prev_end = last_seen.get(prev, starts.get(prev, t0))
            restart += max(t0 - prev_end, 0.0)

    job_start = min(starts.get(a, first_step_start.get(a, float("inf"))) for a in attempts)
    job_end = end_time if end_time is not None else max(last_seen.values(), default=job_start)
    total = max(job_end - job_start, 0.0)
    checkpoint = sum(float(e.get("blocking_s") or 0.0) for e in ckpts)
    other = total - productive - startup - data_wait - checkpoint - restart - lost
    return Goodput(total, productive, startup, data_wait, checkpoint, restart, lost, other, len(attempts))
