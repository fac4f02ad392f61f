"""planner.scoring_plan: every record once, in order, equal shares over the workers, parts of at most part_rows."""
import pytest

from tfyarn.data.planner import scoring_plan


def _rows(parts):
    return [(r.path, i) for p in parts for r in p.ranges for i in range(r.start, r.stop)]


@pytest.mark.parametrize("workers,part_rows", [(1, 10**6), (3, 7), (4, 1), (5, 100), (7, 3)])
def test_every_record_once_in_manifest_order_in_equal_shares(workers, part_rows):
    files = [("b", 13), ("a", 5), ("c", 0), ("d", 40)]
    parts = scoring_plan(files, workers, part_rows)
    assert _rows(parts) == [(p, i) for p, n in sorted(files) for i in range(n)]
    assert [p.index for p in parts] == list(range(len(parts)))
    shares = [sum(p.rows for p in parts if p.worker == w) for w in range(workers)]
    assert sum(shares) == 58 and max(shares) - min(shares) <= 1
    assert all(0 < p.rows <= part_rows for p in parts)
    assert [p.worker for p in parts] == sorted(p.worker for p in parts)   # a worker's parts are consecutive


def test_the_plan_is_a_pure_function_and_fewer_records_than_workers_leave_some_idle():
    assert scoring_plan([("x", 10)], 3, 4) == scoring_plan([("x", 10)], 3, 4)
    parts = scoring_plan([("x", 2)], 4, 10)
    assert sorted(p.worker for p in parts) == [1, 3] and _rows(parts) == [("x", 0), ("x", 1)]
    assert scoring_plan([], 2, 5) == ()
    with pytest.raises(ValueError):
        scoring_plan([("x", 1)], 0, 5)
