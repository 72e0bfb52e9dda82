"""Duration events written as begin/end pairs ("ph": "B" then "ph": "E"), made complete ("ph": "X") events.

The Chrome trace event format has two ways to write a span: one complete event with its duration, as Kineto
writes every event, or a "B" event where it begins and an "E" event where it ends, which other writers of the
format use (tracers of Python or of a framework's own spans, converters from other profilers). Chrome's trace
viewer pairs them per thread as a stack: an "E" ends the latest "B" still open on its (pid, tid), and the args
of both belong to the span (the "E"'s added). Pairing them here lets every analysis read one kind of span.

Hand-written: the pairing is a few lines of the format's own rule, and no library of the field exposes it.
"""

from __future__ import annotations


def pair_begin_end(events: list[dict]) -> tuple[list[dict], int]:
    """(complete "X" events, number of events left unpaired) from "B"/"E" events in file order: each "E" closes the
    latest open "B" of its (pid, tid), in µs as written (ts and dur). A "B" never closed (the trace cut before
    its end) and an "E" with none open are left out and counted, as an event the trace does not complete."""
    open_by_thread: dict[tuple, list[dict]] = {}
    out: list[dict] = []
    unpaired = 0
    for ev in events:
        key = (ev.get("pid", -1), ev.get("tid", -1))
        if ev.get("ph") == "B":
            open_by_thread.setdefault(key, []).append(ev)
            continue
        stack = open_by_thread.get(key)
        if not stack:
            unpaired += 1
            continue
        begin = stack.pop()
        try:
            dur = float(ev["ts"]) - float(begin["ts"])
        except (KeyError, TypeError, ValueError):
            unpaired += 1
            continue
        span = {k: v for k, v in begin.items() if k != "ph"}
        span["ph"] = "X"
        span["dur"] = dur if dur > 0 else 0
        span.setdefault("cat", ev.get("cat", ""))
        if isinstance(ev.get("args"), dict):
            span["args"] = {**(begin.get("args") if isinstance(begin.get("args"), dict) else {}), **ev["args"]}
        out.append(span)
    unpaired += sum(len(s) for s in open_by_thread.values())
    return out, unpaired
