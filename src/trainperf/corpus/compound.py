"""Cases with two injected problems: which one a diagnosis ranks first when a measured stall sits beside a bound.

A single-problem case injects one fault into a base trace, and the base's own costs are all the competition it
meets. Where those costs are priced as upper bounds (launch-bound host work, fp32 GEMMs sped up by a chosen
factor), every single-problem case whose injected stall ranks above them is labeled right, and none can say what
happens when the bound is itself the larger problem: a DDP rank whose exposed all-reduce (an upper bound: only
device work waits for it) costs two thirds of the step beside a DataLoader wait of 5 %. A compound case plants both:
one fault whose fix diagnose prices as an upper bound (BOUND_KINDS) and one whose removal it measures
(MEASURED_KINDS), every such pair into every base, one large and one medium, each way round, so that the label (the
larger true gain) is a bound in about half of them.

Truth, measured as for one fault (corpus.build): the smaller fault is injected first, sized on the base; the larger
one is sized on that trace, so its true gain is what removing it gives back with the smaller still there,
(T_both - T_smaller_only) / T_both. The smaller one's true gain (`also`) is removed the other way round, against
the larger injected alone into the base at the same size and seed: (T_both - T_larger_only) / T_both. labels.json
holds the larger as `kind` (the case's bottleneck) and the smaller under `also`
([{kind, true_gain_pct, ranks}]): evaluate counts neither finding as a false one.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from trainperf.corpus import build as B
from trainperf.corpus.inject import NotApplicable

# faults whose fix diagnose prices as an upper bound (host work launching nothing: removing it all; the GPU idle with
# work queued: no wait left; slower launches: every launch graphed), and faults whose removal it measures (a wait
# taken out of the trace and replayed)
BOUND_KINDS = ("host_work", "idle_with_work_queued", "launch_bound")
MEASURED_KINDS = ("data_loader_stall", "host_sync", "pageable_copy", "allocator_stall")
# (larger, smaller) target gains, % of the step: a bottleneck beside a stall a third of its size
LARGER_PCT, SMALLER_PCT = 20.0, 6.0
# faults rarely add up (a GPU-bound step hides host delays up to its slack, then both show at once): a case whose
# smaller fault, measured, gains more than this share of the larger one's gain has no one bottleneck and is not built
CLEAR_MARGIN = 0.67


def compound_case(ranks: dict, larger: str, smaller: str, seed: int) -> tuple[dict, dict]:
    """The base's ranks with `smaller` (SMALLER_PCT) then `larger` (LARGER_PCT) injected, and the case's labels
    (module docstring); NotApplicable where the base holds nothing to inject either into."""
    small_doc, small_ranks, small_size, t0, t_small = B.sized_case(smaller, ranks, SMALLER_PCT, seed)
    both, big_ranks, big_size, _, t_both = B.sized_case(larger, small_doc, LARGER_PCT, seed + 1)
    larger_only, _ = B.inject_sized(larger, ranks, big_size, seed + 1)
    big_gain = 100 * (t_both - t_small) / t_both
    small_gain = 100 * (t_both - B.step_time(larger_only)) / t_both
    if min(big_gain, small_gain) < B.MIN_GAIN_PCT:
        raise NotApplicable(f"{larger} beside {smaller}: one of them gains nothing ({big_gain:.2f} / "
                            f"{small_gain:.2f} %)")
    first, second = ((larger, big_gain, big_ranks, big_size), (smaller, small_gain, small_ranks, small_size))
    if small_gain > big_gain:  # the truth is what was measured, not what was aimed at
        first, second = second, first
    if second[1] > CLEAR_MARGIN * first[1]:
        raise NotApplicable(f"{first[0]} and {second[0]} cost about the same ({first[1]:.2f} / {second[1]:.2f} %): "
                            "no one bottleneck")
    labels = {"kind": first[0], "ranks": first[2], "true_gain_pct": round(first[1], 3),
              "severity": B.severity_of(first[1]), "size": round(first[3], 4),
              "also": [{"kind": second[0], "ranks": second[2], "true_gain_pct": round(second[1], 3),
                        "size": round(second[3], 4)}],
              "step_time_us_before": round(t0, 1), "step_time_us_after": round(t_both, 1), "seed": seed}
    return both, labels


def build_compound(out: str | Path, bases: list[B.Base], log=print, seed_salt: str = "",
                   bound_kinds: tuple[str, ...] = BOUND_KINDS) -> list[dict]:
    """Write the compound cases of every base under out (`compound-<larger>+<smaller>-<base>`, each pair of one of
    bound_kinds and one of MEASURED_KINDS both ways round); return their labels."""
    out = Path(out)
    written = []
    for base in bases:
        ranks = B.load_base(base)
        for bound, measured in ((b, m) for b in bound_kinds for m in MEASURED_KINDS):
            if base.kinds is not None and not {bound, measured} <= set(base.kinds):
                continue
            for larger, smaller in ((bound, measured), (measured, bound)):
                name = f"compound-{larger}+{smaller}-{base.name}"
                seed = zlib.crc32((seed_salt + name).encode())
                try:
                    doc, labels = compound_case(ranks, larger, smaller, seed)
                except NotApplicable as e:
                    log(f"{name}: skipped, {e}")
                    continue
                labels["base"] = base.name
                B.write_case(out / name, doc, labels)
                written.append(labels)
                log(f"{name}: {labels['kind']} {labels['true_gain_pct']:.2f} % beside "
                    f"{labels['also'][0]['kind']} {labels['also'][0]['true_gain_pct']:.2f} %")
    return written
