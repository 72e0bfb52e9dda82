"""Trace engine: Kineto JSON (.json/.json.gz, one file or a folder of ranks) into columnar event tables."""

from trainperf.trace.events import CATEGORY_NAMES, KIND_NAMES, EventTable
from trainperf.trace.kineto import read_kineto
from trainperf.trace.load import load_trace

__all__ = ["EventTable", "read_kineto", "load_trace", "KIND_NAMES", "CATEGORY_NAMES"]
