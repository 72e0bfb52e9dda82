"""Token streams for the trainer: local text files (byte tokens) or synthetic tokens.

Every sample is addressed by a global index ``g``, so the data order is a pure function of
(seed, g): a run's data position is one integer (samples consumed per rank), saved in the
checkpoint, and resuming at that position continues with exactly the same batches. Data
parallel rank ``d`` of ``dp`` takes, for its ``c``-th sample, the global index
``(c // mbs) * dp * mbs + d * mbs + c % mbs``: one step of ``dp`` ranks with micro-batch
``mbs`` reads the same samples as one rank with micro-batch ``dp * mbs``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from trainperf.errors import TrainperfError

SHIPPED_TEXT = "kjv_genesis.txt"
HOLDOUT_FRACTION = 0.05  # the last 5% of a text's windows: the held-out split, never trained on


def shipped_text_path() -> Path:
    """Return the path of the shipped public-domain text sample (see train/data/README.md)."""
    return Path(str(resources.files("trainperf.train").joinpath("data", SHIPPED_TEXT)))


def read_byte_tokens(paths: list[Path]) -> np.ndarray:
    """Return the UTF-8 bytes of the text files, concatenated, as uint8 tokens (vocab 256).

    Raises TrainperfError naming a file that is missing, unreadable or empty.
    """
    chunks = []
    for p in paths:
        p = Path(p)
        files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
        if not files:
            raise TrainperfError(f"{p}: no text files in this folder")
        for f in files:
            try:
                data = f.read_bytes()
            except OSError as e:
                raise TrainperfError(f"{f}: cannot read text data ({e.strerror or e})") from None
            chunks.append(np.frombuffer(data, dtype=np.uint8))
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
    if tokens.size == 0:
        raise TrainperfError(f"{', '.join(map(str, paths))}: the text data is empty")
    return tokens


class TextWindows(Dataset):
    """Sample g = one (input, target) window of ``seq_len`` byte tokens; windows reshuffled per epoch.

    The last ``HOLDOUT_FRACTION`` of the windows (at least one, when there are two or more) are
    the held-out split: never trained on, read in order by ``eval_sample``.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int = 0, source: str = "text"):
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.seq_len = seq_len
        self.seed = seed
        n_total = (len(tokens) - 1) // seq_len
        if n_total < 1:
            raise TrainperfError(f"{source}: {len(tokens)} tokens is shorter than one window of seq_len+1 = {seq_len + 1}")
        self.n_eval = max(1, round(HOLDOUT_FRACTION * n_total)) if n_total >= 2 else 0
        self.n_windows = n_total - self.n_eval
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None

    def __len__(self) -> int:  # the stream is endless; a DataLoader only needs a length hint
        return 2**62

    def __getitem__(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, j = divmod(int(g), self.n_windows)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng((self.seed, epoch)).permutation(self.n_windows)
            self._perm_epoch = epoch
        return self._window(int(self._perm[j]))

    def _window(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len
        w = self.tokens[start:start + self.seq_len + 1]
        return w[:-1], w[1:]

    def eval_sample(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return held-out window ``j`` (modulo the held-out count; the training windows when there is none)."""
        if self.n_eval == 0:
            return self._window(j % self.n_windows)
        return self._window(self.n_windows + j % self.n_eval)

    def fingerprint(self) -> str:
        """Return the sha256 of the token stream (the data's identity for comparing runs)."""
        import hashlib

        return hashlib.sha256(self.tokens.numpy().astype(np.uint8).tobytes()).hexdigest()


class SyntheticTokens(Dataset):
    """Sample g = uniform random tokens from a generator seeded by (seed, g): no I/O, any vocab."""

    def __init__(self, vocab: int, seq_len: int, seed: int = 0):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed

    def __len__(self) -> int:
        return 2**62

    def __getitem__(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(g))
        w = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=gen)
        return w[:-1], w[1:]

    def eval_sample(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return held-out sample ``j``: from a generator stream no training sample uses (negative seeds)."""
        gen = torch.Generator().manual_seed(2**62 - 1 - (self.seed * 1_000_003 + int(j)))
        w = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=gen)
        return w[:-1], w[1:]

    def fingerprint(self) -> str:
        """Return the data's identity for comparing runs."""
        return f"synthetic-uniform-v{self.vocab}"


class RankSampler(Sampler[int]):
    """Endless global sample indices of one data-parallel rank, starting at its ``position``."""

    def __init__(self, dp_rank: int, dp: int, mbs: int, position: int = 0):
        self.dp_rank, self.dp, self.mbs, self.position = dp_rank, dp, mbs, position

    def __iter__(self) -> Iterator[int]:
        c = self.position
        while True:
            yield (c // self.mbs) * self.dp * self.mbs + self.dp_rank * self.mbs + c % self.mbs
            c += 1


@dataclass
class DataConfig:
    """Where tokens come from and how they are loaded."""

    text: list[str] | None = None  # files or folders; None: the shipped sample
    synthetic: bool = False
    seed: int = 0
    num_workers: int = 0
    prefetch_factor: int = 4


def make_dataset(cfg: DataConfig, vocab: int, seq_len: int) -> Dataset:
    """Return the dataset named by ``cfg`` for a model of ``vocab`` tokens and ``seq_len``."""
    if cfg.synthetic:
        return SyntheticTokens(vocab, seq_len, cfg.seed)
    paths = [Path(p) for p in cfg.text] if cfg.text else [shipped_text_path()]
    if vocab < 256:
        raise TrainperfError(f"text data uses byte tokens (256) but the model's vocab is {vocab}; use --synthetic")
    return TextWindows(read_byte_tokens(paths), seq_len, cfg.seed, source=", ".join(map(str, paths)))


def make_loader(dataset: Dataset, cfg: DataConfig, dp_rank: int, dp: int, mbs: int, position: int,
                pin_memory: bool) -> DataLoader:
    """Return a DataLoader of (tokens, targets) micro-batches of ``mbs`` for one dp rank from ``position``."""
    kw = {}
    if cfg.num_workers > 0:
        kw = {"prefetch_factor": cfg.prefetch_factor, "persistent_workers": False}
    return DataLoader(dataset, batch_size=mbs, sampler=RankSampler(dp_rank, dp, mbs, position),
                      num_workers=cfg.num_workers, pin_memory=pin_memory, drop_last=True, **kw)


def eval_batches(dataset: Dataset, dp_rank: int, dp: int, mbs: int, n_batches: int,
                 device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Return the fixed held-out micro-batches of one data-parallel rank: ``n_batches`` of ``mbs``
    samples, rank ``d`` taking held-out samples ``(b * dp + d) * mbs ...`` (the same every evaluation)."""
    out = []
    for b in range(n_batches):
        first = (b * dp + dp_rank) * mbs
        xs, ys = zip(*(dataset.eval_sample(first + i) for i in range(mbs)))
        out.append((torch.stack(xs).to(device), torch.stack(ys).to(device)))
    return out


class DevicePrefetcher:
    """Iterate batches already on ``device``: on CUDA the next batch is copied on a side stream
    while the current step computes; elsewhere the batch is moved in line.

    ``wait_s`` after each ``next()`` holds the seconds the caller was blocked (data wait).
    """

    def __init__(self, loader: DataLoader, device: torch.device):
        self.it = iter(loader)
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.wait_s = 0.0
        self._next = None
        if self.cuda:
            self._preload()

    def _preload(self) -> None:
        x, y = next(self.it)
        with torch.cuda.stream(self.stream):
            self._next = (x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        if not self.cuda:
            x, y = next(self.it)
            self.wait_s = time.perf_counter() - t0
            return x.to(self.device), y.to(self.device)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        x, y = self._next
        x.record_stream(torch.cuda.current_stream(self.device))
        y.record_stream(torch.cuda.current_stream(self.device))
        self._preload()
        self.wait_s = time.perf_counter() - t0
        return x, y
