"""A scoring run's output dir: parts committed exactly once, each with its record, and ``_SUCCESS`` last.

Layout (names starting with ``_`` are hidden to Hadoop, Spark, Hive and pyarrow's dataset readers)::

    <output>/part-00000.parquet        one per planned part, in input order (or .tfrecord)
    <output>/_tfyarn/parts/00000.json  its record: rows in, rows out, rows skipped (and where), bytes
    <output>/_tfyarn/tmp/...           parts and records being written (removed when the run is complete)
    <output>/_SUCCESS                  JSON totals, written once every part has its record

A part is written under a temporary name and renamed into place when complete (:func:`tfyarn.common.fsio.replace`: one
atomic rename on HDFS), then its record the same way. A part without a record is unfinished: a retried task
writes it again from the start (a rename over a part whose record was lost rewrites identical rows), so at the end
every planned part exists once and rows out = rows in - rows skipped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from typing import Any, Callable

import numpy as np

from tfyarn.common.fsio import replace
from tfyarn.data.example import encode_example
from tfyarn.data.tfrecord import encode_record
from tfyarn.predict.reader import to_arrow

log = logging.getLogger("tfyarn.predict.output")

SUCCESS = "_SUCCESS"
RECORDS = "_tfyarn/parts"
TMP = "_tfyarn/tmp"


class OutputDir:
    """The output dir on any fsspec filesystem."""

    def __init__(self, url: str, fmt: str = "parquet"):
        import fsspec

        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.root = root.rstrip("/")
        self.fmt = fmt
        self.ext = "parquet" if fmt == "parquet" else "tfrecord"

    def part_path(self, index: int) -> str:
        return f"{self.root}/part-{index:05d}.{self.ext}"

    def record_path(self, index: int) -> str:
        return f"{self.root}/{RECORDS}/{index:05d}.json"

    def tmp_path(self, name: str) -> str:
        return f"{self.root}/{TMP}/{name}.{uuid.uuid4().hex[:12]}"

    def committed(self) -> dict[int, dict[str, Any]]:
        """The records of the committed parts, by part index."""
        base = f"{self.root}/{RECORDS}"
        if not self.fs.exists(base):
            return {}
        out = {}
        for path in self.fs.ls(base, detail=False):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                with self.fs.open(path, "rb") as f:
                    out[int(name[:-5])] = json.loads(f.read())
        return out

    def put_json(self, path: str, doc: dict[str, Any], tmp_dir: str = TMP) -> None:
        tmp = f"{self.root}/{tmp_dir}/{path.rsplit('/', 1)[-1]}.{uuid.uuid4().hex[:12]}"
        self.fs.makedirs(tmp.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(tmp, "wb") as f:
            f.write(json.dumps(doc, indent=1).encode())
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        replace(self.fs, tmp, path)

    def finish(self, planned: int, summary: dict[str, Any]) -> dict[str, Any] | None:
        """When every one of the ``planned`` parts has its record: the totals written as ``_SUCCESS`` (the same from
        whichever task sees the last record; a store that orders writes, as HDFS's NameNode does, lets at least one
        of two tasks finishing together see both) and returned; else None."""
        records = self.committed()
        if len(records) < planned:
            return None
        recs = [records[i] for i in range(planned)]
        doc = dict(summary) | {
            "rows_in": sum(r["rows_in"] for r in recs),
            "rows_out": sum(r["rows_out"] for r in recs),
            "skipped": sum(r["skipped"] for r in recs),
            "skipped_at": [s for r in recs for s in r.get("skipped_at", [])][:10],
            "parts": planned,
            "bytes": sum(r["bytes"] for r in recs),
            "output": self.url,
            "format": self.fmt,
        }
        self.put_json(f"{self.root}/{SUCCESS}", doc, tmp_dir="_tfyarn")  # not in TMP, which a peer may remove now
        with contextlib.suppress(OSError):  # another finisher removed it first
            self.fs.rm(f"{self.root}/{TMP}", recursive=True)
        return doc


def check_output(url: str, overwrite: bool, get_fs: Callable[[str], tuple[Any, str]] | None = None) -> str | None:
    """Before a run: a problem when ``url`` holds anything and ``overwrite`` is off; with ``overwrite`` it is
    removed. None when the run may write there. ``get_fs``: url → (fsspec filesystem, path) (the gateway's login)."""
    import fsspec

    fs, root = (get_fs or fsspec.core.url_to_fs)(url)
    if not fs.exists(root):
        return None
    if not fs.isdir(root):
        return f"predict.output: {url} is a file, not a dir"
    if not fs.ls(root, detail=False):
        return None
    if not overwrite:
        done = "a complete run (_SUCCESS)" if fs.exists(f"{root.rstrip('/')}/{SUCCESS}") else "files"
        return f"predict.output: {url} already holds {done}; pass --overwrite to replace it"
    fs.rm(root, recursive=True)
    return None


def put_unless(q: queue.Queue, item: tuple, stopped: Callable[[], bool]) -> bool:
    """Put ``item`` on the bounded queue ``q``, waiting while it is full unless ``stopped()``; whether it was put."""
    while not stopped():
        try:
            q.put(item, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False


class PartWriter:
    """The background thread that writes and commits parts: ``("rows", index, kept, predictions)`` and
    ``("end", index, stats, rows_out, seconds)`` are queued in order; ``on_commit(record)`` is called after each
    part's commit."""

    def __init__(self, out: OutputDir, worker: int, on_commit: Callable[[dict[str, Any]], None], depth: int = 8):
        self.out, self.worker, self.on_commit = out, worker, on_commit
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="tfyarn-predict-writer", daemon=True)
        self.thread.start()

    def put(self, item: tuple) -> None:
        if not put_unless(self.q, item, lambda: self.error is not None):
            raise RuntimeError(f"the output writer failed: {type(self.error).__name__}: {self.error}")

    def close(self, timeout: float = 600.0) -> None:
        self.put(("stop",))
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"the output writer did not finish within {timeout:g}s")
        if self.error is not None:
            raise RuntimeError(f"the output writer failed: {type(self.error).__name__}: {self.error}")

    def _run(self) -> None:
        open_part: Any = None
        try:
            while True:
                item = self.q.get()
                if item[0] == "stop":
                    return
                if item[0] == "rows":
                    _, index, kept, predictions = item
                    table = assemble(kept, predictions)
                    if open_part is None:
                        open_part = _OpenPart(self.out, index)
                    open_part.write(table)
                else:
                    _, index, stats, rows_out, seconds = item
                    if open_part is None:  # a part whose rows were all skipped: an empty part all the same
                        open_part = _OpenPart(self.out, index)
                    nbytes = open_part.commit()
                    open_part = None
                    record = {
                        "part": index,
                        "worker": self.worker,
                        "rows_in": stats.rows_in,
                        "rows_out": rows_out,
                        "skipped": stats.skipped,
                        "skipped_at": stats.skipped_at,
                        "bytes": nbytes,
                        "seconds": round(seconds, 3),
                        "time": time.time(),
                    }
                    self.out.put_json(self.out.record_path(index), record)
                    self.on_commit(record)
        except BaseException as exc:
            log.exception("output writer failed")
            self.error = exc
        finally:
            if open_part is not None:
                open_part.abandon()


