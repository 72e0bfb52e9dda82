"""The rate a copy between host and device runs at from pinned memory: what pinning a pageable copy leaves of it.

A copy from pageable memory is staged by the driver through a pinned buffer, chunk by chunk, at the rate of the CPU's
memcpy (6.6 GB/s for a 128-MB input on an H200 host, against ~55 GB/s pinned over its PCIe Gen5 x16 link); from pinned
memory the device's copy engine reads the host memory itself, at the link's rate. Pinning the buffer and copying
with non_blocking=True stops the host blocking, but the copy still runs on its stream, ahead of the work that needs
it, at that rate (the H200 loop's 128-MB input: 39.1 -> 25.2 ms a step pinned, 23.3 ms with the input on the device).
So the fix of a pageable copy is priced with the copy at the pinned rate, taken from the trace where it has pinned
copies of its own to measure, else from the device's host link (hardware catalog, host_link_gbps) at the share of it
pinned copies reach."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainperf.diagnose.roofline import device_accelerator
from trainperf.trace.annotate import correlated_host_row
from trainperf.trace.categories import copy_direction
from trainperf.trace.events import MEMCPY, EventTable

# A pinned copy's share of its link's one-direction peak: CUDA's bandwidthTest reads ~25 GB/s pinned over PCIe Gen4
# x16 (31.5 GB/s) and ~50-55 over Gen5 x16 (63 GB/s): 0.8 of it, stated, not fitted.
PINNED_COPY_EFFICIENCY = 0.8
# the link assumed where the device is not in the catalog: PCIe Gen4 x16 (A100, MI250, L40S, ...), one direction
# (GB/s); the slower of the two current generations, so the copy left after the fix is not under-priced
DEFAULT_HOST_LINK_GBPS = 32.0
# pinned copies of the trace measure the link only when large enough that the transfer, not the copy's fixed
# latency (a few us), sets their time (1 MiB at 25 GB/s: 42 us)
PINNED_MEASURE_MIN_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class PinnedRate:
    """The pinned host-device copy rate a fix is priced at (GB/s) and where it comes from (words, for the what-if)."""

    gbps: float
    source: str


def pinned_copies(t: EventTable, pageable: np.ndarray = np.array([], dtype=np.int64)) -> np.ndarray:
    """Rows of the host-device copies of at least PINNED_MEASURE_MIN_BYTES from or to pinned memory: named so (CUPTI,
    nsys: "Pinned -> Device"), or, where the name does not say (roctracer's "Host -> Device"), whose asynchronous
    launching call (hip/cudaMemcpy*Async*) returned before half the copy had run: a copy from pageable memory is staged
    by the call itself, which returns only once it is done (a synchronous call, hipMemcpyWithStream, is not read so:
    one that "returns" before its copy ran is a clock's artefact, not a pinned copy). `pageable`: rows of copies known
    to be from pageable memory (the host blocked on them after a call that returned early: hipMemcpyAsync, then a
    synchronize), never taken."""
    copies = np.flatnonzero((t.kind == MEMCPY) & (t.nbytes >= PINNED_MEASURE_MIN_BYTES) & (t.dur_ns > 0))
    copies = copies[~np.isin(copies, pageable)]
    names = [t.names[int(t.name[r])] for r in copies]
    host_device = np.array([copy_direction(n) in ("HtoD", "DtoH") for n in names], dtype=bool)
    named = np.array(["Pinned" in n for n in names], dtype=bool)
    unnamed = np.array(["Pinned" not in n and "Pageable" not in n for n in names], dtype=bool)
    call = correlated_host_row(t)[copies]
    call_end = np.where(call >= 0, t.ts_ns[call] + t.dur_ns[call], np.iinfo(np.int64).max)
    asynchronous = np.isin(t.name[call], t.ids_matching(lambda n: "Async" in n)) & (call >= 0)
    returned_early = asynchronous & (call_end < t.ts_ns[copies] + t.dur_ns[copies] // 2)
    return copies[host_device & (named | (unnamed & returned_early))]


def pinned_copy_rate(t: EventTable, pageable: np.ndarray = np.array([], dtype=np.int64)) -> PinnedRate:
    """The rate (GB/s) a host-device copy runs at from pinned memory on this trace's machine: the trace's own pinned
    copies (pinned_copies, `pageable` left out: their bytes over their time), else the device's host link times
    PINNED_COPY_EFFICIENCY, else DEFAULT_HOST_LINK_GBPS times it."""
    pinned = pinned_copies(t, pageable)
    if pinned.size:
        gbps = float(t.nbytes[pinned].sum() / t.dur_ns[pinned].sum())  # bytes per ns = GB/s
        return PinnedRate(gbps=gbps, source=f"measured on the trace's {pinned.size} pinned copies")
    acc = device_accelerator(t)
    link = acc.host_link_gbps if acc is not None else None
    if link:
        return PinnedRate(gbps=link * PINNED_COPY_EFFICIENCY,
                          source=f"{PINNED_COPY_EFFICIENCY:g} of the {acc.name}'s {link:g} GB/s host link")
    return PinnedRate(gbps=DEFAULT_HOST_LINK_GBPS * PINNED_COPY_EFFICIENCY,
                      source=f"{PINNED_COPY_EFFICIENCY:g} of an assumed PCIe Gen4 x16 link "
                             f"({DEFAULT_HOST_LINK_GBPS:g} GB/s)")


def pinned_copy_us(dur_us: np.ndarray, nbytes: np.ndarray, gbps: float) -> np.ndarray:
    """Each copy's time (µs) from pinned memory at `gbps`: its bytes over the rate, or its own time where that is
    shorter (a copy already as fast) or its size unknown (nbytes < 0)."""
    at_rate = np.where(nbytes >= 0, nbytes / (gbps * 1e3), np.inf)  # bytes / (GB/s) = ns; / 1e3 = µs
    return np.minimum(dur_us, at_rate)
