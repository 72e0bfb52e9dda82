"""Root-cause localisation: which attribute combinations (host, GPU, driver, NCCL, config, ...)
explain a change of a fleet measure.

Input: one row per leaf (a full combination of attribute values) with the measure now and a
forecast from history. For a derived measure M/N (failures per request, step time per token)
the expected numerator of a leaf is its current denominator times its historical ratio
(shrunk towards the fleet's ratio when the leaf has little history), so a traffic shift alone
is not a cause.

Search (the "ripple" principle of Squeeze, Li et al. 2019, scored differently): a candidate is a
set of elements of one cuboid (e.g. {nccl=2.21} or {host=a, host=b} or {bitrate=500 & cdn=7}),
built from the elements ranked by surprise (deviation / sqrt(expectation)). Inside the candidate
all leaves move together: a derived measure's ratio rises by one shared amount (each leaf by
its denominator times it), a sum scales by one shared factor; outside, leaves stay at their
expectation. The candidate's loss is the L1 distance between that model and the observed leaves:
a too-general candidate moves healthy leaves, a too-specific one leaves anomalous leaves
unexplained. The choice minimises loss / (no-cause loss) + ``penalty`` x (attribute=value pairs),
a description-length rule that prefers the most general combination.
Hand-written: no maintained Python library implements multi-dimensional root-cause search.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from trainperf.errors import TrainperfError


@dataclass
class Cause:
    """One root-cause element with its evidence (before = expected, after = observed)."""

    attrs: dict  # {"attr": "value", ...}
    before: float  # the measure expected from history (ratio for a derived measure)
    after: float  # the measure observed at the change
    share: float  # share of the total change this element explains (0..1, may exceed 1)
    n_leaves: int

    def to_dict(self) -> dict:
        """Return JSON-able data."""
        return {"attrs": self.attrs, "before": self.before, "after": self.after, "share": self.share,
                "n_leaves": self.n_leaves}


@dataclass
class Localization:
    """The root causes of a change and the evidence for them."""

    causes: list[Cause] = field(default_factory=list)
    explained: float = 0.0  # fraction of the leaf-level deviation the model explains (0..1)
    total_before: float = 0.0
    total_after: float = 0.0

    @property
    def root_causes(self) -> list[dict]:
        """Return the causes as [{"attr": "value", ...}, ...]."""
        return [c.attrs for c in self.causes]

    def to_dict(self) -> dict:
        """Return JSON-able data (``root_causes`` first)."""
        return {"root_causes": self.root_causes, "explained": self.explained, "total_before": self.total_before,
                "total_after": self.total_after, "causes": [c.to_dict() for c in self.causes]}


def expected_values(real_a: np.ndarray, pred_a: np.ndarray, real_b: np.ndarray | None = None,
                    pred_b: np.ndarray | None = None) -> np.ndarray:
    """Return the expected numerator per leaf.

    Fundamental measure (no denominator): the forecast ``pred_a``. Derived measure a/b: the
    leaf's observed ``real_b`` times its historical ratio pred_a/pred_b; a leaf with no history
    (pred_b = 0, e.g. a host that just got a new NCCL) takes the ratio of the history of the
    leaves that share the most attribute values with it (see ``localize_rows``), else the fleet's.
    """
    if real_b is None:
        return pred_a.astype(float)
    tot_b = pred_b.sum()
    fleet = pred_a.sum() / tot_b if tot_b > 0 else 0.0
    rate = np.where(pred_b > 0, pred_a / np.where(pred_b > 0, pred_b, 1.0), fleet)
    return real_b * rate


def _model_loss(real: np.ndarray, exp: np.ndarray, weight: np.ndarray, inside: np.ndarray) -> float:
    """L1 loss of the model "leaves inside move together, the rest stay at their expectation".

    Inside, each leaf's expectation moves by ``weight * delta`` with one shared delta fitted to the
    inside total: weight = the leaf's denominator for a derived measure (the ratio rises by the
    same amount, e.g. +2% of requests fail), weight = the expectation itself for a sum (it scales
    by the same factor).
    """
    w_in = weight[inside].sum()
    delta = (real[inside].sum() - exp[inside].sum()) / w_in if w_in > 0 else 0.0
    model = np.where(inside, exp + weight * delta, exp)
    return float(np.abs(real - model).sum())


def localize(leaves: dict[str, np.ndarray], real: np.ndarray, expected: np.ndarray, max_depth: int = 3,
             max_elements: int = 4, penalty: float = 0.05, min_explained: float = 0.3,
             real_b: np.ndarray | None = None, expected_b: np.ndarray | None = None) -> Localization:
    """Return the root causes of real vs expected over the leaves.

    ``leaves``: attribute name -> array of values (one per leaf). ``real``/``expected``: the
    numerator now and expected (see expected_values). ``real_b``/``expected_b``: the denominator
    for a derived measure (evidence only). ``max_depth``: most attributes in one combination;
    ``max_elements``: most elements in one cause set; ``penalty``: the fraction of the deviation
    each attribute=value pair of a cause must explain to be worth reporting (prefers the most
    general cause); ``min_explained``: report nothing unless the chosen cause explains this
    fraction of the leaf-level deviation (L1).
    """
    attrs = list(leaves)
    if not attrs:
        raise TrainperfError("localize: no attribute columns")
    real = np.asarray(real, float)
    expected = np.asarray(expected, float)
    n = len(real)
    total_dev = real.sum() - expected.sum()
    base_loss = float(np.abs(real - expected).sum())
    out = Localization(total_before=float(expected.sum()), total_after=float(real.sum()))
    # how leaves inside a cause move together: a sum (or mean) scales by one factor (weight =
    # expectation); a derived ratio shifts by one increment (weight = the leaf's denominator)
    weight = np.abs(expected) if real_b is None else np.asarray(real_b, float)
    if n == 0 or base_loss == 0:
        return out
    sign = 1.0 if total_dev >= 0 else -1.0
    enc = {a: np.unique(np.asarray(leaves[a]).astype(str), return_inverse=True) for a in attrs}
    candidates = []  # (loss, complexity, cuboid, element codes, uniques)
    for depth in range(1, min(max_depth, len(attrs)) + 1):
        for cuboid in itertools.combinations(attrs, depth):
            keys = np.stack([enc[a][1] for a in cuboid], axis=1)
            uniq, codes = np.unique(keys, axis=0, return_inverse=True)
            codes = codes.ravel()
            m = len(uniq)
            agg_real = np.bincount(codes, real, m)
            agg_exp = np.bincount(codes, expected, m)
            dev = (agg_real - agg_exp) * sign
            # rank elements by how surprising they are: deviation relative to the Poisson-like
            # scale of their expectation (counts) or their size (continuous measures)
            score = dev / np.sqrt(np.abs(agg_exp) + 1.0)
            order = [i for i in np.argsort(-score) if dev[i] > 0][:max_elements]
            for k in range(1, len(order) + 1):
                chosen = np.array(order[:k])
                loss = _model_loss(real, expected, weight, np.isin(codes, chosen))
                candidates.append((loss, depth * k, cuboid, chosen, uniq, agg_real, agg_exp))
    if not candidates:
        return out
    # description length: the unexplained fraction plus a price per attribute=value pair, so a
    # more specific cause must explain ``penalty`` more of the deviation per extra condition
    loss, _, cuboid, chosen, uniq, agg_real, agg_exp = min(candidates, key=lambda c: (c[0] / base_loss + penalty * c[1], c[1]))
    out.explained = 1.0 - loss / base_loss
    if out.explained < min_explained:
        return out
    for i in chosen:
        attrs_i = {a: str(enc[a][0][uniq[i][j]]) for j, a in enumerate(cuboid)}
        before, after = float(agg_exp[i]), float(agg_real[i])
        if real_b is not None and expected_b is not None:
            mask = np.ones(n, bool)
            for a, v in attrs_i.items():
                mask &= np.asarray(leaves[a]).astype(str) == v
            rb = float(np.asarray(real_b)[mask].sum())
            before, after = (before / rb if rb else float("nan")), (after / rb if rb else float("nan"))
        share = float((agg_real[i] - agg_exp[i]) / total_dev) if total_dev else float("nan")
        out.causes.append(Cause(attrs=attrs_i, before=before, after=after, share=share,
                                n_leaves=int((np.all([enc[a][1] == uniq[i][j] for j, a in enumerate(cuboid)], axis=0)).sum())))
    return out


def localize_rows(columns: dict[str, np.ndarray], time_col: str, measure: str, at=None, per: str | None = None,
                  attrs: list[str] | None = None, history: int | None = 4, before: tuple | None = None,
                  after: tuple | None = None, **params) -> Localization:
    """Localise a change in a table of one row per leaf and time.

    ``columns``: column name -> array. The measure is ``measure`` (or the ratio measure/per).
    Either ``at``: the changed time, with the rows before it as history (the last ``history``
    times: 4 by default, as RobustSpot; None = all); or two windows ``before=(t0, t1)`` and ``after=(t2, t3)`` (inclusive).
    Each leaf's value in a window is its mean over the window's rows. ``attrs``: attribute
    columns (default: every other column). ``params`` go to ``localize``.
    """
    for c in [time_col, measure] + ([per] if per else []):
        if c not in columns:
            raise TrainperfError(f"localize: no column {c!r} (columns: {', '.join(columns)})")
    attrs = attrs or [c for c in columns if c not in (time_col, measure, per)]
    if not attrs:
        raise TrainperfError("localize: no attribute columns besides time and measure")
    missing = [a for a in attrs if a not in columns]
    if missing:
        raise TrainperfError(f"localize: no attribute column {missing[0]!r}")
    t = np.asarray(columns[time_col])
    numeric_time = np.issubdtype(t.dtype, np.number)

    def as_time(v):
        if not numeric_time:
            return str(v)
        try:
            return float(v)
        except (TypeError, ValueError):
            raise TrainperfError(f"localize: time {v!r} is not a number like the {time_col!r} column") from None

    if not numeric_time:
        t = t.astype(str)
    if at is not None:
        at = as_time(at)
        now = t == at
        if not now.any():
            raise TrainperfError(f"localize: no rows at {time_col} = {at}")
        past_times = np.unique(t[t < at])
        if history:
            past_times = past_times[-history:]
        past = np.isin(t, past_times)
    elif before is not None and after is not None:
        b0, b1, a0, a1 = (as_time(v) for v in (*before, *after))
        past, now = (t >= b0) & (t <= b1), (t >= a0) & (t <= a1)
        past_times = np.unique(t[past])
        if not now.any():
            raise TrainperfError(f"localize: no rows in the window {time_col} {a0}..{a1}")
    else:
        raise TrainperfError("localize: give the changed time (--at) or two windows")
    if not past.any():
        raise TrainperfError(f"localize: no rows before the change in {time_col!r} to forecast from")

    def numeric(name):
        try:
            v = np.asarray(columns[name], dtype=float)
        except (TypeError, ValueError):
            raise TrainperfError(f"localize: column {name!r} is not numeric") from None
        return np.nan_to_num(v)

    a_all = numeric(measure)
    b_all = numeric(per) if per else None
    keys = np.stack([np.asarray(columns[c]).astype(str) for c in attrs], axis=1)
    leaf_keys, leaf_idx = np.unique(keys, axis=0, return_inverse=True)
    leaf_idx = leaf_idx.ravel()
    m = len(leaf_keys)
    # a leaf's value in a window: the sum over its rows / the number of distinct times it has rows
    def window_mean(mask, v):
        times = np.unique(np.stack([leaf_idx[mask], np.unique(t[mask], return_inverse=True)[1].ravel()]), axis=1)
        n_times = np.maximum(np.bincount(times[0], minlength=m), 1)
        return np.bincount(leaf_idx[mask], v[mask], m) / n_times

    real_a, pred_a = window_mean(now, a_all), window_mean(past, a_all)
    if b_all is not None:
        real_b, pred_b = window_mean(now, b_all), window_mean(past, b_all)
    else:
        real_b = pred_b = None
    has_hist = np.bincount(leaf_idx[past], minlength=m) > 0
    pred_a, pred_b = _fill_new_leaves(leaf_keys, has_hist, pred_a, pred_b, keys[past], a_all[past],
                                      None if b_all is None else b_all[past])
    exp_a = expected_values(real_a, pred_a, real_b, pred_b)
    present = np.bincount(leaf_idx[now], minlength=m) > 0  # leaves observed at the change
    leaves = {a: leaf_keys[present, j] for j, a in enumerate(attrs)}
    rb = None if real_b is None else real_b[present]
    return localize(leaves, real_a[present], exp_a[present], real_b=rb, expected_b=rb, **params)


def _fill_new_leaves(leaf_keys, has_hist, pred_a, pred_b, past_keys, past_a, past_b):
    """Give each leaf without history the history of its nearest ancestor (fewest attributes dropped).

    A host that just moved to a new NCCL has no history as (host, new NCCL); as (host) it has.
    When several ancestors at the same distance have history, their rows are pooled. Returns new
    (pred_a, pred_b): the ancestor's mean per row (fundamental) or its ratio with pred_b = 1 (derived).
    """
    new = np.flatnonzero(~has_hist)
    if len(new) == 0 or len(past_keys) == 0:
        return pred_a, pred_b
    pred_a = pred_a.copy()
    pred_b = None if pred_b is None else pred_b.copy()
    den = np.ones(len(past_a)) if past_b is None else past_b
    n_attr = leaf_keys.shape[1]
    cache: dict = {}

    def groups(subset):
        if subset not in cache:
            acc: dict = {}
            for row, a, b in zip(map(tuple, past_keys[:, list(subset)]), past_a, den):
                s = acc.setdefault(row, [0.0, 0.0])
                s[0] += a
                s[1] += b
            cache[subset] = acc
        return cache[subset]

    for i in new:
        for drop in range(1, n_attr + 1):
            sa = sb = 0.0
            for subset in itertools.combinations(range(n_attr), n_attr - drop):
                hit = groups(subset).get(tuple(leaf_keys[i, list(subset)]))
                if hit and hit[1] > 0:
                    sa, sb = sa + hit[0], sb + hit[1]
            if sb > 0:
                pred_a[i] = sa / sb
                if pred_b is not None:
                    pred_b[i] = 1.0
                break
    return pred_a, pred_b


def read_csv_columns(path: str) -> dict[str, np.ndarray]:
    """Return the columns of a CSV file as numpy arrays; raise TrainperfError when unreadable."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(path)
    except FileNotFoundError:
        raise TrainperfError(f"{path}: no such file") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise TrainperfError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    if table.num_rows == 0:
        raise TrainperfError(f"{path}: no rows")
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
