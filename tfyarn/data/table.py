"""Parquet and ORC tables as training data, for their record sources (:mod:`tfyarn.data.sources.tables`): a
file's index from the footer, its columns checked against the spec's features, and its rows as the feeder's numpy
columns.

Why pyarrow over fsspec: Hive and Spark tables on HDFS are Parquet or ORC; pyarrow reads them through any fsspec file
(hdfs-native on HDFS: no JVM, no libhdfs), only the columns named in ``data.features``. pyarrow is imported lazily, in
functions, and only when a table is read or indexed: a gateway that submits a TFRecord job needs none (``pip install
tfyarn[parquet]`` where tasks run and where ``tfyarn data index`` runs on tables).

Indexing reads the footer only (row group / stripe row counts): :class:`tfyarn.data.fileindex.FileInfo` keeps the first
row of each row group / stripe in ``offsets``, so a worker's row range starts at its row group, never at the file's
start. Mapping to the feeder: a list column is a variable-length feature (a null list = an empty one, as a missing
VarLenFeature); a null in any other column is filled with the feature's ``default`` or is bad input.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Iterator

import numpy as np

from tfyarn.data.errors import DataError
from tfyarn.data.parse import _fields, _varint
from tfyarn.data.ragged import Ragged
from tfyarn.errors import ExitCode

log = logging.getLogger(__name__)

#: pyarrow decodes a batch's columns in parallel, as its own scan does (the feeder's reader thread would otherwise
#: decode them one after the other; the CPU per row is the same)
THREADS = True


class SchemaError(DataError):
    """A table's columns do not fit the features (missing, wrong type): found before any step, so INVALID."""

    exit_code = ExitCode.INVALID


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise DataError(
            "reading Parquet/ORC data needs pyarrow: pip install 'tfyarn[parquet]' (on the hosts that run tasks, "
            "and where `tfyarn data index` runs)"
        ) from None
    return pyarrow


class _Counting:
    """A read-only file wrapper counting the bytes read (the index's cost: footers only)."""

    def __init__(self, f: Any):
        self.f, self.bytes_read = f, 0

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.bytes_read += len(b)
        return b

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def open_file(url: str) -> Any:
    """An fsspec file for pyarrow: no read-ahead cache (a footer read must not pull in megabytes of data)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    try:
        return fs.open(path, "rb", cache_type="none")
    except TypeError:  # a filesystem without fsspec's cache options
        return fs.open(path, "rb")


def index_table(
    url: str, size: int, mtime: str, fmt: str
) -> tuple[int, tuple[int, ...], tuple[tuple[str, str], ...], int]:
    """(rows, first row of each row group / stripe, (column, arrow type) pairs, bytes read) from the footer."""
    pa = _pyarrow()
    with open_file(url) as raw:
        size = size or int(getattr(raw, "size", 0) or 0)
        f = _Counting(raw)
        try:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                meta = pq.read_metadata(f)
                counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
                schema = meta.schema.to_arrow_schema()
            else:
                import pyarrow.orc as orc

                of = orc.ORCFile(f)
                schema = of.schema
                counts = _orc_stripe_rows(of, url, f, size)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise DataError(
                f"{url}: not a readable {fmt} file (corrupt or truncated footer? {size} bytes): "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                path=url,
            ) from None
    starts = tuple(int(x) for x in np.concatenate([[0], np.cumsum(counts)[:-1]])) if counts else ()
    columns = tuple((field.name, str(field.type)) for field in schema)
    return int(sum(counts)), starts, columns, f.bytes_read


def _orc_footer_stripe_rows(f: Any, size: int) -> list[int] | None:
    """Rows per stripe from the ORC footer's StripeInformation (pyarrow does not expose it): the file tail is
    ``footer, postscript, 1 byte postscript length``; the footer is protobuf, in compression chunks (3-byte header:
    length << 1 | original). None when the codec is not one decoded here (then stripes are counted by reading)."""
    tail_len = min(size, 1 << 16)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    ps_len = tail[-1]
    ps = {num: val for num, _, val in _fields(tail[-1 - ps_len : -1])}
    footer_len, codec = int(ps.get(1, 0)), int(ps.get(2, 0))
    if footer_len + ps_len + 1 > tail_len:
        f.seek(size - 1 - ps_len - footer_len)
        raw = f.read(footer_len)
    else:
        raw = tail[-1 - ps_len - footer_len : -1 - ps_len]
    if codec != 0:
        out, pos = bytearray(), 0
        while pos < len(raw):
            h = raw[pos] | raw[pos + 1] << 8 | raw[pos + 2] << 16
            chunk = raw[pos + 3 : pos + 3 + (h >> 1)]
            pos += 3 + (h >> 1)
            if h & 1:
                out += chunk
            elif codec == 1:
                out += zlib.decompress(chunk, -15)
            elif codec in (2, 5):
                import pyarrow as pa

                n = _varint(chunk, 0)[0] if codec == 2 else _zstd_content_size(chunk)
                if n is None:
                    return None
                out += pa.Codec("snappy" if codec == 2 else "zstd").decompress(chunk, n, asbytes=True)
            else:
                return None
        raw = bytes(out)
    counts = []
    for num, _, stripe in _fields(raw):
        if num == 3:
            info = {n: v for n, _, v in _fields(stripe)}
            counts.append(int(info.get(5, 0)))
    return counts


def _zstd_content_size(frame: bytes) -> int | None:
    """The decompressed size a zstd frame header states (RFC 8878 3.1.1.1), or None when it states none."""
    if frame[:4] != b"\x28\xb5\x2f\xfd":
        return None
    fhd = frame[4]
    single, fcs_flag = (fhd >> 5) & 1, fhd >> 6
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        return None
    n = int.from_bytes(frame[pos : pos + width], "little")
    return n + 256 if width == 2 else n


def _orc_stripe_rows(of: Any, url: str, f: Any, size: int) -> list[int]:
    """Rows per stripe: from the footer (no data read), else by reading each stripe's first column."""
    if of.nstripes <= 1:
        return [int(of.nrows)] if of.nstripes else []
    try:
        counts = _orc_footer_stripe_rows(f, size)
    except Exception:  # noqa: BLE001 - any surprise: count by reading
        counts = None
    if counts is not None and len(counts) == of.nstripes and sum(counts) == of.nrows:
        return counts
    log.info("%s: ORC stripe rows counted by reading each stripe's first column (codec not decoded here)", url)
    first = of.schema[0].name
    counts = [int(of.read_stripe(i, columns=[first]).num_rows) for i in range(of.nstripes)]
    if sum(counts) != of.nrows:
        raise DataError(f"{url}: the ORC stripes hold {sum(counts)} rows, the footer says {of.nrows}", path=url)
    return counts


