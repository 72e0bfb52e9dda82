"""In-loop step instrumentation usable from any training loop (see monitor.monitor)."""

from trainperf.monitor.goodput import Goodput, compute_goodput
from trainperf.monitor.monitor import Monitor, MonitorSummary, StepTimer
from trainperf.monitor.profiler import StepProfiler, parse_steps, trace_path

__all__ = ["Goodput", "Monitor", "MonitorSummary", "StepProfiler", "StepTimer", "compute_goodput", "parse_steps",
           "trace_path"]
