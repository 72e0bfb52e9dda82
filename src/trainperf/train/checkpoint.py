"""Fault-tolerant checkpoints with torch.distributed.checkpoint (DCP): sharded, async, atomic.

Layout of ``<run>/checkpoints/``::

    step-00000010/            a complete checkpoint (DCP shards + .metadata + trainperf.json)
    .step-00000020.tmp/       a save in progress (or one a crash cut short: never loaded)

A save writes into the hidden ``.tmp`` folder; when DCP has finished on every rank (the
coordinator writes ``.metadata`` only after all ranks' shards are written), rank 0 writes
``trainperf.json`` (step, model, layout) and renames the folder: the rename is the commit,
so a checkpoint is visible only when complete. Async saves stage the state to CPU memory
on the caller's thread, then write on a background thread with its own gloo process group
(training collectives and checkpoint collectives never share a communicator). Only the
newest ``keep`` checkpoints are kept.

State: model and optimizer (``get_state_dict``: plain, DDP, FSDP2 and TP models alike),
the LR schedule, the step, the data position (samples consumed per rank) and every rank's
RNG states: resuming continues bit-for-bit where the checkpoint was taken.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from trainperf.atomic import atomic_write_text
from trainperf.errors import TrainperfError

_DONE = re.compile(r"^step-(\d{8})$")
MANIFEST = "trainperf.json"
SAVE_SPAN = "trainperf.checkpoint.save"  # profiler span names of the loop's checkpoint work
WAIT_SPAN = "trainperf.checkpoint.wait"


def _is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Return the committed checkpoints under ``root`` as (step, path), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _DONE.match(p.name)
        if m and p.is_dir() and (p / MANIFEST).is_file() and (p / ".metadata").is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def rng_state(device: torch.device) -> dict:
    """Return this process's RNG states (CPU, and the current CUDA device) as tensors."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore RNG states returned by ``rng_state``."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def check_fingerprint(saved: dict, current: dict, path: Path) -> None:
    """Raise TrainperfError naming what differs when a checkpoint belongs to another model or layout."""
    for section in ("model", "layout"):
        a, b = saved.get(section, {}), current.get(section, {})
        diffs = [f"{k}={a.get(k)!r} (this run: {b.get(k)!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        if diffs:
            raise TrainperfError(
                f"{path}: checkpoint of another {section}: {', '.join(diffs[:4])}; "
                "use another --out folder, or --no-resume to start afresh"
            )


class Checkpointer:
    """Saves, commits, prunes and restores the checkpoints of one run folder.

    ``fingerprint`` = {"model": {...}, "layout": {...}}: what must match to resume.
    """

    def __init__(self, run_dir: str | Path, fingerprint: dict, *, keep: int = 3, async_save: bool = True,
                 device: torch.device = torch.device("cpu")):
        self.root = Path(run_dir) / "checkpoints"
        self.fingerprint = fingerprint
        self.keep = max(int(keep), 1)
        self.async_save = async_save
        self.device = device
        self.rank = dist.get_rank() if _is_dist() else 0
        self.pg = None
        self._pending: tuple[int, Path, object] | None = None  # (step, tmp dir, future)
        if _is_dist():
            # DCP's planning collectives run on the save thread: give them their own group.
            self.pg = dist.new_group(backend="gloo")
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            for p in self.root.glob(".step-*.tmp"):  # saves a crash cut short: never loadable
                shutil.rmtree(p, ignore_errors=True)
        if _is_dist():
            dist.barrier()

    # -- state ----------------------------------------------------------------------

    def _state(self, model, optimizer, train_state: dict) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, optimizer)
        return {"model": msd, "optim": osd, "train": train_state, f"rng_rank{self.rank}": rng_state(self.device)}

    def _dcp_kw(self, checkpoint_dir: Path) -> dict:
        """Return DCP's save/load arguments for ``checkpoint_dir`` (``no_dist`` in a single process)."""
        kw = {"checkpoint_id": str(checkpoint_dir), "process_group": self.pg}
        if not _is_dist():
            kw["no_dist"] = True
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        return kw

    # -- save -----------------------------------------------------------------------

    def save(self, step: int, model, optimizer, train_state: dict) -> None:
        """Save the state after ``step`` (async: returns once staged; the write continues behind)."""
        self.wait()  # one save in flight at a time
        # A named span, so that a profiler trace shows the time the loop spends saving
        # (what `trainperf diagnose` reports as checkpoint_stall). It holds the first save's import of DCP
        # too (60-83 ms on this container's 2 cores): the loop pays it as part of saving, and left outside the
        # span it read as the loop's own work (checkpoint_stall-high-real priced 26.1 % of 42.7 % true).
        with torch.profiler.record_function(SAVE_SPAN):
            import torch.distributed.checkpoint as dcp

            tmp = self.root / f".step-{step:08d}.tmp"
            state = self._state(model, optimizer, {**train_state, "step": int(step)})
            kw = self._dcp_kw(tmp)
            if self.async_save:
                fut = dcp.async_save(state, **kw, **self._stager_kw())
                fut = getattr(fut, "upload_completion", fut)  # AsyncSaveResponse on newer torch
                self._pending = (step, tmp, fut)
            else:
                dcp.save(state, **kw)
                self._commit(step, tmp)

    def _stager_kw(self) -> dict:
        """Staging without pinned memory on CPU (non-blocking copies need an accelerator).

        One stager per Checkpointer, so that its staging buffers can be reused across saves.
        """
        if not hasattr(self, "_stager"):
            self._stager = self._make_stager()
        return {"async_stager": self._stager} if self._stager is not None else {}

    def _make_stager(self):
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        except ImportError:  # older torch: async_save's own staging
            return None
        cuda = self.device.type == "cuda"
        return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                            use_async_staging=False, use_non_blocking_copy=cuda))

    @property
    def in_flight(self) -> bool:
        """True while an async save is being written."""
        return self._pending is not None

    def poll(self) -> None:
        """Commit the save in flight if it has finished (cheap; call every step)."""
        if self._pending is not None and self._pending[2].done():
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight is written, then commit it."""
        if self._pending is None:
            return
        step, tmp, fut = self._pending
        self._pending = None
        with torch.profiler.record_function(WAIT_SPAN):
            fut.result()
            self._commit(step, tmp)

    def _commit(self, step: int, tmp: Path) -> None:
        if self.rank != 0:  # rank 0's save ends after every rank's shards are written
            return
        final = self.root / f"step-{step:08d}"
        atomic_write_text(tmp / MANIFEST, json.dumps({"step": step, **self.fingerprint}, indent=1, default=str))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in complete_checkpoints(self.root)[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    # -- load -----------------------------------------------------------------------

    def latest(self) -> Path | None:
        """Return the newest complete checkpoint, or None."""
        done = complete_checkpoints(self.root)
        return done[-1][1] if done else None

    def load(self, path: Path, model, optimizer, train_state: dict) -> dict:
        """Restore model, optimizer and RNG from ``path``; return the saved train state.

        ``train_state`` is a template with the keys to read (e.g. lr_scheduler, data_position).
        Raises TrainperfError when the checkpoint belongs to another model or layout.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        manifest = json.loads((path / MANIFEST).read_text())
        check_fingerprint(manifest, self.fingerprint, path)
        state = self._state(model, optimizer, {**train_state, "step": 0})
        kw = self._dcp_kw(path)
        try:
            dcp.load(state, **kw)
        except Exception as e:  # noqa: BLE001 - DCP raises CheckpointException with per-rank details
            raise TrainperfError(f"{path}: cannot load this checkpoint ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        set_rng_state(state[f"rng_rank{self.rank}"], self.device)
        return state["train"]
