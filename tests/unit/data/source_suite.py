"""The abstract test suite every record source runs (fsspec's ``fsspec/tests/abstract/`` is the model: the tests are
written once against fixtures, and each source's class in ``test_data_sources.py`` supplies only how to write its
files and how to damage one record).

Every source must give, through the one feeder: its record counts from the index (and a second build reads no data:
the index cache), any row range of a file as written, the same rows for the same plan (two feeders, one rank), a
disjoint share per worker with the same steps on every worker, exactly the rows of the plan's ranges, resume mid-epoch
equal to the uninterrupted epoch, a damaged record failing the epoch naming its file (``on_corrupt: fail``) or skipped,
counted and replaced (``skip``: still exactly the planned steps), a truncated file refused naming it, and its files
read under a declared ``data.format`` whatever their name.
"""
from __future__ import annotations

import numpy as np
import pytest

from tfyarn.data import Feeder, build_manifest, plan, sources
from tfyarn.data.errors import DataError
from tfyarn.data.fileindex import STATS
from tfyarn.data.parse import schema

FEATURES = {"uid": {"dtype": "int64"}, "label": {"dtype": "float32"}, "hist": {"dtype": "int64", "shape": [None]}}
SIZES = (700, 130, 1_450, 64, 905)      # skewed files (records), 3,249 in all
BATCH = 50


def rows(first: int, n: int) -> dict[str, list]:
    """The rows a test writes: uid first..first+n (unique over the data set), a label, a 0-4 long hist."""
    uid = np.arange(first, first + n, dtype=np.int64)
    return {"uid": uid.tolist(), "label": (uid % 7 / 7).astype(np.float32).tolist(),
            "hist": [list(range(u % 5)) for u in uid.tolist()]}


