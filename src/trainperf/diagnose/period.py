"""The steady-state step period of a replayed window: what a what-if's gain is a share of.

A profiled window holds a few steps, and its makespan counts two things a long run does not pay each step: the
head (the first step's host work before its GPU work starts) and the tail (the last step's GPU work after its host
is done, which in a long run runs under the next step's host work). When a fix shortens one side, the window's
makespan moves by more or less than the step does. On an H200, a 30-ms DataLoader in front of 23 ms of GPU work a
step read 46 % of the 3-step window's makespan and 38.3 % of its period; removing it measured 38.2 % (the GPU's
18-ms tail after the last host step was in the window only once). A DataLoader injected before each of 4 steps of
a GPU-bound trace (HTA's ns_resolution: 95 ms of GPU and 35 ms of host work a step, a 60-ms load) costs 18 % of the
window, most of it the first step's GPU starting 60 ms late, but 7 % a step once running: the host's 102 ms
against the GPU's 95.

The period is the larger of the two sides' mean step over the window's steps:
- host: from the first host call of the first step to the end of the last call of the last step, per step (a
  one-off host stall in any step, a checkpoint save, counts once over the window's steps);
- device: from the start of the first device work the first step launched to the end of the last work the last
  step launched, per step (work queued by steps before the window runs before it and is not counted).
The slower side sets the pace of a long run; the faster one waits for it.

Unless the host was paced by the device: when every device node of the steps waited in the queue for at least
PACED_QUEUE_SHARE of a device step after its launch, and the two sides' steps were the same (within
PACED_TOLERANCE), the host ran ahead of a busy GPU all window long at the GPU's pace: its calls' spacing was the
GPU's (a full launch queue, the allocator waiting on events), not its own work. (A host whose step is shorter runs
away from the GPU, steps ahead, at its own pace: an H200 loop's 6.1 ms against 22.4; one whose step is longer
drains the queue and is the pace.) Its own step is then unseen, only known to be shorter than the device's; the
period is the device's alone, in every what-if (an upper bound on the gain where a fix makes the device faster than
the host). A ROCm DDP rank whose kernels all start 27 ms after their launch, 32-ms steps on
both sides, 20 ms of them an exposed all-reduce: overlapping it lets each kernel start at its launch, 27 ms sooner
over the window's 4 steps, where the host's observed spacing would price it at 0 (the replay keeps that spacing: the
host's own step stays unseen). A host that waited inside its calls for a slot in the full launch queue
(replay.queue_waits) shows its pace: those waits end with the device work they waited for in every replay, so it
is not taken as paced.
"""

from __future__ import annotations

import numpy as np

from trainperf.diagnose.replay import BLOCK_QUEUE, NOT_BLOCKING, Graph, Replay
from trainperf.diagnose.steps import StepTime

# device work whose launch is known: below this share of the window's device nodes (traces without correlation
# ids), the steps' device work cannot be told apart and the window's makespan is used instead
MIN_LAUNCHED_SHARE = 0.5
# a host paced by the device: each device node queued at least this share of the device's step after its launch
# (the least queued node of a host-bound window: under 0.002 of a step on the 9 H200 and 9 HTA traces with steps;
# GPU-bound: 0.58 and 0.79 on two H200 loops whose host ran steps ahead, 0.84 on the ROCm DDP rank)...
PACED_QUEUE_SHARE = 0.1
# ... and the two sides' steps equal to this share of the device's (their spans are measured from different nodes,
# each end moved by the queue's jitter once over the window's steps)
PACED_TOLERANCE = 0.05


def step_nodes(g: Graph, steps: list[StepTime], behind_earlier_work: bool = False
               ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Per analysed step, in order: (its host nodes, the device nodes its host calls launched), by observed time
    (a host node starting at the step's end, the next step's anchor, belongs to it too: a save at the end of the
    step lasts until there). Without steps (a whole-trace window) the window's makespan is its step, unless the
    device began it behind work launched before the trace (behind_earlier_work: a profile opened mid-run), whose
    head a makespan counts as the window's: the window is then one step, (its host nodes, every launched device
    node), its host side from the first call to the last that did not wait for the device (a closing synchronize
    waits for the queue to drain: the host's work was done) against its device side from the first work it launched
    to the last, as a step's is. None when there is no such step, a step has no host or no launched device node, or
    fewer than MIN_LAUNCHED_SHARE of the device nodes have a known launch."""
    if not steps and not behind_earlier_work:
        return None
    host = np.flatnonzero(g.is_host)
    dev = np.flatnonzero(~g.is_host & ~g.before_window)
    if dev.size == 0 or (g.launch[dev] >= 0).mean() < MIN_LAUNCHED_SHARE:
        return None
    dev = dev[g.launch[dev] >= 0]
    if not steps:
        host = host[np.argsort(g.start[host], kind="stable")]
        own = np.flatnonzero(g.block_class[host] == NOT_BLOCKING)
        host = host[:own[-1] + 1] if own.size else host[:0]
        return [(host, dev)] if host.size else None
    launched_at = g.start[g.launch[dev]]
    out = []
    for x in steps:
        lo, hi = x.start_us, x.start_us + x.host_us
        h = host[(g.start[host] >= lo) & (g.start[host] <= hi)]
        d = dev[(launched_at >= lo) & (launched_at < hi)]
        if not h.size or not d.size:
            return None
        out.append((h, d))
    return out


def step_sides_us(r: Replay, nodes: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
    """(host, device) mean step over the window's steps in replay r (µs)."""
    (first_host, first_dev), (last_host, last_dev) = nodes[0], nodes[-1]
    host = r.end[last_host].max() - r.start[first_host].min()
    device = r.end[last_dev].max() - r.start[first_dev].min()
    return float(host) / len(nodes), float(device) / len(nodes)


def paced_by_device(g: Graph, base: Replay, nodes: list[tuple[np.ndarray, np.ndarray]],
                    sides_us: tuple[float, float]) -> bool:
    """Whether the host was paced by the device in replay `base` (module docstring), whose (host, device) mean step
    is sides_us (step_sides_us): every device node of the steps queued PACED_QUEUE_SHARE of a device step or more,
    and the two sides' steps the same within PACED_TOLERANCE; never where a host call of the steps waited for a slot
    in the full launch queue (BLOCK_QUEUE)."""
    host, device = sides_us
    if (g.block_class[np.concatenate([h for h, _ in nodes])] == BLOCK_QUEUE).any():
        return False  # its calls recorded their waits for the full queue: the replay moves them with the device
    dev = np.concatenate([d for _, d in nodes])
    queued = base.start[dev] - base.start[g.launch[dev]]
    return abs(host - device) <= PACED_TOLERANCE * device and float(queued.min()) >= PACED_QUEUE_SHARE * device


def period_of_sides_us(sides_us: tuple[float, float], paced: bool) -> float:
    """The step period (µs) of a (host, device) mean step: the larger, or the device's alone where the host was
    paced by it (module docstring)."""
    host, device = sides_us
    return device if paced else max(host, device)


def steady_period_us(r: Replay, nodes: list[tuple[np.ndarray, np.ndarray]], paced: bool = False) -> float:
    """The window's step period in replay r (µs): period_of_sides_us of its step_sides_us; nodes from step_nodes."""
    return period_of_sides_us(step_sides_us(r, nodes), paced)
