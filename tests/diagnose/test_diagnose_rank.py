"""Ranking: stalls (waste the trace measures) first, then fixes whose effect the trace measures, then assumed
speed-ups of a chosen size; each by marginal gain."""

from trainperf.diagnose import findings as F
from trainperf.diagnose.replay import Change


def _finding(kind, change, gain_pct):
    f = F.make(kind, [0], [1], {"x": (1.0, "%")}, changes=(change,), evidence_pct=100.0)
    f.gain_pct = gain_pct
    f.severity = F.severity_of(gain_pct)
    return f


def test_measured_removal_outranks_a_larger_assumed_speed_up():
    launch = _finding("launch_bound", Change("host_speedup", factor=2.0), 30.0)
    loader = _finding("data_loader_stall", Change("remove_data_wait"), 12.0)
    fused = _finding("memory_bound_unfused", Change("speedup", factor=2.0), 20.0)
    ranked = F.merge_across_ranks([launch, fused, loader])
    assert [f.kind for f in ranked] == ["data_loader_stall", "launch_bound", "memory_bound_unfused"]


def test_a_stall_ranks_before_a_larger_restructuring():
    # a 1.8 % DataLoader wait on a trace whose launches cost 5 %: the wait is fixed first (num_workers)
    launch = _finding("launch_bound", Change("graph_launches"), 5.0)
    loader = _finding("data_loader_stall", Change("remove_data_wait"), 1.8)
    ranked = F.merge_across_ranks([launch, loader])
    assert [f.kind for f in ranked] == ["data_loader_stall", "launch_bound"]


def test_a_stall_below_the_floor_does_not_jump_the_queue():
    launch = _finding("launch_bound", Change("graph_launches"), 30.0)
    sync = _finding("host_sync", Change("remove_syncs"), F.STALL_FIRST_MIN_GAIN_PCT / 2)
    fused = _finding("memory_bound_unfused", Change("speedup", factor=2.0), 40.0)
    ranked = F.merge_across_ranks([sync, fused, launch])
    assert [f.kind for f in ranked] == ["launch_bound", "memory_bound_unfused", "host_sync"]


def test_rank_by_marginal_gain_uses_the_same_order():
    # gains of fixes applied together: additive here, so each marginal gain equals its gain alone
    alone = {"host_speedup": 30.0, "remove_data_wait": 12.0}

    def gain(changes):
        return sum(alone[c.kind] for c in changes), 0.0

    launch = _finding("launch_bound", Change("host_speedup", factor=2.0), 0.0)
    loader = _finding("data_loader_stall", Change("remove_data_wait"), 0.0)
    ranked, plan = F.rank_by_marginal_gain([launch, loader], gain)
    assert [f.kind for f in ranked] == ["data_loader_stall", "launch_bound"]
    assert [f.gain_pct for f in ranked] == [12.0, 30.0]
    assert plan.fix_all_gain_pct == 42.0


def test_a_fix_whose_time_an_earlier_fix_gives_back_is_dismissed():
    # a host sync that waited for a collective: removing the syncs gives back 10 %, overlapping the collective
    # 8 % alone, both together still 10 % (the same wait): the second adds 0 and is dismissed
    table = {("remove_syncs",): 10.0, ("overlap_comm",): 8.0, ("overlap_comm", "remove_syncs"): 10.0}

    def gain(changes):
        return table[tuple(sorted(c.kind for c in changes))], 0.0

    sync = _finding("host_sync", Change("remove_syncs"), 0.0)
    comm = _finding("exposed_comm", Change("overlap_comm"), 0.0)
    ranked, plan = F.rank_by_marginal_gain([comm, sync], gain)
    assert [f.kind for f in ranked] == ["host_sync"] and ranked[0].gain_pct == 10.0
    assert plan.dismissed == ["exposed_comm"] and plan.fix_all_gain_pct == 10.0