class AbstractSourceTests:
    """Subclasses set ``fmt`` (the source's name, ``data.format``) and implement :meth:`write` and :meth:`damage`."""

    fmt: str = ""
    compression: str = "auto"

    def write(self, path: str, first: int, n: int) -> None:
        """Write rows(first, n) to the local file ``path`` (the name given: the test chooses it)."""
        raise NotImplementedError

    def damage(self, path: str, first: int, n: int, bad: int) -> None:
        """Write rows(first, n) to ``path`` with row ``bad`` (0-based in the file) damaged in the way this format
        detects on read (a data CRC, a null in a column without default)."""
        raise NotImplementedError

    def name(self, k: int) -> str:
        return f"part-{k:03d}{sources.get(self.fmt).extensions[0]}"

    # ---------------------------------------------------------------------------------------------------- fixtures
    @pytest.fixture
    def data(self, tmp_path):
        """A data set of SIZES rows, uids 0..N-1 in file order: (glob, {url: (first uid, rows)})."""
        files, first = {}, 0
        for k, n in enumerate(SIZES):
            path = tmp_path / self.name(k)
            self.write(str(path), first, n)
            files[f"file://{path}"] = (first, n)
            first += n
        return f"file://{tmp_path}/part-*", files

    def manifest(self, url, **kw):
        return build_manifest(url, self.compression, format=kw.pop("format", "auto"), **kw)

    def epoch(self, m, rank, workers, epoch=0, start_step=0, **kw):
        with Feeder(m, FEATURES, BATCH, rank, workers, seed=3, **kw) as f:
            return [b["uid"].copy() for b in f.epoch(epoch, start_step)], f

    # ------------------------------------------------------------------------------------------------------- tests
    def test_index_counts_every_file(self, data, tmp_path):
        url, files = data
        m = self.manifest(url, cache_dir=str(tmp_path / "cache"))
        assert [(fi.path, fi.records) for fi in m.files] == [(u, n) for u, (_, n) in sorted(files.items())]
        assert {fi.format for fi in m.files} == {self.fmt}
        before = STATS.snapshot()
        again = self.manifest(url, cache_dir=str(tmp_path / "cache"))          # the index cache: no data read
        assert again == m and STATS.snapshot()["bytes_read"] == before["bytes_read"]

    @pytest.mark.parametrize("lo,hi", [(0, 1), (0, 1450), (63, 640), (1000, 1450), (1449, 1450), (511, 1025)])
    def test_read_range(self, data, lo, hi):
        url, files = data
        fi = next(fi for fi in self.manifest(url).files if fi.records == 1450)
        got = sources.get(self.fmt).read_range(fi, lo, hi, schema(FEATURES))
        first = files[fi.path][0]
        want = rows(first + lo, hi - lo)
        assert got["uid"].tolist() == want["uid"]
        assert np.allclose(got["label"], want["label"])
        h = got["hist"]                                 # a Ragged column: values and row splits
        assert [h.values[h.splits[i] : h.splits[i + 1]].tolist() for i in range(len(h))] == want["hist"]

    @pytest.mark.parametrize("workers", [1, 3])
    def test_same_plan_same_rows(self, data, workers):
        url, files = data
        m = self.manifest(url)
        fields = schema(FEATURES)
        src, seen = sources.get(self.fmt), []
        for epoch in (0, 1):
            p = plan(m, workers, epoch, 3, BATCH)
            for rank in range(workers):
                first, f = self.epoch(m, rank, workers, epoch)
                second, _ = self.epoch(m, rank, workers, epoch)
                assert len(first) == p.steps == f.steps(epoch)                 # every worker: the planned steps
                assert all(len(b) == BATCH for b in first)
                assert [b.tolist() for b in first] == [b.tolist() for b in second]
                want = np.concatenate([src.read_range(m.files[[fi.path for fi in m.files].index(r.path)],
                                                      r.start, r.stop, fields)["uid"] for r in p.shares[rank]])
                got = np.concatenate(first)
                assert got.tolist() == want[: len(got)].tolist()              # the plan's ranges, in order
                seen.append(set(got.tolist()))
            share = seen[-workers:]
            assert sum(map(len, share)) == len(set().union(*share))            # disjoint shares

    def test_resume_mid_epoch(self, data):
        m = self.manifest(data[0])
        whole, _ = self.epoch(m, 1, 2, epoch=1)
        resumed, _ = self.epoch(m, 1, 2, epoch=1, start_step=5)
        assert [b.tolist() for b in resumed] == [b.tolist() for b in whole[5:]]

    def test_damaged_record_fails_naming_the_file(self, data, tmp_path):
        url, files = data
        bad = f"file://{tmp_path / self.name(2)}"
        first, n = files[bad]
        self.damage(bad.removeprefix("file://"), first, n, 300)
        m = self.manifest(url, use_cache=False)
        with pytest.raises(DataError) as err:
            for rank in range(2):
                self.epoch(m, rank, 2)
        assert err.value.path == bad and bad in str(err.value)

    def test_damaged_record_skipped_counted_and_replaced(self, data, tmp_path):
        url, files = data
        bad = f"file://{tmp_path / self.name(2)}"
        first, n = files[bad]
        self.damage(bad.removeprefix("file://"), first, n, 300)
        m = self.manifest(url, use_cache=False, on_corrupt="skip")
        p = plan(m, 2, 0, 3, BATCH)
        skipped, got = 0, set()
        for rank in range(2):
            batches, f = self.epoch(m, rank, 2, on_corrupt="skip")
            assert len(batches) == p.steps and all(len(b) == BATCH for b in batches)
            skipped += f.skipped
            got |= {u for b in batches for u in b.tolist()}
        assert skipped == 1 and first + 300 not in got

    def test_truncated_file_is_refused_naming_it(self, data, tmp_path):
        url, files = data
        path = tmp_path / self.name(3)
        path.write_bytes(path.read_bytes()[:-9])
        with pytest.raises(DataError, match=str(path)):
            self.manifest(url, use_cache=False)

    def test_declared_format_reads_files_without_extension(self, tmp_path):
        self.write(str(tmp_path / "000000_0"), 0, 120)
        m = self.manifest(f"file://{tmp_path}/000000_0", format=self.fmt, use_cache=False)
        assert m.files[0].format == self.fmt and m.total_records == 120
        batches, _ = self.epoch(m, 0, 1)
        got = np.concatenate(batches).tolist()
        assert len(got) == 100 == len(set(got)) and set(got) <= set(range(120))
