"""Terminal summary of a Diagnosis (rich tables)."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainperf.diagnose.api import Diagnosis
from trainperf.diagnose.findings import rank_list
from trainperf.diagnose.memory import GIB, highest_peak

_SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}


NO_STRAGGLER = "no rank waited on another, so no straggler"


def straggler_wait_ms(cross_rank: dict) -> tuple[int, float] | None:
    """Return (straggler rank, the others' wait it caused in ms) from ``Diagnosis.cross_rank``, or None
    when no rank made another wait (to the 0.1 ms shown): naming a straggler that made nobody wait misleads."""
    rank, ms = cross_rank.get("straggler_rank"), cross_rank.get("straggler_caused_wait_us", 0.0) / 1e3
    return (int(rank), ms) if rank is not None and round(ms, 1) > 0 else None


def straggler_text(cross_rank: dict) -> str:
    """One clause on the rank the others waited for, from ``Diagnosis.cross_rank``: "straggler rank R caused X ms
    of waiting"; on a CPU-only job whose wait load noise explains as well (stragglers.extra_work_is_noise, the straggler
    rule's own decision), "rank R caused X ms of waiting, as much as load noise gives (p P)"; when the rank waited
    for changed from step to step (StragglerFacts.persistent), no straggler but load imbalance, or ranks taking
    turns being late with no more work (late_ranks_paused: their hosts paused), or a group of slow ranks late step
    after step (slow_ranks); NO_STRAGGLER when nobody waited."""
    s = straggler_wait_ms(cross_rank)
    if s is None:
        return NO_STRAGGLER
    if cross_rank.get("host_straggler_within_noise"):
        p = cross_rank["host_straggler_p_value"]
        return f"rank {s[0]} caused {s[1]:.1f} ms of waiting, as much as load noise gives (p {p:.3f})"
    if cross_rank.get("straggler_persistent") is False:
        last = ", ".join(f"rank {r} in {n}" for r, n in sorted(cross_rank["steps_each_rank_was_waited_for"].items()))
        if cross_rank.get("slow_ranks"):
            return (f"slow ranks {rank_list(cross_rank['slow_ranks'])}: late step after step as a group, each the "
                    f"last in some steps (arrival order random: p {cross_rank['slow_ranks_p_value']:.4f}; {last} "
                    "steps)")
        if cross_rank.get("late_ranks_paused"):
            return ("no persistent straggler: the ranks took turns being late without more work in those steps "
                    f"(their hosts paused; {last} steps)")
        return f"no straggler: the rank the others waited for changed from step to step (load imbalance; {last} steps)"
    return f"straggler rank {s[0]} caused {s[1]:.1f} ms of waiting"


def gain_basis(steps) -> str:
    """What a gain is a share of: 'step time' when the trace has steps, else 'the traced time' (a trace without
    ProfilerStep is priced over the whole trace; calling that a step time would name a step nobody recorded)."""
    return "step time" if steps else "the traced time"


def gain_text(f) -> str:
    """'gain ≈ X% of step time' (of the traced time when the finding's ranks have no steps), or 'gain not
    estimated' for a finding without a what-if (idle_gpu): its 0.0 is no estimate, and beside a medium severity it
    read as a contradiction (issue 14)."""
    if not f.what_if and not f.gain_pct:
        return "gain not estimated (no what-if for this kind)"
    if not getattr(f, "priced", True):  # its what-if says why ("not priced: ...")
        return "gain not estimated"
    basis = gain_basis(f.steps)
    if getattr(f, "rate_unknown", False):
        return f"gain up to {f.gain_pct:.1f}% of {basis} (upper bound: seen once in the window; how often the run " \
               "pays it the trace cannot tell)"
    if getattr(f, "gain_is_upper_bound", False):
        return f"gain up to {f.gain_pct:.1f}% of {basis} (upper bound: the fix assumes what the trace cannot show)"
    return f"gain ≈ {f.gain_pct:.1f}% of {basis}"


def rank_cells(r) -> list[str]:
    """A rank's window (ms) and GPU shares (%) as the terminal and the HTML both show them: "-" where they do
    not apply (the GPU analyses were skipped, e.g. a CPU-only trace): one formatter, so one value reads the same."""
    window = f"{r.window_us / 1e3:.1f}"
    if r.gpu_analyses != "ok":
        return [window, "-", "-", "-", "-", "-"]
    return [window, f"{r.idle_pct:.1f}", f"{r.compute_pct:.1f}", f"{r.non_compute_pct:.1f}", f"{r.overlap_pct:.1f}",
            f"{r.idle_host_pct:.0f}/{r.idle_kernel_pct:.0f}/{r.idle_other_pct:.0f}"]


# Two-line headers: at 80 columns one-line headers were cut ("non-co…", "host/k…").
RANK_HEADERS = ("window\nms", "idle\n%", "compute\n%", "non-comp\n%", "overlap\n%", "idle h/k/o\n%")
# a job whose traces hold no GPU activity (a CPU-only run, or profiled with activities=[CPU]): its loop thread's time
HOST_RANK_HEADERS = ("window\nms", "step\nms", "collectives\n%", "data\n%", "optimizer\n%")


def host_only(d: Diagnosis) -> bool:
    """Whether no rank of the diagnosis has GPU activity: its rank table shows the host's columns
    (HOST_RANK_HEADERS) in place of the GPU's, which would all read "-"."""
    return bool(d.ranks) and all(r.gpu_analyses != "ok" for r in d.ranks)


def host_rank_cells(r) -> list[str]:
    """A rank without GPU activity as the terminal and the HTML both show it: its window and median step (ms), and
    the shares of its window (%) its loop thread spent in collectives (their wait for the other ranks included: a
    CPU job overlaps none), in the DataLoader and in the optimizer; "-" for a step where no step is complete."""
    step = f"{r.step_time_median_us / 1e3:.1f}" if r.step_time_median_us is not None else "-"
    comm = 100.0 * r.exposed_comm_us / r.window_us if r.window_us > 0 else 0.0
    return [f"{r.window_us / 1e3:.1f}", step, f"{comm:.1f}", f"{r.dataloader_pct:.1f}", f"{r.optimizer_pct:.1f}"]


_RANK_NOTE = re.compile(r"^rank (\d+): (.*)$", re.S)


def notes_by_rank(notes: list[str]) -> list[str]:
    """The notes with those that say the same of several ranks ("rank N: text", the same text but for its figures)
    said once: "ranks 0-15: text" (the first rank's figures, said so where the others' differ), in the order each
    first came; a 64-rank job printed 64 lines of one note before its findings. Other notes as they are."""
    groups: dict[str, list[tuple[int, str]]] = {}
    order: list[str] = []
    for n in notes:
        m = _RANK_NOTE.match(n)
        key = re.sub(r"\d+(\.\d+)?", "#", m.group(2)) if m else "\0" + n
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append((int(m.group(1)), m.group(2)) if m else (-1, n))
    out = []
    for key in order:
        items = groups[key]
        if items[0][0] < 0 or len(items) == 1:
            out += [n if r < 0 else f"rank {r}: {n}" for r, n in items]
            continue
        same = len({n for _, n in items}) == 1
        out.append(f"ranks {rank_list(r for r, _ in items)}: {items[0][1]}"
                   + ("" if same else f" (rank {items[0][0]}'s figures; the others' alike, each in the JSON)"))
    return out


def print_summary(d: Diagnosis, console: Console, top: int = 5) -> None:
    """Per-rank table, then the top findings with evidence, gain and recommendation."""
    t = Table(title=f"trainperf diagnose: {d.path}", title_justify="left")
    t.add_column("rank", justify="right")
    host = host_only(d)
    for col in HOST_RANK_HEADERS if host else RANK_HEADERS:
        t.add_column(col, justify="right", no_wrap=True)
    if not host:
        t.add_column("top critical\npath", justify="left")
    for r in d.ranks:
        if host:
            t.add_row(str(r.rank), *host_rank_cells(r))
            continue
        # a skipped rank's reason is printed as a note below the table; in the cell it wrapped 10 lines
        cp = (", ".join(f"{k} {v:.0f}%" for k, v in list(r.critical_path_pct.items())[:2])
              if r.gpu_analyses == "ok" else "skipped")
        t.add_row(str(r.rank), *rank_cells(r), cp)
    console.print(t)
    for n in notes_by_rank(d.notes):
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)
    for line in (memory_line(d), flops_line(d)):
        if line:
            console.print(line, highlight=False)
    if d.cross_rank:
        x = d.cross_rank
        console.print(f"cross-rank: {x['n_collectives_matched']} collectives matched; {straggler_text(x)}; "
                      f"compute imbalance {x['compute_imbalance_pct']:.1f}%", highlight=False)
    if not d.findings:
        console.print("[green]no findings: nothing in this trace is worth fixing[/]")
    elif d.fix_order:
        console.print(f"fix all: ≈ {d.fix_all_gain_pct:.1f}% of {gain_basis(analysed_steps(d))}; gains below are "
                      f"marginal, fixes applied in the order {' > '.join(d.fix_order)}", highlight=False)
    for i, f in enumerate(d.findings[:top], 1):
        style = _SEV_STYLE[f.severity]
        alone = f" (alone {f.gain_alone_pct:.1f}%)" if f.fix_order and f.gain_alone_pct != f.gain_pct else ""
        conf = f", confidence {f.confidence}" if f.confidence != "high" else ""
        # the what-if in brackets, escaped: rich took "[kernel launches cost ...]" for a style tag and printed nothing
        console.print(f"\n[{style}]{i}. {f.kind}[/] ({f.severity}{conf}) ranks [{rank_list(f.ranks)}]  "
                      f"{gain_text(f)}{alone}" + (escape(f" [{f.what_if}]") if f.what_if else ""),
                      highlight=False)
        metrics = ", ".join(f"{k} {v['value']:g} {v['unit']}" for k, v in f.evidence.get("metrics", {}).items())
        console.print(f"   evidence: {escape(metrics)}", highlight=False)
        for c in f.evidence.get("call_sites", [])[:3]:
            console.print(f"     - call site {escape(c['site'][:80])}: {c['count']} calls, blocked {c['blocking_us'] / 1e3:.1f} ms, "
                          f"GPU idle after {c['gpu_idle_after_us'] / 1e3:.1f} ms, gain {c['gain_pct']:.1f}%",
                          highlight=False)
        for e in f.evidence.get("events", [])[:3]:
            console.print(f"     - {escape(e['name'][:90])} @ {e['start_us']:.0f} µs, {e['dur_us']:.0f} µs",
                          highlight=False)
        for n in f.notes:
            console.print(f"   [yellow]note:[/] {escape(n)}", highlight=False)
        console.print(f"   fix: {escape(f.recommendation)}", highlight=False)


def memory_line(d: Diagnosis) -> str:
    """'device memory (rank R, the highest reserved peak of N, the lowest L GiB): peak ...' from the ranks' allocator
    samples (profile_memory=True, Diagnosis.memory): ranks whose peaks differ hold uneven memory (pipeline stages,
    uneven shards); "" where no rank has them."""
    memories = getattr(d, "memory", None) or {}  # a hand-made Diagnosis (tests) may have none
    if not memories:
        return ""
    r, m = highest_peak(memories)
    low = min(x.peak_reserved_bytes for x in memories.values()) / GIB
    which = f"rank {r}, the highest reserved peak of {len(memories)}, the lowest {low:.2f} GiB" \
        if len(memories) > 1 else f"rank {r}"
    return f"device memory ({which}): {m.text()}"


def _flop_text(flop: float) -> str:
    """A FLOP count with its prefix: "641.7 MFLOP", "1.23 PFLOP"."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if flop >= scale:
            return f"{flop / scale:.4g} {prefix}FLOP"
    return f"{flop:.4g} FLOP"


def flops_line(d: Diagnosis) -> str:
    """'FLOPs (matrix products, convolutions and attention, from the recorded shapes; rank R): X a step, Y TFLOP/s,
    Z % of the bf16 peak ...' of the rank with the lowest utilisation (else the lowest rate), with the range over
    the ranks; "" where no rank's trace records their shapes (diagnose/step_flops.py)."""
    ranks = [r for r in d.ranks if r.achieved_tflops is not None]
    if not ranks:
        return ""
    rated = [r for r in ranks if r.flops_utilisation_pct is not None]
    low = min(rated, key=lambda r: r.flops_utilisation_pct) if rated else min(ranks, key=lambda r: r.achieved_tflops)
    parts = [f"{_flop_text(low.flops_per_step)} a step"] if low.flops_per_step is not None else []
    parts.append(f"{low.achieved_tflops:.3g} TFLOP/s")
    if low.flops_utilisation_pct is not None:
        prec = f" {low.flops_precision}" if low.flops_precision else ""
        parts.append(f"{low.flops_utilisation_pct:.1f} % of the{prec} peak (hardware FLOPs utilisation: what ran, "
                     "recomputation included; MFU where nothing is recomputed)")
    if len(rated) > 1:
        top = max(r.flops_utilisation_pct for r in rated)
        parts.append(f"ranks {low.flops_utilisation_pct:.1f}-{top:.1f} %")
    which = f"rank {low.rank}, the lowest of {len(ranks)}" if len(ranks) > 1 else f"rank {low.rank}"
    text = (f"FLOPs (matrix products, convolutions and attention, from the recorded shapes; {which}): "
            + ", ".join(parts))
    return text + (f"; {low.flops_lower_bound}" if low.flops_lower_bound else "")


def analysed_steps(d: Diagnosis) -> list[int]:
    """The steps analysed on every rank, together ([] when no rank has one)."""
    return [s for r in d.ranks for s in r.steps]
