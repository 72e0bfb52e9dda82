"""Terminal table of the time per nn.Module (modules.py), printed by `trainperf diagnose --modules`."""

from __future__ import annotations

from rich.table import Table

from trainperf.diagnose.modules import ModuleBreakdown

BASIS_TEXT = {"gpu": "GPU time (kernels, memcpy, memset) launched by each module's forward and by the "
                     "backward nodes of its forward ops",
              "cpu_op": "CPU operator time (no device events in this trace), not GPU time"}


def print_modules(breakdowns: list[ModuleBreakdown], console, top: int = 40) -> None:
    """One table per rank: module paths indented by depth, time per step (ms) of the forward and the backward
    (inclusive: with the submodules'), exclusive time (both passes), inclusive share of the step, forward calls
    per step; the `top` longest rows, parents kept before children. Inclusive totals and events per step are
    in the JSON."""
    for b in breakdowns:
        if not b.rows:
            console.print(f"rank {b.rank}: no time to attribute to modules", highlight=False)
            continue
        keep = {r.path for r in sorted(b.rows, key=lambda r: -r.inclusive_us_per_step)[:top]}
        t = Table(title=f"rank {b.rank}: time per nn.Module, per step ({b.steps} step(s)); "
                        f"{b.in_modules_pct:.1f}% in modules", title_justify="left")
        names = {r.path: "  " * max(r.depth - 1, 0) + (r.path.rsplit("/", 1)[-1] if r.depth else r.path)
                 for r in b.rows if r.path in keep}
        t.add_column("module", min_width=min(max(map(len, names.values())), 28), overflow="fold")
        for col in ("fwd ms", "bwd ms", "excl ms", "% step", "calls"):  # incl = fwd + bwd (in the JSON)
            t.add_column(col, justify="right")
        for r in b.rows:
            if r.path not in keep:
                continue
            name = names[r.path]
            t.add_row(name, *(f"{us / 1e3:.3f}" for us in (r.forward_us_per_step, r.backward_us_per_step,
                                                           r.exclusive_us_per_step)),
                      f"{r.pct_of_step:.1f}", f"{r.calls_per_step:g}")
        console.print(t)
        console.print(f"basis: {BASIS_TEXT[b.basis]}; total {b.total_us_per_step / 1e3:.3f} ms per step, "
                      f"backward {b.backward_us_per_step / 1e3:.3f} ms of it, "
                      f"{b.unlinked_backward_us_per_step / 1e3:.3f} ms not attributed to a module", highlight=False)
