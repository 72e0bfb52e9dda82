"""What a trace says of its process groups: each group's role by its description, where PyTorch wrote one.

PyTorch >= 2.3 writes every process group into the trace's `distributedInfo.pg_config` (pg_name, pg_desc, pg_size),
and each collective's kernel names its group ("Process Group Name"). The description is the framework's name for the
group: Megatron-LM's TENSOR_MODEL_PARALLEL_GROUP, DATA_PARALLEL_GROUP(_WITH_CP), PIPELINE_MODEL_PARALLEL_GROUP,
CONTEXT_PARALLEL_GROUP, EXPERT_MODEL_PARALLEL_GROUP; a DeviceMesh's "mesh_<dim>" (torchtitan's tp, dp_shard, pp, cp,
ep). A description is read as a role only where exactly one role names it ("default_pg", "undefined", a group of two
dimensions such as TENSOR_AND_DATA_PARALLEL_GROUP: none), except that a data-parallel group folded with context
parallelism (DATA_PARALLEL_GROUP_WITH_CP, "dp_shard_cp") reduces gradients: data.
"""

from __future__ import annotations

import json
import re

import numpy as np

from trainperf.trace.events import EventTable

ROLE_RES = {
    "pipeline": re.compile(r"pipe|(?<![a-z])pp(?![a-z])", re.IGNORECASE),
    "context": re.compile(r"context|(?<![a-z])cp(?![a-z])", re.IGNORECASE),
    "tensor": re.compile(r"tensor|(?<![a-z])tp(?![a-z])", re.IGNORECASE),
    "data": re.compile(r"data|(?<![a-z])(?:dp|ddp|fsdp|hsdp)(?![a-z])", re.IGNORECASE),
    "expert": re.compile(r"expert|(?<![a-z])ep(?![a-z])", re.IGNORECASE),
}


def described_role(desc: str) -> str:
    """The role a process group's description names: "pipeline", "context", "tensor", "data" or "expert"; "" where
    none does, or several (module docstring: data with context is data)."""
    roles = {role for role, pattern in ROLE_RES.items() if pattern.search(desc)}
    if roles == {"data", "context"}:
        return "data"
    return roles.pop() if len(roles) == 1 else ""


def group_config(t: EventTable) -> dict[str, tuple[str, int]]:
    """pg_name -> (its description, its size; 0 unknown), as the trace's distributedInfo.pg_config gives them (empty
    where it gives none)."""
    info = t.metadata.get("distributedInfo")
    config = info.get("pg_config") if isinstance(info, dict) else None
    out: dict[str, tuple[str, int]] = {}
    for c in config if isinstance(config, list) else []:
        if isinstance(c, dict) and "pg_name" in c:
            size = c.get("pg_size")
            out[str(c["pg_name"])] = (str(c.get("pg_desc", "")),
                                      int(size) if isinstance(size, (int, float)) and size > 0 else 0)
    return out


def int_list(value) -> tuple[int, ...]:
    """A collective's list arg ("Process Group Ranks", "In split size": a JSON list of integers, as text or parsed; a
    list Kineto cut short ends in "..." and is unreadable) as a tuple; () where absent or unreadable."""
    try:
        items = json.loads(value) if isinstance(value, str) else value
        return tuple(int(r) for r in items) if isinstance(items, (list, tuple)) else ()
    except (ValueError, TypeError):
        return ()


def collective_calls(t: EventTable, which, keep: np.ndarray | None = None) -> list[tuple[int, dict]]:
    """(row, its kept args: chunk.COMM_ARGS) of every event whose "Collective name" `which` accepts (a predicate on
    the name), a call's record_param_comms and its kernel alike, among the rows of `keep` (a row mask; None: the
    whole trace), in row order."""
    names = t.ids_matching(which)
    if not names.size:
        return []
    hit = np.isin(t.collective, names) & (t.args >= 0)
    rows = np.flatnonzero(hit if keep is None else hit & keep)
    kept = t.kept_args() if rows.size else []
    return [(row, kept[int(t.args[row])]) for row in rows.tolist()]


def row_roles(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per kernel row, the described role of its process group ("" where the trace does not describe it)."""
    config = group_config(t)
    out = np.full(rows.size, "", dtype=object)
    if not config or not rows.size:
        return out
    groups = t.process_group[rows]
    for g in np.unique(groups[groups >= 0]).tolist():
        desc = config.get(t.names[g])
        if desc is not None:
            out[groups == g] = described_role(desc[0])
    return out