# ------------------------------------------------------------------------------------ column checks

#: the arrow column type a feature's dtype needs, as an error names it
_WANTED = {"float32": "float", "float64": "float/double", "int64": "integer", "int32": "integer"}


def _listed(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _fits(t: Any, f: Any) -> bool:
    import pyarrow as pa

    t = t.value_type if pa.types.is_dictionary(t) else t
    if bool(f.varlen or f.shape) != _listed(t):
        return False
    if _listed(t):
        t = t.value_type.value_type if pa.types.is_dictionary(t.value_type) else t.value_type
    if f.dtype in ("string", "bytes"):
        return (
            pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
        )
    return pa.types.is_floating(t) if f.dtype.startswith("float") else pa.types.is_integer(t)


def _wanted(f: Any) -> str:
    base = _WANTED.get(f.dtype, "string/binary")
    return f"list<{base}>" if f.varlen or f.shape else base


def check_columns(
    path: str, columns: tuple[tuple[str, str], ...], fields: tuple[Any, ...], arrow_schema: Any = None
) -> None:
    """Every feature is a column of a fitting type, else :class:`SchemaError` naming the column and both types."""
    types = dict(columns)
    for f in fields:
        if f.name not in types:
            raise SchemaError(
                f"{path}: no column {f.name!r} for feature {f.name!r} (columns: {', '.join(types) or 'none'})",
                path=path,
                feature=f.name,
            )
        t = arrow_schema.field(f.name).type if arrow_schema is not None else _parse_type(types[f.name])
        if t is None:
            continue
        if not _fits(t, f):
            shape = "[null]" if f.varlen else list(f.shape)
            raise SchemaError(
                f"{path}: column {f.name!r} is {types[f.name]}, but feature {f.name!r} is "
                f"{f.dtype} shape {shape} (needs an arrow {_wanted(f)} column)",
                path=path,
                feature=f.name,
            )


#: the plain arrow types a manifest's column type is parsed back into (others are not checked)
_SIMPLE_TYPES = frozenset(
    "int8 int16 int32 int64 uint8 uint16 uint32 uint64 halffloat float double string large_string binary large_binary"
    " bool".split()
)


def _parse_type(text: str) -> Any:
    """An arrow type from its string form (as stored in the manifest); None when not understood (not checked)."""
    import pyarrow as pa

    if text in _SIMPLE_TYPES:
        return pa.type_for_alias(text)
    for prefix, make in (("list<", pa.list_), ("large_list<", pa.large_list)):
        if text.startswith(prefix) and text.endswith(">") and ": " in text:
            inner = _parse_type(text[len(prefix) : -1].split(": ", 1)[1])
            return make(inner) if inner is not None else None
    if text.startswith("dictionary<values="):
        inner = _parse_type(text[len("dictionary<values=") :].split(",", 1)[0])
        return pa.dictionary(pa.int32(), inner) if inner is not None else None
    return None


# ------------------------------------------------------------------------------------------ reading


def read_rows(
    url: str, fmt: str, starts: tuple[int, ...], rows: int, lo: int, hi: int, columns: list[str], chunk: int = 8192
) -> Iterator[tuple[int, int, Any]]:
    """Rows [lo, hi) of one file as ``(row group, first row, arrow RecordBatch)``, at most ``chunk``
    rows each: only ``columns``, starting at the row group holding ``lo``. Parquet is streamed
    within a row group (memory follows ``chunk``, not the row group size); ORC is read a stripe at a
    time."""
    pa = _pyarrow()
    bounds = list(starts) + [rows]
    g = max(0, int(np.searchsorted(starts, lo, side="right")) - 1)
    with open_file(url) as f:
        try:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                pf = pq.ParquetFile(f)
                reader = None
            else:
                import pyarrow.orc as orc

                pf = orc.ORCFile(f)
            while g < len(starts) and bounds[g] < hi:
                first = bounds[g]
                if fmt == "parquet":
                    reader = pf.iter_batches(batch_size=chunk, row_groups=[g], columns=columns, use_threads=THREADS)
                else:
                    stripe = pf.read_stripe(g, columns=columns)
                    reader = (stripe.slice(i, chunk) for i in range(0, stripe.num_rows, chunk))
                for batch in reader:
                    a, b = max(lo, first), min(hi, first + batch.num_rows)
                    if a < b:
                        yield g, a, batch.slice(a - first, b - a)
                    first += batch.num_rows
                    if first >= hi:
                        return
                g += 1
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"{url}: row group {g}: cannot read rows (truncated or corrupt file?): "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                path=url,
            ) from None


