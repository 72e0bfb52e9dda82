"""What communication beside the computation costs it (diagnose/contention.py) on every real trace folder at hand with
communication kernels: per rank, the computation beside a collective, the share of it with calls alone to compare
with, the works compared and slowed, and the time the overlap adds (% of the computation). The negative control of
`comm_contention`: no trace at hand is labeled with contention.

    .venv/bin/python benchmarks/contention_real_traces.py
"""

from __future__ import annotations

import warnings

import numpy as np
from rich.console import Console
from rich.table import Table

from real_traces_top3 import real_trace_folders
from trainperf.diagnose.contention import slowed_by_communication
from trainperf.diagnose.gpu_time import compute_mask
from trainperf.diagnose.window import analysis_window
from trainperf.errors import TrainperfError
from trainperf.trace.load import load_trace


def main() -> None:
    """Print one row per rank of each real folder whose window holds communication kernels."""
    table = Table("folder", "rank", "computation ms", "beside comm ms", "compared %", "works compared",
                  "works slowed", "extra % of computation", "slowdown x")
    for folder in real_trace_folders():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tables = load_trace(folder)
        except TrainperfError:
            continue
        for rank, t in tables.items():
            try:
                w = analysis_window(t)
            except TrainperfError:
                continue
            c = slowed_by_communication(t, w)
            if c is None:
                continue
            comp = w.device[compute_mask(t, w.device)]
            comp_us = float((w.end_us[comp] - w.ts_us[comp]).sum())
            table.add_row(str(folder.relative_to(folder.parents[1])), str(rank), f"{comp_us / 1e3:.1f}",
                          f"{c.overlapped_us / 1e3:.1f}", f"{100 * c.compared_us / max(c.overlapped_us, 1e-9):.0f}",
                          str(c.works_compared), str(len(c.slowed)), f"{100 * c.extra_us / max(comp_us, 1e-9):.2f}",
                          f"{c.slowdown:.2f}")
    Console(width=200).print(table)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
