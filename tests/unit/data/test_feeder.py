"""Feeder: exact steps, every record once across workers, resume, shuffle, early close without thread leaks,
bounded waits. TF-free (pure-Python parser) unless the test says otherwise."""
from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from tfyarn.data import Feeder, build_manifest, plan
from tfyarn.data.errors import NoDataError
from tfyarn.data.parse import python_parser
from tfyarn.errors import WaitTimeout

from _datahelpers import ID_SCHEMA, write_ids

SIZES = [230, 23, 61, 120, 7]        # 441 records, ~30x skew


def dataset(root, sizes=SIZES, compression="none"):
    start = 0
    for i, n in enumerate(sizes):
        ext = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
        write_ids(f"{root}/part-{i}{ext}", start, n, compression=compression)
        start += n
    return build_manifest([f"{root}/part-*"], stride=16, use_cache=False)


def feeder(m, rank=0, workers=1, batch=7, **kw):
    kw.setdefault("parser", python_parser)
    kw.setdefault("timeout", 30)
    return Feeder(m, ID_SCHEMA, batch, rank, workers, **kw)


def rids(batches):
    return [int(r) for b in batches for r in b["rid"]]


@pytest.mark.parametrize("root", ["mem", "local"])
@pytest.mark.parametrize("workers", [1, 3, 4])
def test_every_worker_same_steps_every_record_once(root, workers, request, no_thread_leak):
    m = dataset(request.getfixturevalue(root))
    seen = []
    for epoch in (0, 1):
        steps = set()
        got = []
        for rank in range(workers):
            with feeder(m, rank, workers) as f:
                batches = list(f.epoch(epoch))
                steps.add(len(batches))
                assert len(batches) == f.steps(epoch)
                for b in batches:
                    assert b["rid"].shape == (7,) and b["rid"].dtype == np.int64
                    assert b["x"].shape == (7, 2) and b["x"].dtype == np.float32
                    assert (b["x"][:, 0] == b["rid"]).all()          # rows stay aligned across features
                got += rids(batches)
        p = plan(m, workers, epoch, 0, 7)
        assert steps == {p.steps}
        assert len(got) == len(set(got)) == workers * p.steps * 7 == 441 - p.dropped
        seen.append(set(got))
    assert seen[0] != seen[1] or plan(m, workers, 0, 0, 7).dropped == 0


def test_gzip_files(src):
    m = dataset(src, compression="gzip")
    assert all(f.gz for f in m.files)
    with feeder(m, batch=21) as f:
        assert sorted(rids(f.epoch(0))) == list(range(441))


@pytest.mark.parametrize("shuffle", [0, 50])
def test_resume_mid_epoch_reproduces_the_rest(src, shuffle):
    m = dataset(src)
    with feeder(m, 1, 2, shuffle_buffer=shuffle, seed=5) as f:
        full = list(f.epoch(3))
        rest = list(f.epoch(3, start_step=11))
        assert len(rest) == f.steps(3) - 11
        assert rids(rest) == rids(full[11:])
        assert list(f.epoch(3, start_step=f.steps(3))) == []


def test_shuffle_buffer_is_seeded_and_changes_the_order(src):
    m = dataset(src)
    with feeder(m, shuffle_buffer=64, seed=1) as f:
        a = rids(f.epoch(0))
        b = rids(f.epoch(0))
        c = rids(f.epoch(1))
    with feeder(m) as f:
        plain = rids(f.epoch(0))
    assert a == b and sorted(a) == sorted(plain) and a != plain
    assert c != a


def test_closing_early_stops_all_threads(src, no_thread_leak):
    m = dataset(src)
    f = feeder(m, batch=3, prefetch=2, parse_group=3)  # queues much smaller than the epoch
    it = f.epoch(0)
    next(it)
    time.sleep(0.2)                      # let both threads block on full queues
    assert sum(t.name.startswith("tfyarn-feeder") for t in threading.enumerate()) == 2
    f.close()


def test_new_epoch_closes_the_previous_one(src, no_thread_leak):
    m = dataset(src)
    with feeder(m) as f:
        next(f.epoch(0))
        next(f.epoch(1))
        assert sum(t.name.startswith("tfyarn-feeder") for t in threading.enumerate()) <= 2


