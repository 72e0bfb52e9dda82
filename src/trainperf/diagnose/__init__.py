"""diagnose: analyses on trace event tables, findings with evidence, what-if replay, `trainperf diagnose`.

Entry point: ``trainperf.diagnose.api.diagnose(path)``. Each analysis is a pure function of an
EventTable and its analysis Window (gpu_time, launch, host, steps, crossrank, replay).
"""
