"""Python's garbage collector's pauses, timed from its own callbacks: what each monitored step spent collecting.

CPython calls every function in ``gc.callbacks`` with "start" and "stop" around each collection, whatever started it
(a generation's allocation threshold, or ``gc.collect()``), on the thread that started it while the interpreter's
other threads wait. A collection of the oldest generation walks every tracked object: with the millions a model's
start-up leaves (modules, parameters' Python wrappers, dataset indices) one takes tens to hundreds of ms, on each
rank at its own moment, and the ranks that did not collect wait for it at the next collective (torchtitan turns
automatic collection off for this, tools/utils.py GarbageCollection; `trainperf diagnose` names it gc_stall where
the profile recorded the collections).

One hook for the process, installed on first use: running totals that each GcClock reads the change of. Hand-written:
the standard library has the hook and nothing that times it; one callback, a perf_counter read per phase (~1 us a
collection), no allocation.
"""

from __future__ import annotations

import gc
import time

_perf_counter = time.perf_counter
# seconds, collections, full collections (the oldest generation, 2) since the hook was installed; the start of the
# collection running now
_totals = [0.0, 0, 0]
_started = [0.0]


def _on_collection(phase: str, info: dict) -> None:
    """gc.callbacks entry: times each collection (collections never nest: the collector does not re-enter)."""
    if phase == "start":
        _started[0] = _perf_counter()
        return
    _totals[0] += _perf_counter() - _started[0]
    _totals[1] += 1
    _totals[2] += info.get("generation") == 2


def gc_totals() -> tuple[float, int, int]:
    """(seconds, collections, full collections) the collector ran in this process since the hook was installed
    (installed by the first call)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)
    return _totals[0], _totals[1], _totals[2]


class GcClock:
    """The collector's pauses between successive ``take()`` calls."""

    def __init__(self):
        self._last = gc_totals()

    def take(self) -> tuple[float, int, int]:
        """(seconds, collections, full collections) since the last take (or since the clock was made)."""
        now = gc_totals()
        last, self._last = self._last, now
        return now[0] - last[0], now[1] - last[1], now[2] - last[2]
