"""tests/helpers/halves.py: how .ci/run splits the YARN suite between its two clusters."""

from types import SimpleNamespace

import halves
import pytest


def items(*ids):
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_parts_take_whole_modules_balanced_by_time_in_order_and_lose_nothing():
    its = items("a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2", "d.py::t1")
    durations = {"a.py::t1": 50, "a.py::t2": 50, "b.py::t1": 60, "c.py::t1": 20, "c.py::t2": 20, "d.py::t1": 5}
    one, two = halves.split(its, durations, 2)
    assert [i.nodeid for i in one] == ["a.py::t1", "a.py::t2", "d.py::t1"]  # 105 s
    assert [i.nodeid for i in two] == ["b.py::t1", "c.py::t1", "c.py::t2"]  # 100 s
    assert sorted(one + two, key=its.index) == its


def test_a_test_without_a_time_counts_as_the_median_and_any_part_count_works():
    its = items("new.py::t", "a.py::t", "b.py::t", "c.py::t")
    parts = halves.split(its, {"a.py::t": 10, "b.py::t": 30, "c.py::t": 20}, 3)
    # new.py counts 20 s (the median): b 30 s, then c and new 20 s each, then a 10 s to the part with c
    assert [[i.nodeid for i in p] for p in parts] == [["b.py::t"], ["a.py::t", "c.py::t"], ["new.py::t"]]
    assert [len(p) for p in halves.split(its, {}, 1)] == [4]


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b", "1/0"])
def test_a_part_is_k_of_n(text):
    with pytest.raises(ValueError, match="K/N"):
        halves.parse_part(text)
    assert halves.parse_part("2/2") == (2, 2)
