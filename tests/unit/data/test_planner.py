"""Planner properties, checked by hypothesis over random file sizes, worker counts, batch sizes, seeds, epochs."""
from __future__ import annotations

from collections import Counter

from hypothesis import assume, given, settings, strategies as st

from tfyarn.data.manifest import Manifest
from tfyarn.data.planner import RecordRange, plan, round_robin_steps

sizes_st = st.lists(st.integers(0, 3000), min_size=1, max_size=12).filter(lambda s: sum(s) > 0)
workers_st = st.integers(1, 9)
batch_st = st.integers(1, 300)
seed_st = st.integers(0, 2**32)
epoch_st = st.integers(0, 10_000)


def manifest(sizes):
    return Manifest.from_counts((f"memory:///d/part-{i:03d}", n) for i, n in enumerate(sizes))


def records(ranges):
    return [(r.path, i) for r in ranges for i in range(r.start, r.stop)]


@settings(max_examples=300, deadline=None)
@given(sizes_st, workers_st, batch_st, seed_st, epoch_st)
def test_equal_steps_disjoint_balanced_and_few_dropped(sizes, w, b, seed, epoch):
    m = manifest(sizes)
    p = plan(m, w, epoch, seed, b)
    total = sum(sizes)
    assert p.steps == total // (w * b)
    assert len(p.shares) == w
    for share in p.shares:                                   # every worker: exactly steps x batch records
        assert sum(len(r) for r in share) == p.steps * b
        assert all(0 <= r.start < r.stop for r in share)
    assert p.dropped == total - w * p.steps * b
    assert p.dropped < w * b or p.steps == 0
    everything = [rec for s in p.shares for rec in records(s)] + records(p.dropped_ranges)
    assert len(everything) == len(set(everything)) == total  # disjoint, and with the dropped ones: all records
    sizes_by_path = {f.path: f.records for f in m.files}
    assert all(r.stop <= sizes_by_path[r.path] for s in p.shares for r in s)


@settings(max_examples=100, deadline=None)
@given(sizes_st, workers_st, batch_st, seed_st, epoch_st)
def test_identical_everywhere_and_after_restart(sizes, w, b, seed, epoch):
    # Another task (or a restarted job) rebuilds the manifest independently, in another order, from JSON.
    m1 = manifest(sizes)
    m2 = Manifest.from_json(Manifest.from_counts(reversed([(f.path, f.records) for f in m1.files])).to_json())
    assert plan(m1, w, epoch, seed, b) == plan(m2, w, epoch, seed, b)


@settings(max_examples=100, deadline=None)
@given(sizes_st, workers_st, batch_st, seed_st, st.integers(0, 1000))
def test_dropped_records_rotate(sizes, w, b, seed, epoch):
    m = manifest(sizes)
    p0, p1 = plan(m, w, epoch, seed, b), plan(m, w, epoch + 1, seed, b)
    if p0.steps and p0.dropped:
        # consecutive epochs drop different records: nobody loses the same examples every epoch
        assert not set(records(p0.dropped_ranges)) & set(records(p1.dropped_ranges))


def test_every_record_is_dropped_at_most_once_before_all_others():
    m = manifest([1000, 337, 90])
    p = plan(m, 4, 0, 7, 50)
    assert p.dropped == 1427 - 1400
    counts = Counter()
    for e in range(1427 // p.dropped):
        counts.update(records(plan(m, 4, e, 7, 50).dropped_ranges))
    assert max(counts.values()) == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=4, max_size=12), workers_st, st.integers(1, 50), seed_st)
def test_reshuffled_by_seed_and_epoch(sizes, w, b, seed):
    assume(sum(sizes) >= w * b)
    m = manifest(sizes)
    by_epoch = {plan(m, w, e, seed, b).shares for e in range(8)}
    by_seed = {plan(m, w, 3, s, b).shares for s in range(seed, seed + 8)}
    assert len(by_epoch) > 1 and len(by_seed) > 1


@settings(max_examples=100, deadline=None)
@given(sizes_st, workers_st, workers_st, batch_st, seed_st)
def test_worker_count_may_change_between_epochs(sizes, w1, w2, b, seed):
    m = manifest(sizes)
    for e, w in ((0, w1), (1, w2), (2, w1)):
        p = plan(m, w, e, seed, b)
        assert len(p.shares) == w and {sum(len(r) for r in s) for s in p.shares} == {p.steps * b}


def test_one_file_four_workers():
    p = plan(manifest([1000]), 4, 0, 0, 32)
    assert p.steps == 7 and p.dropped == 1000 - 4 * 7 * 32
    assert all(len(s) in (1, 2) and sum(len(r) for r in s) == 224 for s in p.shares)
    assert all(r.path == "memory:///d/part-000" for s in p.shares for r in s)


def test_ten_times_skew_is_balanced_to_the_record_where_round_robin_is_not():
    sizes = [10_000, 1000, 1000, 1000, 1000, 1000, 1000, 1000]
    p = plan(manifest(sizes), 2, 0, 0, 100)
    assert [sum(len(r) for r in s) for s in p.shares] == [8500, 8500]
    assert round_robin_steps(sizes, 2, 100) == [130, 40]


def test_too_few_records_gives_zero_steps():
    p = plan(manifest([5, 2]), 2, 0, 0, 4)
    assert p.steps == 0 and p.dropped == 7 and p.shares == ((), ())


def test_plan_accepts_pairs_and_ranges_are_sortable():
    p = plan([("b", 10), ("a", 10)], 2, 0, 0, 5)
    assert p.steps == 2
    assert sorted(p.shares[0] + p.shares[1]) == [RecordRange("a", 0, 10), RecordRange("b", 0, 10)]
    assert {r.path for s in p.shares for r in s} == {"a", "b"}
