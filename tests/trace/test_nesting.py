"""trace/nesting.py: the one definition of "the innermost span holding a moment".

Reference: a brute-force scan written from the stated semantics (a span holds start <= t < end; of the
spans holding t on the query's thread, the innermost is the last by (start, shortest, later row)), on
hand-picked edges and on random intervals with many ties (hypothesis).
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainperf.trace.nesting import enclosing_span, innermost, nest


def _brute_innermost(key, start, end, qkey, qts) -> list[int]:
    out = []
    for k, t in zip(qkey, qts):
        holders = [i for i in range(len(key)) if key[i] == k and start[i] <= t < end[i]]
        out.append(max(holders, key=lambda i: (start[i], start[i] - end[i], i)) if holders else -1)
    return out


def _brute_parent(key, start, end) -> list[int]:
    """Per span (input index): the last earlier span in nesting order that holds its start and does not end
    before it, else -1."""
    order = sorted(range(len(key)), key=lambda i: (key[i], start[i], start[i] - end[i], i))
    out = [-1] * len(key)
    for a, i in enumerate(order):
        for j in reversed(order[:a]):
            if key[j] == key[i] and start[j] <= start[i] < end[j] and end[j] >= end[i]:
                out[i] = j
                break
    return out


def _spans(rows):
    key, start, end = (np.array(c, dtype=np.int64) for c in zip(*rows))
    return key, start, end


def test_a_span_holds_its_start_but_not_its_end():
    key, start, end = _spans([(1, 10, 20)])
    got = enclosing_span(key, start, end, np.array([1, 1, 1, 1]), np.array([9, 10, 19, 20]))
    assert got.tolist() == [-1, 0, 0, -1]


def test_back_to_back_spans_a_query_at_the_boundary_is_in_the_later_one():
    # op A [0, 10) then op B [10, 20) on one thread (Kineto's µs rounding makes them touch): a launch at 10
    # is B's
    key, start, end = _spans([(1, 0, 10), (1, 10, 20)])
    assert enclosing_span(key, start, end, np.array([1]), np.array([10])).tolist() == [1]


def test_equal_starts_the_shorter_span_is_inner_and_identical_spans_nest_in_table_order():
    # rows: 0 = [0, 100) outer, 1 = [0, 40) inner (same start), 2 and 3 = [50, 60) twice: 3 inside 2
    key, start, end = _spans([(1, 0, 40), (1, 0, 100), (1, 50, 60), (1, 50, 60)])
    got = enclosing_span(key, start, end, np.array([1, 1, 1, 1]), np.array([0, 39, 40, 55]))
    assert got.tolist() == [0, 0, 1, 3]
    n = nest(key, start, end)
    parent_of = dict(zip(n.order.tolist(), n.original(n.parent).tolist()))
    assert parent_of == {1: -1, 0: 1, 2: 1, 3: 2}


def test_a_zero_length_span_holds_nothing():
    key, start, end = _spans([(1, 0, 100), (1, 50, 50)])
    assert enclosing_span(key, start, end, np.array([1]), np.array([50])).tolist() == [0]


def test_a_span_outlasting_its_neighbour_is_not_nested_in_it():
    # A [0, 10) and B [5, 15) overlap without nesting (clock artefact): B is a root; at 7 both hold the moment,
    # the later-starting B is the innermost; at 12 only B
    key, start, end = _spans([(1, 0, 10), (1, 5, 15)])
    assert nest(key, start, end).parent.tolist() == [-1, -1]
    assert enclosing_span(key, start, end, np.array([1, 1, 1]), np.array([3, 7, 12])).tolist() == [0, 1, 1]


def test_threads_are_separate():
    key, start, end = _spans([(1, 0, 100), (2, 10, 20)])
    got = enclosing_span(key, start, end, np.array([2, 2, 1, 3]), np.array([15, 30, 15, 15]))
    assert got.tolist() == [1, -1, 0, -1]


_span = st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 6))  # key, start, length


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(spans=st.lists(_span, min_size=0, max_size=25), queries=st.lists(st.tuples(st.integers(0, 3),
                                                                                  st.integers(-1, 20)), max_size=25))
def test_innermost_and_parent_match_a_brute_force_scan(spans, queries):
    key = np.array([s[0] for s in spans], dtype=np.int64)
    start = np.array([s[1] for s in spans], dtype=np.int64)
    end = start + np.array([s[2] for s in spans], dtype=np.int64)
    qkey = np.array([q[0] for q in queries], dtype=np.int64)
    qts = np.array([q[1] for q in queries], dtype=np.int64)
    assert enclosing_span(key, start, end, qkey, qts).tolist() == _brute_innermost(key, start, end, qkey, qts)
    n = nest(key, start, end)
    got = [-1] * len(spans)
    for i, p in enumerate(n.original(n.parent).tolist()):
        got[int(n.order[i])] = p
    assert got == _brute_parent(key, start, end)
    assert n.original(innermost(n, qkey, qts)).tolist() == _brute_innermost(key, start, end, qkey, qts)