def test_consumer_wait_is_bounded_and_names_what_it_waited_for(src, no_thread_leak):
    m = dataset(src)

    def slow_parser(fields):
        inner = python_parser(fields)

        def parse(payloads):
            time.sleep(2.5)   # longer than the consumer waits; shorter than a closed feeder waits for its threads
            return inner(payloads)
        return parse

    # What the reader is doing when the 1.5 s are up depends on the box (done long before when quiet; at load 25-50
    # a framing process took 1.0-1.25 s to start): the message names it, whichever it is.
    with feeder(m, parser=slow_parser, timeout=1.5) as f, pytest.raises(WaitTimeout) as e:
        next(f.epoch(2))
    reader = r"(starting|reading \S+ records \d+\.\.\d+( \(framing process \d+\))?|done, waiting for the parser)"
    parser = r"(starting|loading the parser|waiting for records \(batch 0 of 63\)|parsing batch 0 of 63)"
    assert re.fullmatch(r"feeder \(worker 0, epoch 2\): no batch ready within 1\.5s at step 0 of 63 "
                        rf"\(reader: {reader}; parser: {parser}\)", str(e.value)), str(e.value)


def test_fewer_records_than_one_global_batch(src):
    m = dataset(src, sizes=[5, 3])
    with pytest.raises(NoDataError) as e:
        feeder(m, 0, 2, batch=5)
    assert str(e.value) == "8 records are fewer than one global batch (2 workers x batch 5): no step can be planned"


def test_bad_arguments(src):
    m = dataset(src)
    with pytest.raises(ValueError, match="rank 2 is not in 0..1"):
        feeder(m, 2, 2)
    with pytest.raises(ValueError, match="on_corrupt must be 'fail' or 'skip', not 'ignore'"):
        feeder(m, on_corrupt="ignore")
    with feeder(m) as f, pytest.raises(ValueError, match=r"start_step 64 is outside 0..63"):
        f.epoch(0, start_step=64)


def test_read_ahead_is_bounded_when_the_consumer_stalls(src, no_thread_leak):
    # The memory bound in the module docstring, checked: a consumer that stops consuming makes the reader stop after
    # at most ~4 parse groups (serialized) + one group and prefetch batches (parsed, in the ready queue) + one framing
    # step, whatever the epoch size.
    sizes = [3000] * 4
    m = dataset(src, sizes=sizes)
    with feeder(m, batch=10, prefetch=2, parse_group=100, frame_records=50) as f:
        it = f.epoch(0)
        next(it)
        time.sleep(0.5)
        run = f._active
        bound = 5 * f.group + f.prefetch * f.batch_size + f.frame_records + f.batch_size
        assert f.group == 100 and run.records_read <= bound < sum(sizes)
        first = run.records_read
        time.sleep(0.3)
        assert run.records_read == first                     # parked, not spinning through the data


def test_a_parser_failure_reaches_the_consumer(src, no_thread_leak):
    m = dataset(src)

    def broken(fields):
        raise RuntimeError("no TensorFlow on this host")

    with feeder(m, parser=broken) as f, pytest.raises(RuntimeError, match="no TensorFlow on this host"):
        next(f.epoch(0))


def test_shuffle_with_skip_and_resume(src, cache_dir):
    # A corrupt record inside the share, shuffle on, resumed mid-epoch: the resumed run equals the tail of the full run.
    from tfyarn.data.example import encode_example
    from tfyarn.data.tfrecord import TFRecordWriter
    url = f"{src}/x.tfrecord"
    with TFRecordWriter(url) as w:
        for i in range(100):
            w.write(encode_example({"rid": [i]}, {"rid": "int64"}) if i == 40 else
                    encode_example({"rid": [i], "x": [1.0, 2.0]}, {"rid": "int64", "x": "float"}))
    m = build_manifest([url], cache_dir=cache_dir)
    with feeder(m, batch=10, shuffle_buffer=16, seed=3, on_corrupt="skip") as f:
        full = rids(f.epoch(0))
        assert f.skipped == 1 and len(full) == 100 and 40 not in full and len(set(full)) == 99
        rest = rids(f.epoch(0, start_step=4))
        assert rest == full[40:]


def test_accepts_the_specs_feature_models(src):
    from tfyarn.spec import Feature
    m = dataset(src)
    features = {"rid": Feature(dtype="int32"), "x": Feature(dtype="float64", shape=(2,))}
    with Feeder(m, features, 21, 0, 1, parser=python_parser, timeout=30) as f:
        b = next(iter(f.epoch(0)))
    assert b["rid"].dtype == np.int32 and b["x"].dtype == np.float64 and b["x"].shape == (21, 2)


def test_stats_after_an_epoch(src):
    m = dataset(src)
    with feeder(m, 0, 2) as f:
        n = len(list(f.epoch(0)))
        st = f.stats()
    assert n == f.steps(0) == 31
    assert st["records_read"] == 31 * 7 and st["skipped"] == 0 and st["skipped_examples"] == []
    assert st["reader_blocked_s"] >= 0 and st["parser_blocked_s"] >= 0 and st["consumer_wait_s"] >= 0
