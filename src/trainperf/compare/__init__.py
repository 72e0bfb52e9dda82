"""A/B of two training runs: is B faster (with an interval), and is it still the same training?"""

from trainperf.compare.api import Comparison, compare_runs
from trainperf.compare.runs import RunData, load_run, load_side

__all__ = ["Comparison", "RunData", "compare_runs", "load_run", "load_side"]
