"""``compare``: is B faster than A, and is it still the same training? One call, one result."""

from __future__ import annotations

from dataclasses import dataclass

from trainperf.compare.history import between_floor
from trainperf.compare.numerics import NumericsResult, compare_numerics
from trainperf.compare.perf import LEVEL, MIN_EFFECT, PerfResult, compare_perf
from trainperf.compare.runs import RunData, load_run, load_side


@dataclass(kw_only=True)
class Comparison:
    """The two sides, their performance and numerics, and the one-line verdict."""

    a: list[str]
    b: list[str]
    perf: PerfResult
    numerics: NumericsResult

    @property
    def headline(self) -> str:
        """Return the verdict in one line, e.g. "B is 11.8% faster (±0.9%, 95% interval), uses 14% less
        memory; numerics: equivalent"."""
        t = self.perf.throughput
        half = (t.hi - t.lo) / 2
        if self.perf.verdict == "inconclusive":
            hosts = self.perf.hosts
            speed = (f"B's speed cannot be told from its host's ({t.change:+.1%} on {', '.join(hosts[1])} against "
                     f"{', '.join(hosts[0])}, how much hosts differ unknown)")
        elif self.perf.verdict == "inside the noise":
            speed = f"B's speed is inside the noise ({t.change:+.1%}, 95% interval {t.lo:+.1%} to {t.hi:+.1%})"
        else:
            speed = (f"B is {abs(t.change):.1%} {self.perf.verdict} (±{half:.1%}, {LEVEL:.0%} interval "
                     f"{t.lo:+.1%} to {t.hi:+.1%})")
        if self.perf.hosts_offset and self.perf.verdict != "inconclusive":  # the changes are net of the hosts'
            speed += f", net of B's hosts' {self.perf.hosts_offset:+.1%} in time per token against A's (from the store)"
        ma, mb = self.perf.mem_peak_bytes
        mem = ""
        if ma > 0 and mb > 0 and abs(mb / ma - 1) >= 0.01:
            mem = f", uses {abs(mb / ma - 1):.0%} {'less' if mb < ma else 'more'} memory"
        return f"{speed}{mem}; numerics: {self.numerics.verdict}"

    def to_dict(self) -> dict:
        """Return JSON-able data (``verdict`` first)."""
        return {"verdict": self.headline, "a": self.a, "b": self.b, "performance": self.perf.to_dict(),
                "numerics": self.numerics.to_dict()}


def compare_runs(a: str | list[RunData], b: str | list[RunData], *, store: str | None = None,
                 target_loss: float | None = None, reference: str | RunData | None = None,
                 min_effect: float = MIN_EFFECT) -> Comparison:
    """Return B against A. ``a``/``b``: run folders or store run ids (comma-separated for repeats),
    or loaded runs; ``reference``: a run in higher precision whose difference from A is the
    numerics band; ``target_loss``: the loss for time-to-target (default: the worse end point).
    With one run a side, the store's history of repeated runs on their host gives the between-run
    term of the speed interval (``compare.history``; the stated default without one); when A and B
    ran on different hosts, the store's runs of one configuration on several hosts give the hosts' term
    (without them the speed verdict is "inconclusive")."""
    a_runs = load_side(a, store) if isinstance(a, str) else list(a)
    b_runs = load_side(b, store) if isinstance(b, str) else list(b)
    ref = load_run(reference, store) if isinstance(reference, str) else reference
    floor = between_floor(a_runs, b_runs, store)
    return Comparison(a=[r.name for r in a_runs], b=[r.name for r in b_runs],
                      perf=compare_perf(a_runs, b_runs, min_effect=min_effect, between=floor),
                      numerics=compare_numerics(a_runs, b_runs, target=target_loss, reference=ref))