# --------------------------------------------------------------------------------------- conversion


class NullRows(Exception):
    """A column holds nulls where the feature has no default: ``(column, row indexes in the
    batch)``."""

    def __init__(self, column: str, rows: np.ndarray):
        super().__init__(f"column {column!r} is null in {len(rows)} rows")
        self.column, self.rows = column, rows


def _plain(arr: Any) -> Any:
    """A contiguous array: chunks combined, dictionary columns decoded."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr


def _values(arr: Any, f: Any) -> np.ndarray:
    if f.dtype == "string":
        return np.array(arr.to_pylist(), dtype=object)
    if f.dtype == "bytes":
        return np.array([v if isinstance(v, bytes) else v.encode() for v in arr.to_pylist()], dtype=object)
    return arr.to_numpy(zero_copy_only=False).astype(f.np_dtype, copy=False)


def to_columns(batch: Any, fields: tuple[Any, ...]) -> dict[str, Any]:
    """An arrow RecordBatch/Table → the feeder's columns (numpy arrays; Ragged rows for
    variable-length features). Nulls: a null list is an empty list; another null takes the feature's
    default, else :class:`NullRows`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: dict[str, Any] = {}
    n = batch.num_rows
    for f in fields:
        arr = _plain(batch.column(f.name))
        if not _listed(arr.type):
            if arr.null_count:
                if f.default is None:
                    raise NullRows(f.name, np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False)))
                arr = arr.fill_null(pa.scalar(f.default, arr.type))
            out[f.name] = _values(arr, f).reshape((n,) + f.shape)
            continue
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        values = _plain(pc.list_flatten(arr))
        if values.null_count:
            row_of = np.repeat(np.arange(n), lengths)
            raise NullRows(f.name, np.unique(row_of[values.is_null().to_numpy(zero_copy_only=False)]))
        ragged = Ragged.from_lengths(_values(values, f), lengths)
        if f.varlen:
            out[f.name] = ragged.dense(f.pad_to, f.pad_value) if f.pad_to is not None else ragged
            continue
        bad = np.flatnonzero(lengths != f.size)
        if len(bad):
            if f.default is not None and not (lengths[bad] != 0).any():
                dense = ragged.dense(f.size, f.default)
            else:
                raise DataError(
                    f"column {f.name!r}: row {int(bad[0])} of this batch has "
                    f"{int(lengths[bad[0]])} "
                    f"values, feature {f.name!r} has shape {list(f.shape)}",
                    feature=f.name,
                )
        else:
            dense = ragged.flat().reshape(n, f.size)
        out[f.name] = dense.reshape((n,) + f.shape)
    return out
