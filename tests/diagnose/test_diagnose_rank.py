"""Ranking: stalls (waste the trace measures) first, then fixes whose effect the trace measures, then assumed
speed-ups of a chosen size; each by marginal gain."""

from trainperf.diagnose import findings as F
from trainperf.diagnose.replay import Change


def _finding(kind, change, gain_pct, upper_bound=False):
    f = F.make(kind, [0], [1], {"x": (1.0, "%")}, changes=(change,), evidence_pct=100.0, upper_bound=upper_bound)
    f.gain_pct = f.gain_alone_pct = gain_pct  # priced alone: its marginal gain is its gain alone
    f.severity = F.capped_severity(gain_pct, 100.0, f.gain_is_upper_bound)  # a bound rates one level lower
    return f


def test_measured_removal_outranks_a_larger_assumed_speed_up():
    launch = _finding("launch_bound", Change("host_speedup", factor=2.0), 30.0)
    loader = _finding("data_loader_stall", Change("remove_data_wait"), 12.0)
    fused = _finding("memory_bound_unfused", Change("speedup", factor=2.0), 20.0)
    ranked = F.merge_across_ranks([launch, fused, loader])
    assert [f.kind for f in ranked] == ["data_loader_stall", "launch_bound", "memory_bound_unfused"]


def test_a_stall_ranks_before_a_restructuring_unless_the_share_sure_of_that_is_more():
    # a 1.8 % DataLoader wait on a trace whose launches cost up to 3 %: the wait is fixed first (num_workers). The
    # launches' host cost is measured, that a CUDA graph removes all of it is not: ranked with the stalls at the share
    # a fix is sure to realise (findings.BOUND_REALISED_SHARE, 0.5): 1.5 % < 1.8 %. Launches costing up to 5 % (2.5 %
    # sure) rank first
    loader = _finding("data_loader_stall", Change("remove_data_wait"), 1.8)
    for launch_pct, order in ((3.0, ["data_loader_stall", "launch_bound"]),
                              (5.0, ["launch_bound", "data_loader_stall"])):
        launch = _finding("launch_bound", Change("graph_launches"), launch_pct)
        assert [f.kind for f in F.merge_across_ranks([launch, loader])] == order


def test_a_low_stall_comes_after_a_high_finding():
    # a blocking sync worth 1.05 % of a GPU-bound step (low) is not its bottleneck beside unfused attention worth
    # 22 % (high): the attention first, then the sync, then the rest in their order; beside a low bound the same
    # sync stays first (test_a_stall_ranks_before_a_restructuring_unless_the_share_sure_of_that_is_more)
    sync = _finding("host_sync", Change("remove_syncs"), 1.05)
    attention = _finding("unfused_attention", Change("speedup_rows", factor=3.0), 22.0)
    optimizer = _finding("optimizer_slow", Change("speedup", factor=3.0), 5.0)
    ranked = F.merge_across_ranks([optimizer, attention, sync])
    assert [f.kind for f in ranked] == ["unfused_attention", "host_sync", "optimizer_slow"]
    assert F.rank_key(sync) < F.rank_key(attention)  # the sort key alone would put the stall first


def test_a_low_stall_comes_after_a_medium_bound():
    # HTA's critical_path/cuda_event_sync: syncs worth 2.2 % of the step (low) beside host work whose removal would
    # give up to 87 % (a bound: medium). A stall under 3 % cannot be what makes 87 % of the step host work: the bound
    # names the bottleneck. So it does beside a stall of 6 % (medium): the bound's gain is what is left once the stall
    # is gone (priced after it), and half of it (BOUND_REALISED_SHARE) is still 43.5 %. A stall the trace prices at
    # 50 % is fixed first
    work = _finding("host_work", Change("remove_host_work"), 87.0, upper_bound=True)
    assert work.severity == "medium"
    for sync_pct, order in ((2.2, ["host_work", "host_sync"]), (6.0, ["host_work", "host_sync"]),
                            (50.0, ["host_sync", "host_work"])):
        ranked = F.merge_across_ranks([_finding("host_sync", Change("remove_syncs"), sync_pct), work])
        assert [f.kind for f in ranked] == order


