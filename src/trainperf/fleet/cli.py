"""Commands of the `fleet` verb (registered on the main app by trainperf.cli)."""

import typer


def register(app: typer.Typer) -> None:
    """Add this verb's commands to app."""
