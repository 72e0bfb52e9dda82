"""`trainperf diff`'s compute change: the side that computes more a step against the other, operation by operation
(slow_work.compare_work on the two sides' kept steps), and what it is in words and JSON: the same work run slower,
or more work, and of that the same operations at another precision (by the operators' recorded dims and dtypes, or,
without shapes, by the GEMM kernels' names).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainperf.diagnose.precision import PRECISIONS, REDUCED, UNKNOWN, precision_split
from trainperf.diagnose.slow_work import CAUSE_MIN_SHARE, WorkComparison, compare_work
from trainperf.diagnose.units import fmt_us, short_name
from trainperf.trace.categories import kernel_category
from trainperf.trace.events import GEMM, KERNEL

if TYPE_CHECKING:  # diff.py builds the profiles and imports this module
    from trainperf.diagnose.diff import StepProfile


def compute_change(baseline: StepProfile, candidate: StepProfile) -> tuple[WorkComparison | None, str]:
    """(the comparison, the side that computes more: "candidate" or "baseline") of the two sides' computation a step,
    operation by operation (slow_work.compare_work: the more-computing side's ranks against the other's); (None, "")
    where neither computes more or a side has no computation."""
    if baseline.work_on_host != candidate.work_on_host:  # a GPU run against a CPU one: nothing alike to compare
        return None, ""
    for more, less, side in ((candidate, baseline, "candidate"), (baseline, candidate, "baseline")):
        c = compare_work(more.work, less.work) if more.work and less.work else None
        if c is not None and c.extra_us > 0:
            return c, side
    return None, ""


# the side running the same work slower runs at least this much more of its computation beside collectives (pp) for
# the note to say so: a tenth of the computation. Stated, not fitted (no labeled pair of runs)
BESIDE_MORE_PP = 10.0


def compute_change_note(c: WorkComparison | None, side: str, host: bool = False,
                        beside_pct: tuple[float, float] | None = None) -> str:
    """The compute change in words: how much more the side computes a step, how much of it is the same operations on
    the same shapes run slower (by kernel name alone where no shapes are recorded: then larger inputs read alike),
    and how much is in operations or kernels the other side runs less (more work, or the same work by other kernels:
    another precision, fusion or library), and the operators holding most of it (or the precision it moved to);
    host: the sides' training threads' own time (CPU runs) instead of their computation kernels; beside_pct: (the
    side's, the other's) share of their computation run beside a collective (%), named where the same work runs slower
    and the side runs BESIDE_MORE_PP more of it beside one (their kernels take SMs from it); "" where there is none."""
    if c is None:
        return ""
    other = "baseline" if side == "candidate" else "candidate"
    unit = "operators" if host else "kernels"
    same = ("the same operations on the same shapes" if c.shaped else
            f"the same {unit} by name (no shapes recorded: larger inputs read alike)")
    what = "the training thread's own time a step (no device events)" if host else "computation a step"
    other_work = "more work" if host else "more work, or the same work by other kernels: precision, fusion, library"
    text = (f"{what}: the {side}'s is {fmt_us(c.extra_us)} more than the {other}'s; "
            f"{c.share(c.slower_extra_us):.0f} % of it {same} run {c.same_work_slowdown:.2f}x longer, "
            f"{c.share(c.more_work_extra_us):.0f} % in operations or {unit} the {other} runs less ({other_work})")
    if c.cause == "device":
        text += (": the same work runs slower there (" + ("the CPU: other processes, threads per process, library "
                 "versions" if host else "device clocks or power, driver or library versions, kernel choice") + ")")
        if not host and beside_pct is not None and beside_pct[0] - beside_pct[1] >= BESIDE_MORE_PP:
            text += (f"; {beside_pct[0]:.0f} % of its computation runs beside collectives against "
                     f"{beside_pct[1]:.0f} % of the {other}'s: their kernels take SMs and memory bandwidth from it "
                     f"(diagnose's comm_contention measures how much)")
    elif c.cause == "work":
        move = precision_move(c)
        if move is not None and move["by"] == "shapes":  # the same operations, another precision
            return text + (f"; most of it the same operations at another precision: {short_name(move['operator'])} "
                           f"on {move['dims']} in {move['precision']} where the {other} runs "
                           f"{move['other_side_precision']} ({fmt_us(move['us'])} a step)")
        if move is not None:  # no shapes to match operations, but the GEMM kernels' names state their precision
            theirs = ", ".join(f"{fmt_us(us)} a step in {_PRECISION_WORDS.get(q, q)}"
                               for q, us in move["other_side_us_by_precision"].items())
            return text + (f"; most of it GEMM kernels in {_PRECISION_WORDS.get(move['precision'], move['precision'])}"
                           f" by their names ({fmt_us(move['us'])} a step more than the {other}'s), where the {other} "
                           f"runs its GEMMs in other kernels ({theirs}): the same products at another precision, "
                           f"likely")
    largest = c.largest_extra(2)  # where the extra sits, whatever its cause: the slowed work or the added
    if largest:
        text += "; most in " + "; ".join(f"{short_name(op)}{f' on {shapes}' if shapes else ''} {fmt_us(m)} vs "
                                          f"{fmt_us(o)}" for op, m, o, shapes in largest)
    return text


_PRECISION_WORDS = {REDUCED: "bf16/fp16/fp8", UNKNOWN: "kernels whose names state no precision"}  # else its name


def gemm_precision_move(c: WorkComparison) -> tuple[str, float, dict[str, float]] | None:
    """Where the more-computing side's extra is mostly GEMM/convolution kernels of one precision by their names
    (precision.classify_kernel) and the other side runs GEMMs of other precisions it does not: (that precision, the
    µs a step it runs in it beyond the other side, {precision: µs a step the other side runs in it beyond this side});
    None otherwise. What a diff without recorded shapes has to tell fp32 products from the bf16 ones they replace:
    the kernels' names, not their operators' dims."""
    names = [key.rsplit(" | ", 1)[-1] for key in c.by_key]
    gemm = [kernel_category(n, KERNEL) == GEMM for n in names]
    sides = [precision_split([n for n, g in zip(names, gemm) if g],
                             [us[i] for us, g in zip(c.by_key.values(), gemm) if g]).time_us for i in (0, 1)]
    gained = {p: sides[0][p] - sides[1][p] for p in PRECISIONS}
    prec = max(gained, key=lambda p: gained[p])
    lost = {q: sides[1][q] - sides[0][q] for q in PRECISIONS if q != prec and sides[1][q] > sides[0][q]}
    if prec == UNKNOWN or gained[prec] < CAUSE_MIN_SHARE * c.extra_us or not lost:
        return None
    return prec, gained[prec], lost


def compute_change_json(c: WorkComparison | None, side: str, host: bool,
                        beside_pct: tuple[float, float] | None = None) -> dict | None:
    """compute_change as JSON (µs a step; shares %; on_host: the training threads' own time compared, CPU runs;
    beside_pct as compute_change_note takes it), or None."""
    if c is None:
        return None
    beside = None if beside_pct is None else {"side_computing_more": round(beside_pct[0], 3),
                                              "other_side": round(beside_pct[1], 3)}
    return {"side_computing_more": side, "on_host": host, "extra_us": round(c.extra_us, 3),
            "computation_beside_communication_pct": beside,
            "from_slower_same_work_pct": round(c.share(c.slower_extra_us), 3),
            "from_more_work_pct": round(c.share(c.more_work_extra_us), 3),
            "same_work_slowdown": round(c.same_work_slowdown, 4), "shapes_recorded": c.shaped, "cause": c.cause,
            "largest": [{"operator": op, "shapes": shapes, "us": round(m, 3), "other_side_us": round(o, 3)}
                        for op, m, o, shapes in c.largest_extra(3)],
            "precision_move": precision_move(c)}


def precision_move(c: WorkComparison) -> dict | None:
    """The extra computation's move to another precision (µs a step; as JSON): by the operators' recorded dims and
    dtypes ("by": "shapes", WorkComparison.precision_moves), else by the GEMM kernels' names ("kernel names",
    gemm_precision_move); None where the cause is not more work or neither holds CAUSE_MIN_SHARE of the extra."""
    if c.cause != "work":
        return None
    moved_us, moves = c.precision_moves()
    if moves and moved_us >= CAUSE_MIN_SHARE * c.extra_us:
        op, dims, prec, theirs = moves[0]
        return {"by": "shapes", "operator": op, "dims": dims, "precision": prec, "other_side_precision": theirs,
                "us": round(moved_us, 3)}
    by_name = gemm_precision_move(c)
    if by_name is None:
        return None
    prec, gained_us, lost = by_name
    return {"by": "kernel names", "precision": prec, "us": round(gained_us, 3),
            "other_side_us_by_precision": {q: round(us, 3) for q, us in lost.items()}}