def test_a_stall_below_the_floor_does_not_jump_the_queue():
    # two assumed speed-ups (kernels at the HBM roof, unfused optimizer kernels 3x faster) rank by their gains; the
    # stall too small to be priced first ranks by its gain with them. The launches' host cost (an upper bound of a cost
    # the trace measures) ranks with the stalls, before any assumed speed-up, as host work that launches nothing does
    optimizer = _finding("optimizer_slow", Change("speedup", factor=3.0), 30.0)
    sync = _finding("host_sync", Change("remove_syncs"), F.STALL_FIRST_MIN_GAIN_PCT / 2)
    fused = _finding("memory_bound_unfused", Change("speedup", factor=2.0), 40.0)
    ranked = F.merge_across_ranks([sync, fused, optimizer])
    assert [f.kind for f in ranked] == ["memory_bound_unfused", "optimizer_slow", "host_sync"]
    launch = _finding("launch_bound", Change("graph_launches"), 30.0)
    ranked = F.merge_across_ranks([sync, fused, launch])
    assert [f.kind for f in ranked] == ["launch_bound", "memory_bound_unfused", "host_sync"]


def test_an_upper_bound_does_not_outrank_a_fix_the_trace_confirms():
    # the corpus's small_kernels-low-df_index_resolver: fusing the tiny kernels gains 16.32 % (replayed), capturing
    # the rest of the step as one CUDA graph adds 16.41 % more, but only as a bound (capturability is assumed):
    # rank_key's tiers put the confirmed fix first, as the severities already weigh them
    small = _finding("small_kernels", Change("graph_small_kernels"), 16.32)
    launch = _finding("launch_bound", Change("graph_launches"), 16.41)
    assert launch.gain_is_upper_bound and not small.gain_is_upper_bound
    assert [f.kind for f in F.merge_across_ranks([launch, small])] == ["small_kernels", "launch_bound"]


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


def test_a_finding_without_a_what_if_rated_medium_ranks_above_a_low_bound():
    # a device-only trace: its GPU idles 39 % of the window with nothing recorded to say why (idle_gpu, medium, no
    # what-if), beside unfused optimizer kernels priced at an assumed 3x (6.6 %, an upper bound, rated low)
    idle = F.make("idle_gpu", [0], [1], {"gpu_idle": (39.1, "%")}, severity="medium")
    optimizer = _finding("optimizer_slow", Change("speedup_rows", factor=3.0), 6.6, upper_bound=True)
    assert optimizer.severity == "low"
    assert [f.kind for f in F.in_rank_order([optimizer, idle])] == ["idle_gpu", "optimizer_slow"]
    # rated alike, the priced one first
    small = _finding("small_kernels", Change("fuse_kernels", factor=2.0), 2.0)
    low = F.make("gpu_analyses_skipped", [0], [1], {"device_events": (0, "count")}, severity="low")
    assert [f.kind for f in F.in_rank_order([low, small])] == ["small_kernels", "gpu_analyses_skipped"]


def test_a_one_off_save_ranks_by_its_size_among_bounds_and_is_priced_with_the_measured_fixes():
    # a judged real ROCm DDP trace: an all-reduce exposed for two thirds of the GPU time (overlap: an upper bound,
    # 21 % of the step) and a checkpoint saved once in the window (12 % of it). As a measured wait the save (high)
    # ranks first: 12 % measured is more than the half of the bound that ranks it (10.5 %); seen in 1 of the window's
    # steps its rate in the run is unknown (rate_unknown): a bound, medium, credited 6 %, after the larger bound. Its
    # pricing stays with the measured fixes: first in the order of fixes
    alone = {"overlap_comm": 21.0, "remove_checkpoint_wait": 12.0}

    def gain(changes):
        return sum(alone[c.kind] for c in changes), 0.0

    def findings(rate_unknown):
        comm = F.make("exposed_comm", [0], [1, 2, 3, 4], {}, changes=(Change("overlap_comm"),), upper_bound=True)
        save = F.make("checkpoint_stall", [0], [1, 2, 3, 4], {}, changes=(Change("remove_checkpoint_wait"),),
                      rate_unknown=rate_unknown)
        return comm, save

    ranked, plan = F.rank_by_marginal_gain(list(findings(True)), gain)
    assert [(f.kind, f.severity) for f in ranked] == [("exposed_comm", "medium"), ("checkpoint_stall", "medium")]
    assert plan.order == ["checkpoint_stall", "exposed_comm"] and ranked[1].gain_is_upper_bound
    ranked, _ = F.rank_by_marginal_gain(list(findings(False)), gain)  # saved in every step: a measured wait, first
    assert [(f.kind, f.severity) for f in ranked] == [("checkpoint_stall", "high"), ("exposed_comm", "medium")]


