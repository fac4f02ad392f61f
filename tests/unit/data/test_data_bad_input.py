"""Bad input: every case fails (or, with on_corrupt=skip, is skipped) with an exact message naming file, byte offset,
record index and feature. Runs without TensorFlow (pure-Python parser) except where marked."""
from __future__ import annotations

import gzip

import fsspec
import pytest

from tfyarn.data import DataError, Feeder, NoDataError, build_manifest
from tfyarn.data.example import encode_example
from tfyarn.data.parse import python_parser
from tfyarn.data.tfrecord import TFRecordWriter, encode_record

from _datahelpers import ID_SCHEMA, example, job_spec, write_ids

#: every test twice: with the C loops and with the Python/numpy/TF ones (tfyarn.data.native)
pytestmark = pytest.mark.usefixtures("loops")


def offsets(payloads):
    out, acc = [], 0
    for p in payloads:
        out.append(acc)
        acc += len(p) + 16
    return out


def patch(url, pos, fn):
    fs, p = fsspec.core.url_to_fs(url)
    data = bytearray(fs.cat_file(p))
    fn(data, pos)
    fs.pipe_file(p, bytes(data))


def flip(data, pos):
    data[pos] ^= 0x40


def feeder(m, batch=5, workers=1, on_corrupt="fail", **kw):
    return Feeder(m, ID_SCHEMA, batch, 0, workers, on_corrupt=on_corrupt, parser=python_parser, timeout=30, **kw)


def drain(f, epoch=0):
    return [b for b in f.epoch(epoch)]


def test_truncated_file(mem, cache_dir):
    url = f"{mem}/a.tfrecord"
    p = write_ids(url, 0, 5)
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(path, fs.cat_file(path)[:-3])
    with pytest.raises(DataError) as e:
        build_manifest([url], cache_dir=cache_dir)
    assert str(e.value) == (f"memory:///{path.lstrip('/')}: record 4 at byte offset {offsets(p)[4]}: truncated file "
                            f"({len(p[4]) + 16 - 3} trailing bytes are not a complete record)")
    assert (e.value.record, e.value.offset) == (4, offsets(p)[4])


def test_corrupted_length_crc(mem, cache_dir):
    url = f"{mem}/a.tfrecord"
    p = write_ids(url, 0, 5)
    patch(url, offsets(p)[2] + 9, flip)
    with pytest.raises(DataError) as e:
        build_manifest([url], cache_dir=cache_dir)
    full = build_url(url)
    assert str(e.value) == (
        f"{full}: record 2 at byte offset {offsets(p)[2]}: corrupted record header (length CRC mismatch)")


def test_corrupted_length_itself_is_caught_without_reading_to_the_end(mem, cache_dir):
    url = f"{mem}/a.tfrecord"
    p = write_ids(url, 0, 5)
    patch(url, offsets(p)[1] + 6, flip)         # a huge length: framing would otherwise wait for terabytes
    header_crc = r"record 1 at byte offset \d+: corrupted record header \(length CRC mismatch\)"
    with pytest.raises(DataError, match=header_crc):
        build_manifest([url], cache_dir=cache_dir)


def build_url(url):
    fs, path = fsspec.core.url_to_fs(url)
    return fs.unstrip_protocol(path)


def test_corrupted_data_crc_fails_with_location(src, cache_dir):
    url = f"{src}/a.tfrecord"
    p = write_ids(url, 0, 20)
    patch(url, offsets(p)[3] + 12 + 5, flip)
    m = build_manifest([url], cache_dir=cache_dir)          # framing is intact: indexing succeeds
    with feeder(m) as f, pytest.raises(DataError) as e:
        drain(f)
    assert str(e.value) == (
        f"{build_url(url)}: record 3 at byte offset {offsets(p)[3]}: corrupted data (data CRC mismatch)")
    assert (e.value.path, e.value.record, e.value.offset) == (build_url(url), 3, offsets(p)[3])


