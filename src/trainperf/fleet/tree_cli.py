"""`trainperf fleet tree`: the metric tree over the store's runs (registered by trainperf.fleet.cli)."""

from __future__ import annotations

import typer

from trainperf.cli_options import json_option

from trainperf.store.cli import STORE_HELP, dumps, store_warnings


def tree_cmd(store: str = typer.Option(None, "--store", help=STORE_HELP),
             since: str = typer.Option(None, "--since", help="Only runs started since: unix s, ISO date or age (7d)."),
             job: str = typer.Option(None, "--job", help="Only runs of this job."),
             host: str = typer.Option(None, "--host", help="Only runs on this host."),
             version: str = typer.Option(None, "--code-version", help="Only runs of this git sha (prefix), torch, "
                                                                      "CUDA, NCCL or driver version."),
             usd_per_hour: float = typer.Option(None, "--usd-per-hour", min=0.0,
                                                help="USD per GPU-hour (default: each GPU's catalog price)."),
             explain: bool = typer.Option(False, "--explain", help="Name where the largest loss sits (by job, host, "
                                                                   "version, configuration), and the largest placed "
                                                                   "one when that is spread across runs."),
             factor: str = typer.Option(None, "--factor", help="With --explain: this factor instead of the largest "
                                                               "loss (data_wait, checkpoint, below_plan, ...)."),
             html: str = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
             as_json: bool = json_option("the tree")) -> None:
    """Break allocated GPU-hours into the factors that lose them, in GPU-hours and dollars."""
    import time

    from trainperf.fleet.tree import fleet_tree, parse_since

    with store_warnings():
        tree = fleet_tree(store, since=None if since is None else parse_since(since, time.time()), job=job,
                          host=host, version=version, usd_per_gpu_hour=usd_per_hour)
    expl = []
    if explain or factor:
        from trainperf.fleet.tree_explain import explain as explain_factor
        from trainperf.fleet.tree_explain import explain_largest

        expl = [explain_factor(tree, factor)] if factor else explain_largest(tree)
    if html:
        from trainperf.report.fleet_tree import tree_report

        tree_report(tree, html, expl)
    if as_json:
        out = tree.to_dict()
        if expl:
            out["explain"] = [e.to_dict() for e in expl]
        typer.echo(dumps(out))
        return
    from rich.console import Console

    from trainperf.report.fleet_tree import terminal_tree

    # wrapped to the terminal (80 columns when piped): rich continues a tree line under its guide, where
    # soft_wrap would crop it at the edge and cut its figures
    Console().print(terminal_tree(tree, expl), highlight=False)