def test_a_bound_ranks_against_measured_stalls_by_the_share_of_it_a_fix_is_sure_to_realise():
    # an all-reduce exposed where only device work waits for it, priced as if overlapped (60 %, an upper bound),
    # beside a DataLoader wait measured at 5 %: half the bound (30 %) is more than the wait, the collective first
    comm = _finding("exposed_comm", Change("overlap_comm"), 60.0, upper_bound=True)
    loader = _finding("data_loader_stall", Change("remove_data_wait"), 5.0)
    assert [f.kind for f in F.merge_across_ranks([loader, comm])] == ["exposed_comm", "data_loader_stall"]
    # a pipeline's send/recv priced as if overlapped (44 %, bound) beside the slow stage that made the others wait
    # (26 % measured): half the bound (22 %) is less, the measured stage first
    p2p = _finding("pipeline_bubble", Change("overlap_comm"), 44.0, upper_bound=True)
    slow = _finding("straggler", Change("compute_speedup", factor=1.3), 26.0)
    assert [f.kind for f in F.merge_across_ranks([p2p, slow])] == ["straggler", "pipeline_bubble"]
    assert F.BOUND_REALISED_SHARE == 0.5  # the figures above are worked at this share


def test_host_work_that_launches_nothing_is_a_stall_ranked_by_its_credited_bound():
    # removing host work the device waits on (an upper bound: all of it gone) is waste removed, as a wait is: 20 %
    # credited at half (10 %) ranks above a 4.8 % DataLoader wait (the corpus's compound cases: host work 20 % beside
    # a stall of 4.8 %), and 8 % (credited 4 %) below it
    loader = _finding("data_loader_stall", Change("remove_data_wait"), 4.8)
    for gain, first in ((20.0, "host_work"), (8.0, "data_loader_stall")):
        host = _finding("host_work", Change("remove_host_work", rows=(1, 2)), gain, upper_bound=True)
        assert F.merge_across_ranks([loader, host])[0].kind == first


def test_a_bound_stall_ranks_after_a_measured_fix_that_gains_more_than_its_credited_share():
    # measured stalls rank before other measured fixes whatever their size; a stall priced at a bound only by the half
    # of it its fix is sure to realise: host work at 30 % (15 %) after DDP's buffer broadcast measured at 15.5 %, at
    # 40 % (20 %) before it. The measured 4 % wait, which the bound's credited 15 % outranks, stays after the bound:
    # the broadcast moves up before both, so the smallest of the three does not come first. A bound rated low (9 %,
    # credited 4.5 %) ends after the rated findings and moves nothing: the measured wait first, as without it
    broadcast = _finding("ddp_buffer_broadcast", Change("remove_spans", spans=((1, 0.0, 300.0),)), 15.5)
    loader = _finding("data_loader_stall", Change("remove_data_wait"), 4.0)
    for gain, order in ((30.0, ["ddp_buffer_broadcast", "host_work", "data_loader_stall"]),
                        (9.0, ["data_loader_stall", "ddp_buffer_broadcast", "host_work"]),
                        (40.0, ["host_work", "data_loader_stall", "ddp_buffer_broadcast"])):
        host = _finding("host_work", Change("remove_host_work", rows=(1, 2)), gain, upper_bound=True)
        assert [f.kind for f in F.merge_across_ranks([broadcast, host, loader])] == order