def test_corrupted_data_crc_skip_loses_nothing_else(src, cache_dir, no_thread_leak):
    url = f"{src}/a.tfrecord"
    p = write_ids(url, 0, 20)
    patch(url, offsets(p)[3] + 12 + 5, flip)
    m = build_manifest([url], cache_dir=cache_dir)
    with feeder(m, on_corrupt="skip") as f:
        batches = drain(f)
        assert len(batches) == f.steps(0) == 4
        rids = [int(r) for b in batches for r in b["rid"]]
        assert f.skipped == 1 and f.stats()["skipped"] == 1
        assert "record 3 at byte offset" in f.stats()["skipped_examples"][0]
    assert set(rids) == set(range(20)) - {3}          # everything else arrived
    assert len(rids) == 20 and rids.count(rids[0]) == 2  # the shortfall is made up from the start of the share


def test_zero_length_file_is_skipped_with_a_warning(mem, cache_dir):
    write_ids(f"{mem}/a.tfrecord", 0, 5)
    fsspec.filesystem("memory").pipe_file(f"{mem}/b.tfrecord".removeprefix("memory://"), b"")
    m = build_manifest([f"{mem}/*.tfrecord"], cache_dir=cache_dir)
    assert [f.records for f in m.files] == [5]
    assert m.warnings == (f"{build_url(mem + '/b.tfrecord')}: empty file (0 bytes), skipped",)


def test_only_zero_length_files(mem, cache_dir):
    fsspec.filesystem("memory").pipe_file(f"{mem}/b.tfrecord".removeprefix("memory://"), b"")
    with pytest.raises(NoDataError) as e:
        build_manifest([f"{mem}/*.tfrecord"], cache_dir=cache_dir)
    assert str(e.value) == f"{mem}/*.tfrecord: no records (every matched file is empty)"


def test_not_a_tfrecord_file(local, cache_dir):
    path = local.removeprefix("file://") + "/notes.txt"
    open(path, "w").write("this is a CSV file, not TFRecords\n1,2,3\n")
    with pytest.raises(DataError) as e:
        build_manifest([f"{local}/notes.txt"], cache_dir=cache_dir)
    assert str(e.value) == (f"file://{path}: not a TFRecord file (the first record header, at byte offset 0, fails "
                            f"its length CRC check)")


def test_tiny_non_tfrecord_file(local, cache_dir):
    path = local.removeprefix("file://") + "/tiny"
    open(path, "wb").write(b"hello")
    with pytest.raises(DataError) as e:
        build_manifest([f"{local}/tiny"], cache_dir=cache_dir)
    assert str(e.value) == f"file://{path}: not a TFRecord file (5 bytes, shorter than one record header)"


def test_glob_matching_nothing(mem, local):
    with pytest.raises(NoDataError) as e:
        build_manifest([f"{local}/nothing-*.tfrecord"])
    assert str(e.value) == f"{local}/nothing-*.tfrecord: the glob matches no file"
    assert e.value.exit_code == 2
    with pytest.raises(NoDataError) as e:
        build_manifest([f"{mem}/missing.tfrecord"])
    assert str(e.value) == f"{mem}/missing.tfrecord: no such file"


def write_with(url, n, bad_at, bad_payload):
    payloads = [bad_payload if i == bad_at else example(i) for i in range(n)]
    with TFRecordWriter(url) as w:
        for q in payloads:
            w.write(q)
    return payloads


