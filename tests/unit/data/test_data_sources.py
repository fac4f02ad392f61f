"""Every record source runs the abstract suite (:mod:`source_suite`): TFRecord (plain and GZIP), Parquet, ORC; and
the registry itself (format by name or extension, one format per data set, cached indexes keep their keys)."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from source_suite import AbstractSourceTests, rows
from tfyarn.data import sources
from tfyarn.data.errors import NoDataError
from tfyarn.data.example import encode_example
from tfyarn.data.fileindex import FileInfo
from tfyarn.data.tfrecord import encode_record


def _examples(first: int, n: int) -> list[bytes]:
    r = rows(first, n)
    return [encode_example({"uid": [u], "label": [lab], "hist": h}, {"uid": "int64", "label": "float", "hist": "int64"})
            for u, lab, h in zip(r["uid"], r["label"], r["hist"])]


class TestTFRecord(AbstractSourceTests):
    fmt = "tfrecord"
    gz = False

    def _put(self, path: str, records: list[bytes]) -> None:
        raw = b"".join(records)
        with open(path, "wb") as f:
            f.write(gzip.compress(raw) if self.gz else raw)

    def write(self, path, first, n):
        self._put(path, [encode_record(p) for p in _examples(first, n)])

    def damage(self, path, first, n, bad):
        recs = [encode_record(p) for p in _examples(first, n)]
        rec = bytearray(recs[bad])
        rec[14] ^= 0xFF                                # a payload byte: the record's data CRC no longer matches
        recs[bad] = bytes(rec)
        self._put(path, recs)


class TestTFRecordGzip(TestTFRecord):
    gz = True
    compression = "gzip"

    def name(self, k):
        return f"part-{k:03d}.tfrecord.gz"


pa = pytest.importorskip("pyarrow")


def _arrow(first: int, n: int, null_at: int | None = None):
    r = rows(first, n)
    uid = pa.array(r["uid"], pa.int64(), mask=(np.arange(n) == null_at) if null_at is not None else None)
    return pa.table({"uid": uid, "label": pa.array(r["label"], pa.float32()),
                     "hist": pa.array(r["hist"], pa.list_(pa.int64()))})


class TestParquet(AbstractSourceTests):
    fmt = "parquet"

    def write(self, path, first, n, null_at=None):
        import pyarrow.parquet as pq
        pq.write_table(_arrow(first, n, null_at), path, row_group_size=256)

    def damage(self, path, first, n, bad):
        self.write(path, first, n, null_at=bad)        # a null where the feature has no default


class TestOrc(AbstractSourceTests):
    fmt = "orc"

    def write(self, path, first, n, null_at=None):
        import pyarrow.orc as orc
        orc.write_table(_arrow(first, n, null_at), path, stripe_size=4096)

    def damage(self, path, first, n, bad):
        self.write(path, first, n, null_at=bad)


# ----------------------------------------------------------------------------------------------------- the registry

def test_every_source_is_registered_once_by_its_name():
    assert set(sources.SOURCES) == {"tfrecord", "parquet", "orc"}
    assert all(sources.get(n).name == n for n in sources.SOURCES)
    with pytest.raises(ValueError, match="already registered"):
        sources.register(sources.get("orc"))
    with pytest.raises(ValueError, match="unknown data format 'avro'"):
        sources.get("avro")


def test_format_by_name_then_extension_then_tfrecord():
    assert sources.for_file("hdfs://nn/t/part-0.snappy.parquet").name == "parquet"
    assert sources.for_file("x/A.ORC").name == "orc" and sources.for_file("x/a.parq.gz").name == "parquet"
    assert sources.for_file("x/000000_0").name == "tfrecord" and sources.for_file("x/a.parquet", "orc").name == "orc"


def test_one_format_per_data_set():
    def fi(fmt):
        return FileInfo(f"x.{fmt}", 1, "", 1, False, 0, (), format=fmt)
    assert sources.of_files([fi("orc"), fi("orc")]).name == "orc" and sources.of_files([]).name == "tfrecord"
    with pytest.raises(NoDataError, match=r"mixes file formats \(orc, tfrecord\)"):
        sources.of_files([fi("orc"), fi("tfrecord")])


def test_cache_option_keeps_the_keys_of_indexes_cached_before_the_registry():
    # before: the cache key's option was data.compression, or data.format when it named a table format
    assert sources.cache_option("auto", "gzip") == "gzip" and sources.cache_option("tfrecord", "auto") == "auto"
    assert sources.cache_option("parquet", "auto") == "parquet" and sources.cache_option("orc", "gzip") == "orc"