def assemble(kept: Any, predictions: dict[str, Any]) -> Any:
    """The output rows: the kept columns, then the model's outputs (a name in both is an error)."""
    import pyarrow as pa

    cols = dict(zip(kept.column_names, kept.columns)) if kept is not None else {}
    for name, values in predictions.items():
        if name in cols:
            raise ValueError(f"the model's output {name!r} is also a kept input column: drop it from predict.keep")
        cols[name] = to_arrow(values)
    return pa.table(cols)


class _OpenPart:
    """One part being written under its temporary name."""

    def __init__(self, out: OutputDir, index: int):
        self.out, self.index = out, index
        self.final = out.part_path(index)
        self.tmp = out.tmp_path(self.final.rsplit("/", 1)[-1])
        out.fs.makedirs(self.tmp.rsplit("/", 1)[0], exist_ok=True)
        self.f = out.fs.open(self.tmp, "wb")
        self.writer: Any = None
        self.schema: Any = None

    def write(self, table: Any) -> None:
        if self.out.fmt == "parquet":
            import pyarrow.parquet as pq

            if self.writer is None:
                self.schema = table.schema
                self.writer = pq.ParquetWriter(self.f, table.schema)
            self.writer.write_table(table.cast(self.schema) if table.schema != self.schema else table)
            return

        cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
        buf = bytearray()
        for i in range(table.num_rows):
            buf += encode_record(encode_example({k: _value(v[i]) for k, v in cols.items()}))
        self.f.write(bytes(buf))

    def commit(self) -> int:
        if self.out.fmt == "parquet" and self.writer is None:  # no rows: a valid empty file all the same
            import pyarrow as pa
            import pyarrow.parquet as pq

            self.writer = pq.ParquetWriter(self.f, pa.schema([]))
        if self.writer is not None:
            self.writer.close()
        self.f.close()
        nbytes = int(self.out.fs.info(self.tmp)["size"])
        replace(self.out.fs, self.tmp, self.final)
        return nbytes

    def abandon(self) -> None:
        with contextlib.suppress(Exception):  # a temporary file left behind is removed with the run's tmp dir
            if self.writer is not None:
                self.writer.close()
            self.f.close()
            self.out.fs.rm(self.tmp)


def _value(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, (list, tuple)):
        return np.asarray(v)
    return [v] if isinstance(v, (bytes, str)) else np.asarray([v])
