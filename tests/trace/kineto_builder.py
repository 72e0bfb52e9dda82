"""Build small Kineto traces by hand for tests (the format PyTorch's profiler writes)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


class TraceBuilder:
    """Accumulate events; times in µs. `launch` adds a cudaLaunchKernel + its kernel, linked by correlation;
    `graph_launch` a cudaGraphLaunch + the kernels of its graph."""

    def __init__(self, rank: int | None = 0, world_size: int = 1, ns: bool = False):
        self.events: list[dict] = []
        self.rank = rank
        self.world_size = world_size
        self.ns = ns
        self._corr = 1000
        self.device_properties: list[dict] | None = None  # Kineto's deviceProperties, written when set

    def memory(self, ts: float, allocated: int, reserved: int, device: int = 0, device_type: int = 1,
               nbytes: int = 512, name: str = "[memory]") -> "TraceBuilder":
        """Add an allocator sample ("[memory]", as profile_memory=True writes one per allocation and free; name
        "[OutOfMemory]": an allocation that failed): the device and its allocator's totals after it (bytes)."""
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": name, "pid": 10, "tid": 1,
                            "ts": self._t(ts), "args": {"Device Type": device_type, "Device Id": device,
                                                        "Addr": 1 << 40, "Bytes": nbytes, "Total Allocated": allocated,
                                                        "Total Reserved": reserved}})
        return self

    def _t(self, v: float):
        return round(v, 3) if self.ns else v

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args) -> "TraceBuilder":
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 10, "tid": tid, "ts": self._t(ts),
                            "dur": self._t(dur), "args": args})
        return self

    def step(self, n: int, ts: float, dur: float) -> "TraceBuilder":
        return self.cpu(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def launch(self, name: str, launch_ts: float, start: float, dur: float, stream: int = 7,
               cat: str = "kernel", launch_dur: float = 4.0, runtime: str = "cudaLaunchKernel", tid: int = 1,
               device: int = 0, **args) -> int:
        """Add the launch (on host thread `tid`) and its kernel (on GPU `device`: Kineto's pid of device events);
        returns their correlation id."""
        self._corr += 1
        c = self._corr
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": 10, "tid": tid,
                            "ts": self._t(launch_ts), "dur": self._t(launch_dur), "args": {"correlation": c}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": self._t(start),
                            "dur": self._t(dur), "args": {"correlation": c, "stream": stream, "device": device,
                                                          **args}})
        return c

    def graph_launch(self, launch_ts: float, kernels: list[tuple[str, float, float]], launch_dur: float = 15.0,
                     stream: int = 7, tid: int = 1) -> int:
        """Add one cudaGraphLaunch (on host thread `tid`) and the kernels the graph replays ((name, start, dur) each,
        on `stream`), all under its correlation id; returns it."""
        self._corr += 1
        c = self._corr
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 10, "tid": tid,
                            "ts": self._t(launch_ts), "dur": self._t(launch_dur), "args": {"correlation": c}})
        self.events += [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": self._t(start),
                         "dur": self._t(dur), "args": {"correlation": c, "stream": stream, "device": 0}}
                        for name, start, dur in kernels]
        return c

    def doc(self) -> dict:
        d = {"schemaVersion": 1, "traceEvents": self.events}
        if self.device_properties is not None:
            d["deviceProperties"] = self.device_properties
        if self.rank is not None:
            d["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": self.world_size}
        return d

    def write(self, path: Path, gz: bool = True) -> Path:
        data = json.dumps(self.doc(), indent=1).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path
