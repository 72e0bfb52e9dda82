"""The error a user can cause: one clear line, never a traceback (bugs stay tracebacks)."""


class TrainperfError(Exception):
    """A problem with the user's input or environment; the CLI prints it on one line and exits 2."""

    exit_code = 2


class NotATraceError(TrainperfError):
    """A file that holds no trace events at all (a config, labels or metrics JSON beside the traces)."""