BAD = {
    "missing": (encode_example({"rid": [7]}, {"rid": "int64"}), "x", "feature 'x' is missing"),
    "dtype": (encode_example({"rid": [7], "x": [1, 2]}, {"rid": "int64", "x": "int64"}), "x",
              "feature 'x' has the wrong dtype: int64_list, expected float_list (dtype float32)"),
    "shape": (encode_example({"rid": [7], "x": [1.0, 2.0, 3.0]}, {"rid": "int64", "x": "float"}), "x",
              "feature 'x' has the wrong shape: 3 values, expected 2 (shape (2,))"),
    "not-example": (b"\xff\xff\xff", None, "not a serialized tf.train.Example (truncated varint)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_example_fails_naming_record_and_feature(src, cache_dir, case):
    payload, feature, what = BAD[case]
    url = f"{src}/a.tfrecord"
    p = write_with(url, 20, 7, payload)
    m = build_manifest([url], cache_dir=cache_dir)
    with feeder(m) as f, pytest.raises(DataError) as e:
        drain(f)
    assert str(e.value) == f"{build_url(url)}: record 7 at byte offset {offsets(p)[7]}: {what}"
    assert e.value.feature == feature and e.value.record == 7


def test_bad_example_skip(src, cache_dir, no_thread_leak):
    url = f"{src}/a.tfrecord"
    write_with(url, 20, 7, BAD["missing"][0])
    m = build_manifest([url], cache_dir=cache_dir)
    with feeder(m, on_corrupt="skip") as f:
        rids = [int(r) for b in drain(f) for r in b["rid"]]
        assert f.skipped == 1
        assert f.skipped_errors[0].feature == "x"
    assert len(rids) == 20 and set(rids) == set(range(20)) - {7}


# --------------------------------------------------------------- damaged framing with on_corrupt="skip": resync

def test_corrupted_length_crc_skip_resyncs_and_loses_only_that_record(src, cache_dir, no_thread_leak):
    url = f"{src}/a.tfrecord"
    p = write_ids(url, 0, 20)
    patch(url, offsets(p)[2] + 9, flip)
    m = build_manifest([url], cache_dir=cache_dir, on_corrupt="skip")
    full = build_url(url)
    assert m.files[0].records == 19
    assert m.warnings == (f"{full}: bytes {offsets(p)[2]}..{offsets(p)[3]} skipped (damaged framing; reading resumed "
                          f"at the next valid record) (on_corrupt: skip)",)
    with feeder(m, batch=19, on_corrupt="skip") as f:
        rids = [int(r) for b in drain(f) for r in b["rid"]]
    assert sorted(rids) == sorted(set(range(20)) - {2})


def test_truncated_file_skip_keeps_every_complete_record(src, cache_dir):
    url = f"{src}/a.tfrecord"
    p = write_ids(url, 0, 12)
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(path, fs.cat_file(path)[:-3])
    m = build_manifest([url], cache_dir=cache_dir, on_corrupt="skip")
    assert m.files[0].records == 11
    end = offsets(p)[11] + len(p[11]) + 16 - 3
    assert m.warnings == (f"{build_url(url)}: bytes {offsets(p)[11]}..{end} skipped (to the end of the file: a "
                          f"truncated or damaged last record) (on_corrupt: skip)",)
    with feeder(m, batch=11, on_corrupt="skip") as f:
        assert sorted(int(r) for b in drain(f) for r in b["rid"]) == list(range(11))


@pytest.mark.parametrize("workers", [1, 3])
def test_garbage_inside_a_file_is_jumped_over_by_every_range(src, cache_dir, workers):
    url = f"{src}/a.tfrecord"
    p = write_ids(url, 0, 60)
    junk = bytes(range(256)) * 2
    patch(url, offsets(p)[25], lambda data, pos: data.__setitem__(slice(pos, pos), junk))   # insert 512 bytes
    with pytest.raises(DataError, match="record 25 at byte offset"):
        build_manifest([url], cache_dir=cache_dir, stride=4)
    m = build_manifest([url], cache_dir=cache_dir, stride=4, on_corrupt="skip")
    assert m.files[0].records == 60 and m.files[0].holes == ((offsets(p)[25], offsets(p)[25] + 512),)
    got = []
    for rank in range(workers):
        with Feeder(m, ID_SCHEMA, 4, rank, workers, parser=python_parser, timeout=30) as f:
            got += [int(r) for b in f.epoch(0) for r in b["rid"]]
    dropped = 60 - (60 // (4 * workers)) * 4 * workers
    assert len(got) == len(set(got)) == 60 - dropped


def test_cached_lenient_index_does_not_hide_damage_from_fail_mode(mem, cache_dir):
    url = f"{mem}/a.tfrecord"
    p = write_ids(url, 0, 8)
    patch(url, offsets(p)[2] + 9, flip)
    build_manifest([url], cache_dir=cache_dir, on_corrupt="skip")          # caches an index with a hole
    with pytest.raises(DataError, match="corrupted record header"):
        build_manifest([url], cache_dir=cache_dir)


# ------------------------------------------------- records rejected by the parser with on_corrupt="skip": replacement

def _slow_parser(seed):
    """The pure-Python parser, pausing at random (seeded) between calls: the parser's rejections then reach the
    reader at different moments in each run — before or after it has emitted everything it needed."""
    import random
    import time as _time
    rng = random.Random(seed)

    def factory(fields):
        parse = python_parser(fields)

        def run(payloads):
            _time.sleep(rng.choice((0.0, 0.0, 0.002, 0.02)))
            return parse(payloads)
        return run
    return factory


def _write_with_bad(url, n, bad):
    with TFRecordWriter(url) as w:
        for i in range(n):
            w.write(BAD["missing"][0] if i in bad else example(i))


@pytest.mark.parametrize("shuffle", [0, 16])
def test_skipped_records_are_replaced_by_continuing_the_share_whatever_the_timing(src, cache_dir, no_thread_leak,
                                                                                   shuffle):
    """Records rejected by the parser are made up by reading the share again from its start, continuing where the
    last replacement stopped: a replacement is never emitted twice (it was, when a later rejection restarted the
    re-read), and the epoch is the same in every run and on resume, however late each rejection arrives."""
    from collections import Counter
    url = f"{src}/a.tfrecord"
    bad = {1, 47, 120, 190}                 # record 1 is bad again when the share is re-read to replace the others
    _write_with_bad(url, 200, bad)
    m = build_manifest([url], cache_dir=cache_dir)
    runs = []
    for seed in range(6):
        with Feeder(m, ID_SCHEMA, 10, 0, 1, on_corrupt="skip", parse_group=30, parser=_slow_parser(seed),
                    shuffle_buffer=shuffle, timeout=30) as f:
            batches = drain(f)
            assert f.skipped >= 4
        runs.append([int(r) for b in batches for r in b["rid"]])
    assert all(run == runs[0] for run in runs), [run[190:] for run in runs]
    good = [i for i in range(200) if i not in bad]
    if not shuffle:                         # 196 good ones, then 4 replacements from the share's start, skipping 1
        assert runs[0] == good + [0, 2, 3, 4]
    counts = Counter(runs[0])
    assert len(runs[0]) == 200 and set(counts) == set(good) and sum(c - 1 for c in counts.values()) == 4
    assert max(counts.values()) == 2        # the replacements are 4 distinct records
    with Feeder(m, ID_SCHEMA, 10, 0, 1, on_corrupt="skip", parse_group=30, parser=_slow_parser(9),
                shuffle_buffer=shuffle, timeout=30) as f:
        tail = [int(r) for b in f.epoch(0, start_step=17) for r in b["rid"]]
    assert tail == runs[0][170:]


def test_a_share_where_no_record_fits_the_schema_fails_naming_the_first_instead_of_looping(src, cache_dir):
    url = f"{src}/a.tfrecord"
    _write_with_bad(url, 40, set(range(40)))
    m = build_manifest([url], cache_dir=cache_dir)
    with feeder(m, batch=10, on_corrupt="skip", parse_group=10) as f, pytest.raises(DataError) as e:
        drain(f)
    assert str(e.value).startswith("worker 0, epoch 0: no record of this worker's share fits the schema (")
    assert "record 0 at byte offset 0: feature 'x' is missing" in str(e.value) and e.value.record == 0


# ------------------------------------------------------------------- data.compression contradicting the file's bytes

def _put(url, data):
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path.rpartition("/")[0], exist_ok=True)
    fs.pipe_file(path, data)
    return fs.unstrip_protocol(path)


@pytest.mark.parametrize("where", ["local", "mem"])
def test_compression_gzip_on_an_uncompressed_file_names_the_file(where, request, cache_dir):
    """Was ``BadGzipFile: Not a gzipped file (b';\\x00')`` with no file named (a raw traceback from ``data index``)."""
    root = request.getfixturevalue(where)
    full = _put(f"{root}/d/part-0", b"".join(encode_record(example(i)) for i in range(3)))
    for url in (f"{root}/d", f"{root}/d/part-0"):
        with pytest.raises(DataError) as e:
            build_manifest(url, compression="gzip", cache_dir=cache_dir)
        assert str(e.value) == (f"{full}: not gzip-compressed (it does not start with the gzip magic bytes 1f 8b) "
                                f"although data.compression is gzip")
        assert e.value.path == full and e.value.exit_code == 1
    assert build_manifest(f"{root}/d", compression="none", cache_dir=cache_dir).total_records == 3


@pytest.mark.parametrize("where", ["local", "mem"])
def test_compression_none_on_a_gzip_file_says_to_set_gzip(where, request, cache_dir):
    root = request.getfixturevalue(where)
    full = _put(f"{root}/d/part-0", gzip.compress(b"".join(encode_record(example(i)) for i in range(3))))
    with pytest.raises(DataError) as e:
        build_manifest(f"{root}/d/*", compression="none", cache_dir=cache_dir)
    assert str(e.value) == (f"{full}: looks gzip-compressed (it starts with the gzip magic bytes 1f 8b) but "
                            f"data.compression is none: set data.compression: gzip")
    for compression in ("gzip", "auto"):
        assert build_manifest(f"{root}/d/*", compression=compression, cache_dir=cache_dir).total_records == 3


def test_an_uncompressed_record_starting_with_the_gzip_magic_is_not_mistaken_for_gzip(mem, cache_dir):
    """A first record of 35,615 (0x8b1f) bytes: its length header starts with 1f 8b; its CRC says it is a record."""
    data = encode_record(b"x" * 0x8B1F) + encode_record(b"y")
    assert data[:2] == b"\x1f\x8b"
    _put(f"{mem}/big", data)
    assert build_manifest(f"{mem}/big", compression="none", cache_dir=cache_dir).total_records == 2


def test_a_gz_name_on_an_uncompressed_file_and_a_truncated_gzip_file(local, cache_dir):
    full = _put(f"{local}/a.tfrecord.gz", encode_record(example(0)))
    with pytest.raises(DataError, match=r"^file://.*/a\.tfrecord\.gz: not gzip-compressed \(.*\) although its name "
                                        r"ends in \.gz \(data\.compression: auto\); set data\.compression: none"):
        build_manifest(full, cache_dir=cache_dir)
    assert build_manifest(full, compression="none", cache_dir=cache_dir).total_records == 1
    cut = _put(f"{local}/cut.tfrecord.gz", gzip.compress(encode_record(example(0)) * 50)[:-12])
    with pytest.raises(DataError) as e:
        build_manifest(cut, cache_dir=cache_dir)
    assert str(e.value).startswith(f"{cut}: cannot decompress (gzip): EOFError: ") and e.value.path == cut


def test_first_record_checks_compression_as_indexing_does(local):
    """``tfrecord.first_record``: what preflight's sampling should use (it opened gzip itself and swallowed
    ``BadGzipFile``, so the job passed preflight and died indexing)."""
    from tfyarn.data.tfrecord import first_record
    plain = encode_record(example(7)) * 2
    with open(_put(f"{local}/p", plain).removeprefix("file://"), "rb") as f:
        with pytest.raises(DataError, match=r"^P: not gzip-compressed .* although data\.compression is gzip"):
            first_record(f, "P", "gzip")
        f.seek(0)
        assert first_record(f, "P", "auto") == example(7)
    with open(_put(f"{local}/z", gzip.compress(plain)).removeprefix("file://"), "rb") as f:
        with pytest.raises(DataError, match="looks gzip-compressed"):
            first_record(f, "Z", "none")
        f.seek(0)
        assert first_record(f, "Z", "gzip") == example(7)


def test_preflight_reports_a_wrong_compression(local):
    from tfyarn.gateway.preflight import check_data_schema
    full = _put(f"{local}/d/part-0", encode_record(example(0)))
    assert check_data_schema(job_spec([f"{local}/d"], ID_SCHEMA, compression="gzip")) == [
        f"data.train[0]: {full}: not gzip-compressed (it does not start with the gzip magic bytes 1f 8b) although "
        f"data.compression is gzip"]
