"""A pipeline-parallel stage in one rank's trace: the schedule that names it, or the wait it opens each step with.

Pipeline parallelism splits the layers into stages on different ranks; each step a stage runs the forward of m
micro-batches on the activations its predecessor sends, then their backward on the gradients its successor sends.
A stage idles until its first input arrives and after its last output leaves: the schedule's bubble, (p - 1) /
(m + p - 1) of the step for GPipe and 1F1B with p stages (Narayanan et al. 2021, "Efficient large-scale language
model training on GPU clusters using Megatron-LM", section 2.2), spent on the device inside the receives (send/recv
kernels that wait for their partner). Context parallelism's ring attention also moves its keys and values by
send/recv, so send/recv alone does not make a pipeline. Three things do:

* the trace describes the send/recv's process group as the pipeline's (distributedInfo.pg_config, p2p_group_role),
  which also gives the stages (the group's size); described as context parallelism's, it rules a pipeline out;
* the send/recv's partners make the rank an end of a chain (pipeline_end, PyTorch >= 2.5's "Src Rank" / "Dst Rank"):
  in a group of more than two ranks, the first or last in the group's order exchanges both ways with its one
  neighbour and no one else (a first stage sends activations to the second and takes its gradients back); a ring,
  context parallelism's, has no end (its first rank takes from, or gives to, the last);
* the schedule names itself: torch.distributed.pipelining records "Forward i" / "Backward i" (single-stage
  schedules) or "PP:<stage><F|B|I|W><micro-batch>" (multi-stage ones) around each micro-batch; Megatron-LM's and
  DeepSpeed's schedules appear as Python frames when the trace has its stacks (with_stack=True);
* a later stage opens every step by waiting for its input: before the step's first send/recv ends, the step has
  run next to no computation (at most OPENING_COMPUTE_SHARE of the step's, and at most RECEIVE_FIRST_SHARE of that
  send/recv's time): a stage 1 waits a whole micro-batch's forward of stage 0 before it computes anything, while a
  data-parallel rank runs its forward and backward before it communicates and a ring-attention rank its embedding,
  norm and query/key/value projections before its first exchange.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.gpu_time import compute_mask
from trainperf.diagnose.process_groups import collective_calls, described_role, group_config, int_list
from trainperf.diagnose.window import Window, covered_length, union_us
from trainperf.trace.events import CPU_OP, PYTHON, USER_ANNOTATION, EventTable

# the computation a step runs before its first send/recv ends, at most this share of that send/recv's time, for
# the step to open on a receive (stated, not fitted: half; a stage after the first computes nothing of the step
# before its input arrives, a ring-attention rank several kernels of each layer before every exchange)
RECEIVE_FIRST_SHARE = 0.5
# ... and at most this share of all the computation the step launched (stated: a twentieth, room for stray kernels
# such as a gradient buffer zeroed at the step's start; a first stage's first send follows one micro-batch's forward,
# 1/(3m) of its step, but that send does not wait: it lasts a transfer, far under its forward)
OPENING_COMPUTE_SHARE = 0.05

# a rank opens its steps on a receive when it does in more than this share of them (a majority: stated)
OPENS_ON_RECEIVE_STEPS = 0.5

# torch.distributed.pipelining's record_function names: "Forward 3", "Backward 3"; "PP:1F3" (stage 1, forward of
# micro-batch 3; I/W: the backward's input and weight halves of zero-bubble schedules)
SCHEDULE_ACTION_RE = re.compile(r"^(?:(Forward|Backward) (\d+)|PP:(\d+)(F|B|I|W)(\d+))$")
# ... and any action of its runtime (communication ones, "PP:0SEND_F1", overlapped pairs, "PP:(0F1;1B0)OVERLAP_F_B"):
# a schedule, whatever its actions say of the micro-batches
SCHEDULE_ANY_ACTION_RE = re.compile(r"^PP:[\d(]")
# Megatron-LM's and DeepSpeed's pipeline schedules, as Python frames (with_stack=True)
SCHEDULE_FRAME_RE = re.compile(r"forward_backward_pipelining|pipe/engine\.py.*_exec_(?:forward|backward)_pass")


def p2p_group_role(t: EventTable, p2p_rows: np.ndarray) -> tuple[str, int]:
    """(role, size) of the process group holding most of the rank's send/recv kernel time, as the trace's
    distributedInfo describes it (process_groups.group_config): "pipeline" or "context" (context parallelism's ring)
    by the description; where the trace describes none ("default_pg", "undefined", or no pg_config), "pipeline" when
    the send/recv's partners make the rank an end of a pipeline (pipeline_end), else ""; and the group's size (0 when
    unknown)."""
    group = _main_group(t, p2p_rows)
    config = group_config(t)
    entry = config.get(t.names[group]) if group >= 0 else None
    role = described_role(entry[0]) if entry is not None else ""
    if role:  # described: its role, whatever the partners (a data or tensor group's send/recv is no pipeline's)
        return role if role in ("pipeline", "context") else "", entry[1]
    exchange = peer_exchange(t, group, entry[1] if entry is not None else 0) if p2p_rows.size else None
    if exchange is not None and pipeline_end(exchange):
        return "pipeline", len(exchange.group)
    return "", entry[1] if entry is not None else 0


def _main_group(t: EventTable, p2p_rows: np.ndarray) -> int:
    """The process group (its name's id) holding most of the send/recv kernels' time; -1 where they name none."""
    rows = p2p_rows[t.process_group[p2p_rows] >= 0] if p2p_rows.size else p2p_rows
    if not rows.size:
        return -1
    time_by_group: dict[int, float] = {}
    for g, ns in zip(t.process_group[rows].tolist(), t.dur_ns[rows].tolist()):
        time_by_group[g] = time_by_group.get(g, 0.0) + ns
    return max(time_by_group, key=time_by_group.get)


@dataclass(frozen=True, kw_only=True)
class PeerExchange:
    """Whom a rank's send and recv calls name as their partners, in the process group they share: global ranks (the
    group's ranks in its order) or ranks within the group (group = 0 .. size - 1), own in the same numbering."""

    group: tuple[int, ...]
    own: int
    sent_to: frozenset[int]
    received_from: frozenset[int]


P2P_CALLS = ("send", "recv")  # the "Collective name" of torch.distributed's send/isend and recv/irecv
# ProcessGroupNCCL's record function around each send and recv: "nccl:send <rank>-><peer>", "nccl:recv <rank><-<peer>",
# ranks within the group (every PyTorch with the profiler's NCCL support; RCCL's builds alike)
P2P_SPAN_RE = re.compile(r"^nccl:(send|recv) (\d+)(?:->|<-)(\d+)$")


def peer_exchange(t: EventTable, process_group: int = -1, group_size: int = 0) -> PeerExchange | None:
    """The partners of the trace's send and recv calls in one process group (`process_group`, a name id, where its
    calls name it; else the group the most calls name): from the args PyTorch writes on each call's
    record_param_comms (and copies onto its kernel), "Dst Rank" / "Src Rank" (the partner's global rank, PyTorch >=
    2.5) and "Process Group Ranks"; else from ProcessGroupNCCL's "nccl:send 0->1" / "nccl:recv 0<-1" spans (ranks
    within the group) and the group's size ("Group size", PyTorch >= 2.1, else group_size: distributedInfo.pg_config's,
    0 unknown). None where neither records them."""
    found = collective_calls(t, lambda s: s.lower() in P2P_CALLS)
    if process_group >= 0 and any(t.process_group[row] == process_group for row, _ in found):
        found = [(row, a) for row, a in found if t.process_group[row] == process_group]
    calls: dict[tuple[int, ...], tuple[set, set, list]] = {}
    sizes: list[int] = []
    for row, a in found:
        sent, received, named = calls.setdefault(int_list(a.get("Process Group Ranks")), (set(), set(), []))
        size = _int_arg(a.get("Group size"))
        sizes += [size] if size else []
        for key, into in (("Dst Rank", sent), ("Src Rank", received)):
            peer = _int_arg(a.get(key))
            if peer is not None:
                into.add(peer)
                named.append(row)
    calls = {g: c for g, c in calls.items() if g and c[2]}
    if calls:
        group = max(calls, key=lambda g: len(calls[g][2]))
        return PeerExchange(group=group, own=t.rank, sent_to=frozenset(calls[group][0]),
                            received_from=frozenset(calls[group][1]))
    return _exchange_by_span_names(t, max(set(sizes), key=sizes.count) if sizes else group_size)


def _exchange_by_span_names(t: EventTable, size: int) -> PeerExchange | None:
    """peer_exchange from the "nccl:send a->b" / "nccl:recv a<-b" spans of a group of `size` ranks (None where the
    size is unknown, 0, or the spans name more than one rank of their own: several groups)."""
    spans = [P2P_SPAN_RE.match(t.names[i]) for i in t.ids_matching(P2P_SPAN_RE.match).tolist()]
    own = {int(m.group(2)) for m in spans}
    if size <= 0 or len(own) != 1:
        return None
    return PeerExchange(group=tuple(range(size)), own=own.pop(),
                        sent_to=frozenset(int(m.group(3)) for m in spans if m.group(1) == "send"),
                        received_from=frozenset(int(m.group(3)) for m in spans if m.group(1) == "recv"))


def _int_arg(value) -> int | None:
    """A rank or size arg ("Src Rank", "Dst Rank", "Group size": an integer, or its text) as an int; None where absent
    or unreadable."""
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (ValueError, TypeError):
        return None


def pipeline_end(exchange: PeerExchange) -> bool:
    """Whether the rank is the first or last stage of a pipeline by its partners (module docstring): its group has
    more than two ranks, it stands at one end of the group's order, and it sends to and receives from its one
    neighbour there and no one else. False for a ring's ranks (the first also takes from or gives to the last; a ring
    that sends both ways, Transformer Engine's context parallelism in its backward, the same), for a middle rank (a
    pipeline's middle stage and a two-way ring's rank exchange alike), for a group of two (a pipeline of two stages
    and a ring of two exchange alike) and for a stage that only sends or only receives (a generation pipeline's)."""
    group, own = exchange.group, exchange.own
    if len(group) <= 2 or own not in group or group.index(own) not in (0, len(group) - 1):
        return False
    neighbour = group[1] if group.index(own) == 0 else group[-2]
    return exchange.sent_to == exchange.received_from == {neighbour}


def opening_receives(t: EventTable, w: Window, p2p_rows: np.ndarray) -> tuple[np.ndarray, int]:
    """(the send/recv kernels that open their steps, as rows; the analysed steps with send/recv kernels): a step opens
    on its first send/recv kernel (by start) when by its end the step had run at most RECEIVE_FIRST_SHARE of its time
    and OPENING_COMPUTE_SHARE of the step's computation (union of kernel intervals). A trace without steps is one
    step. A kernel's step is its launch's (t.step)."""
    if not p2p_rows.size:
        return p2p_rows[:0], 0
    comp = w.device[compute_mask(t, w.device)] if w.device.size else w.device
    steps = [int(s) for s in w.steps] if (t.step >= 0).any() else [None]
    opening, seen = [], 0
    for s in steps:
        mine = p2p_rows if s is None else p2p_rows[t.step[p2p_rows] == s]
        if not mine.size:
            continue
        seen += 1
        first = mine[np.argmin(w.ts_us[mine])]
        start, end = float(w.ts_us[first]), float(w.end_us[first])
        step = comp if s is None else comp[t.step[comp] == s]
        before = step[w.ts_us[step] < end]
        ran = covered_length(w.ts_us[before], np.minimum(w.end_us[before], end))
        if ran <= RECEIVE_FIRST_SHARE * (end - start) and ran <= OPENING_COMPUTE_SHARE * union_us(w, step):
            opening.append(int(first))
    return np.array(opening, dtype=np.int64), seen


def opens_on_receive_share(opening: np.ndarray, with_p2p: int) -> float:
    """Share (0-1) of the rank's analysed steps with send/recv kernels (with_p2p) that open on a receive (opening:
    opening_receives' rows); 0.0 without send/recv kernels."""
    return opening.size / with_p2p if with_p2p else 0.0


@dataclass(frozen=True, kw_only=True)
class ScheduleNames:
    """What a pipeline schedule's own annotations say of the rank's steps."""

    named: bool                   # a schedule names itself (its actions, or a Python frame)
    micro_batches: int = 0        # per step: the largest forward index + 1 (0: not named)
    chunks: int = 1               # model chunks on the rank: the stages its actions name (interleaved schedules > 1)
    split_backward: bool = False  # backwards split into input and weight halves (I/W: zero-bubble schedules)


def schedule_names(t: EventTable, w: Window) -> ScheduleNames:
    """The schedule's annotations in the window: torch.distributed.pipelining's actions, else Megatron-LM's or
    DeepSpeed's schedule frames (named, nothing else known)."""
    kinds = np.isin(t.kind, (USER_ANNOTATION, CPU_OP, PYTHON)) & w.keep
    actions = t.ids_matching(SCHEDULE_ACTION_RE.match)
    rows = np.flatnonzero(kinds & np.isin(t.name, actions))
    if not rows.size:
        named = t.ids_matching(lambda n: bool(SCHEDULE_ANY_ACTION_RE.match(n) or SCHEDULE_FRAME_RE.search(n)))
        return ScheduleNames(named=bool((kinds & np.isin(t.name, named)).any()))
    forwards, stages, split = [], set(), False
    for name in {t.names[i] for i in np.unique(t.name[rows])}:
        m = SCHEDULE_ACTION_RE.match(name)
        if m.group(1):  # "Forward i" / "Backward i"
            forwards += [int(m.group(2))] if m.group(1) == "Forward" else []
        else:
            stages.add(int(m.group(3)))
            forwards += [int(m.group(5))] if m.group(4) == "F" else []
            split = split or m.group(4) in ("I", "W")
    return ScheduleNames(named=True, micro_batches=max(forwards, default=-1) + 1, chunks=max(len(stages), 1),
                         split_backward=split)


def later_stage(role: str, opens_on_receive: float) -> bool:
    """Whether a rank is a later pipeline stage by its own steps: it opens most of them on a receive
    (opens_on_receive_share > OPENS_ON_RECEIVE_STEPS) and its send/recv's group is not described as context
    parallelism's (p2p_group_role)."""
    return role != "context" and opens_on_receive > OPENS_ON_RECEIVE_STEPS


def stages_from_openings(openings: list[float]) -> int:
    """The pipeline's stages from every send/recv rank's share of steps opened on a receive (one entry per rank of the
    job, all traced): each copy of the pipeline (data- or tensor-parallel) has as many first-stage ranks, which open
    no step on a receive, as ranks per stage, so stages = ranks / first-stage ranks. 0 when that is not a whole number
    of at least 2 (no first stage, or no later one, among the traced ranks)."""
    first = sum(share <= OPENS_ON_RECEIVE_STEPS for share in openings)
    if not first or first == len(openings) or len(openings) % first:
        return 0
    return len(openings) // first


def schedule_bubble_pct(stages: int, micro_batches: int, chunks: int = 1) -> float:
    """The bubble of a GPipe or 1F1B step with balanced stages, % of the step: (p - 1) / (m + p - 1); with v model
    chunks per rank (interleaved 1F1B) the idle shrinks v times, (p - 1) / (v m + p - 1) (Narayanan et al. 2021,
    section 2.2)."""
    return 100.0 * (stages - 1) / (chunks * micro_batches + stages - 1)


def implied_micro_batches(stages: int, bubble_pct: float) -> float:
    """The micro-batches per step that make a balanced GPipe or 1F1B schedule of `stages` idle bubble_pct % of its step
    (the law above solved for m); inf for no bubble."""
    b = bubble_pct / 100.0
    return (stages - 1) * (1.0 - b) / b if b > 0 else float("inf")
