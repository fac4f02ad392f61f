"""The manifest: what every worker must agree on before it can plan an epoch without talking to anyone.

Per file: URL, size, mtime, record count, and the byte offset of every ``stride``-th record, so a worker starts
reading record ``k`` by seeking to ``offsets[k // stride]`` (a split frames at most ``stride`` unread records).
Offsets are thinned beyond :data:`MAX_OFFSETS` (~20 KB of manifest per file at most). For GZIP files they are
positions in the decompressed stream, which cannot seek: a range starting inside a .gz file decompresses everything
before it.

Why cached: counting records reads every byte once. Data on a shared filesystem (HDFS, viewfs, object stores) has
its indexes cached as a few segment files per run in the cache dir (:mod:`segments`: one file per data file was
HDFS's small-files problem); local and ``memory://`` data has its index beside each data file
(``.<name>.tfyidx.json``, hidden from listings), else, where the data is read-only, in the cache dir (on YARN
``data.index_cache`` on the cluster's filesystem, locally :func:`tfyarn.common.paths.index_cache_dir`), keyed by path +
size + mtime + stride + compression: a rewritten file is re-indexed, never mis-split. The whole manifest is cached there
too (``manifests/<digest of the listing>.json``), so a job's second run reads one file, not one per data file.

Files are sorted: the plan depends on their order, and every worker must compute the same plan.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import fsspec
import numpy as np

from tfyarn.data import segments, table, tfrecord
from tfyarn.data.errors import DataError, NoDataError
from tfyarn.errors import WaitTimeout
from tfyarn.common import paths
from tfyarn.common.fsio import replace
from tfyarn.common.fsretry import open_read

log = logging.getLogger(__name__)

INDEX_VERSION = 2
DEFAULT_STRIDE = 1024
#: Offsets kept per file at most: beyond it the stride doubles (the manifest's size per file stays bounded).
MAX_OFFSETS = 2048


class IndexStats:
    """This process's indexing cost (data bytes read, files indexed, cached indexes used): the tasks' log line and
    the benchmark show that a second run reads 0 data bytes before its first step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("bytes_read", "files_indexed", "cache_hits", "files_created"), 0)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


STATS = IndexStats()
_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class FileInfo:
    """One TFRecord file. ``offsets[j]`` is the byte offset (decompressed, for GZIP) of record ``j * stride``."""

    path: str
    size: int
    mtime: str
    records: int
    gz: bool
    stride: int
    offsets: tuple[int, ...]
    data_bytes: int = 0  # decompressed TFRecord bytes (== size unless gz)
    holes: tuple[tuple[int, int], ...] = ()  # damaged byte ranges skipped (on_corrupt="skip"): (start, resume)
    #: "tfrecord", or a table ("parquet", "orc": ``records`` are rows, ``offsets`` the first row of each row group
    #: or stripe, ``columns`` the (name, arrow type) pairs of its schema; see :mod:`tfyarn.data.table`)
    format: str = "tfrecord"
    columns: tuple[tuple[str, str], ...] = ()

    def boundary(self, record: int) -> tuple[int, int]:
        """(byte offset, record index) of the closest indexed record boundary at or before ``record``."""
        j = min(record // self.stride, len(self.offsets) - 1) if self.offsets else 0
        return (self.offsets[j], j * self.stride) if self.offsets else (0, 0)


@dataclass(frozen=True)
class Manifest:
    files: tuple[FileInfo, ...]
    warnings: tuple[str, ...] = ()

    @property
    def total_records(self) -> int:
        return sum(f.records for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_doc(self) -> dict[str, Any]:
        return {"files": [asdict(f) for f in self.files], "warnings": list(self.warnings)}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> "Manifest":
        return cls(tuple(fileinfo(f) for f in doc["files"]), tuple(doc.get("warnings", ())))

    def to_json(self) -> str:
        return json.dumps({"version": INDEX_VERSION, **self.to_doc()})

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        return cls.from_doc(json.loads(text))

    @classmethod
    def from_counts(cls, counts: Iterable[tuple[str, int]]) -> "Manifest":
        """A manifest from (path, records) pairs — for planning tests and what-if tools; it cannot be read from."""
        return cls(tuple(FileInfo(p, 0, "", n, False, DEFAULT_STRIDE, ()) for p, n in sorted(counts)))


def fileinfo(doc: dict[str, Any]) -> FileInfo:
    """A :class:`FileInfo` from its JSON form (``asdict``)."""
    return FileInfo(
        **{
            **doc,
            "offsets": tuple(doc["offsets"]),
            "holes": tuple(tuple(h) for h in doc.get("holes", ())),
            "columns": tuple(tuple(c) for c in doc.get("columns", ())),
        }
    )


def report_warnings(warnings: Iterable[str], loud: bool) -> None:
    """Log a manifest's warnings: as warnings when ``loud``, else at debug level (every training task builds the
    same manifest, and one of them saying so is enough)."""
    for w in warnings:
        log.log(logging.WARNING if loud else logging.DEBUG, "%s", w)


# ------------------------------------------------------------------------------------------------------- file listing


def mtime_of(info: dict[str, Any]) -> str:
    """The modification time as a stable string (filesystems differ in key and type; some return a datetime from
    one call and a float from another, which would otherwise look like a changed file and defeat the cache)."""
    for key in ("mtime", "modification_time", "last_modified", "LastModified", "updated", "created", "ctime"):
        v = info.get(key)
        if v is None:
            continue
        if hasattr(v, "timestamp"):
            v = v.timestamp()
        try:
            return repr(float(v))
        except (TypeError, ValueError):
            return str(v)
    return ""


def hidden(rel: str) -> bool:
    """Whether a listed path is not data: any part of ``rel`` (the path below what the user named) starts with
    ``.`` or ``_``, or its name ends with ``.crc``.

    Hadoop's FileInputFormat rule (``_SUCCESS``, ``_temporary/``, ``.crc``; also ``*.crc`` checksums that tools
    write unhidden), which also hides our own cached indexes (``.<name>.tfyidx.json``) from a later listing. Every
    listing of data applies it through :func:`data_files`.
    """
    parts = [part for part in rel.split("/") if part]
    return any(part.startswith(("_", ".")) for part in parts) or bool(parts and parts[-1].endswith(".crc"))


def side_file_hint(url: str, error: Exception) -> str:
    """What to add to ``error`` about a file a directory or glob listed: how to leave it out, when the error says the
    file is not TFRecord at all. Empty otherwise, and for a name that says TFRecord (that is a damaged data file,
    not a side file)."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if "not a TFRecord file" not in str(error) or "tfrecord" in name.lower():
        return ""
    return (
        f" — {name!r} was listed as data: directories and globs leave out names starting with '_' or '.' and "
        f"*.crc (as Hadoop does); name only the data files (a glob such as DIR/part-*), or move or rename it"
    )


def _glob_root(pattern: str) -> str:
    """The directory part of a glob before its first wildcard: what the user spelled out, never filtered."""
    first = min(pattern.index(c) for c in _GLOB_CHARS if c in pattern)
    return pattern[:first].rpartition("/")[0]


def data_files(fs: Any, path: str) -> dict[str, dict[str, Any]]:
    """The data files ``path`` names on ``fs`` (a glob, a directory, or a file): ``{fs path: fsspec info}``, empty
    when none (callers word that their way). Only what a listing or a wildcard found is filtered by :func:`hidden`;
    a file named explicitly is data whatever its name. One round trip per directory on HDFS (``detail=True``).
    """
    if _GLOB_CHARS & set(path):
        listing, root = fs.glob(path, detail=True), _glob_root(path)
    else:
        try:
            info = fs.info(path)
        except FileNotFoundError:
            return {}
        if info.get("type") != "directory":
            return {path: info} if info.get("type") == "file" else {}
        listing, root = fs.find(path, detail=True), path.rstrip("/")
    found = {}
    for p, info in listing.items():
        rel = p[len(root) + 1 :] if root and p.startswith(root + "/") else p.rstrip("/").rsplit("/", 1)[-1]
        if info.get("type") == "file" and not hidden(rel):
            found[p] = info
    return found


_ONLY_HIDDEN = "matches no data file (only directories or hidden files)"


def _why_no_data(fs: Any, path: str) -> str:
    """Why :func:`data_files` found nothing (asked only then, so the common case costs no extra round trip)."""
    if _GLOB_CHARS & set(path):
        return "the glob matches no file" if not fs.glob(path) else _ONLY_HIDDEN
    if not fs.exists(path):
        return "no such file"
    return "the directory is empty" if fs.isdir(path) and not fs.find(path) else _ONLY_HIDDEN


# ------------------------------------------------------------------------------------------------------------- caching


def _beside(url: str) -> str:
    head, _, name = url.rpartition("/")
    return f"{head}/.{name}.tfyidx.json"


def cache_entry(url: str, size: int, mtime: str, stride: int, compression: str, cache_dir: str | None) -> str:
    """Where the cache dir keeps ``url``'s index: one flat name per (path, size, mtime, stride, compression)."""
    key = _cache_key(url, size, mtime, stride, compression)
    return f"{(cache_dir or paths.index_cache_dir()).rstrip('/')}/{key}.json"


def read_text(url: str) -> str | None:
    """A small file's text, or None when it is missing or unreadable (a cache miss, never an error)."""
    try:
        with fsspec.open(url, "rt") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def write_text(url: str, text: str) -> None:
    """Write-then-rename (readers never see half a file; a concurrent writer of the same content may win)."""
    fs, path = fsspec.core.url_to_fs(url)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    parent = path.rsplit("/", 1)[0]
    if parent and not fs.exists(parent):
        fs.makedirs(parent, exist_ok=True)
    try:
        with fs.open(tmp, "wt") as f:
            f.write(text)
        replace(fs, tmp, path)
        STATS.add(files_created=1)
    except BaseException:
        try:
            fs.rm(tmp)
        except Exception:  # noqa: BLE001 - the tmp file may not exist; the original error matters
            pass
        raise


def _segments(cache_dir: str | None) -> segments.SegmentStore:
    return segments.store_for(cache_dir or paths.index_cache_dir(), write_text, read_text)


def _cache_key(url: str, size: int, mtime: str, stride: int, compression: str) -> str:
    return hashlib.sha1(f"{url}|{size}|{mtime}|{stride}|{compression}".encode()).hexdigest()


def _load_cached(
    url: str, size: int, mtime: str, stride: int, compression: str, cache_dir: str | None, on_corrupt: str = "fail"
) -> FileInfo | None:
    if segments.segmented(url):
        docs = [_segments(cache_dir).get(_cache_key(url, size, mtime, stride, compression))]
    else:
        docs = []
        for loc in (_beside(url), cache_entry(url, size, mtime, stride, compression, cache_dir)):
            text = read_text(loc)
            try:
                docs.append(json.loads(text) if text else None)
            except ValueError:
                docs.append(None)
    for doc in docs:
        doc = dict(doc) if isinstance(doc, dict) else None
        if (
            isinstance(doc, dict)
            and doc.get("version") == INDEX_VERSION
            and doc.get("path") == url
            and doc.get("size") == size
            and doc.get("mtime") == mtime
            and doc.get("asked_stride") == stride
            and doc.get("compression") == compression
        ):
            for k in ("version", "compression", "asked_stride"):
                doc.pop(k)
            fi = fileinfo(doc)
            if fi.holes and on_corrupt != "skip":
                return None  # indexed leniently before; now damage must fail: re-index to raise
            return fi
    return None


#: Directories found not writable in this process: the next file's index goes straight to the cache dir (on a
#: read-only HDFS data set, one refused write per directory instead of one per file).
_UNWRITABLE: set[str] = set()


def _store(info: FileInfo, compression: str, cache_dir: str | None, stride: int) -> None:
    doc = {"version": INDEX_VERSION, "compression": compression, "asked_stride": stride, **asdict(info)}
    if segments.segmented(info.path):  # a shared filesystem: into this run's segment (few files per run)
        _segments(cache_dir).add(_cache_key(info.path, info.size, info.mtime, stride, compression), doc)
        return
    text = json.dumps(doc)
    beside = _beside(info.path)
    folder = beside.rsplit("/", 1)[0]
    if folder not in _UNWRITABLE:
        try:  # write-then-rename: concurrent workers indexing the same file never read a half-written index
            write_text(beside, text)
            return
        except Exception as exc:  # noqa: BLE001 - any failure to write beside the data means "use the cache dir"
            _UNWRITABLE.add(folder)
            log.debug("cannot write index beside %s (%s); using the cache dir", info.path, exc)
    entry = cache_entry(info.path, info.size, info.mtime, stride, compression, cache_dir)
    try:
        write_text(entry, text)
    except Exception as exc:  # noqa: BLE001 - an unwritable cache costs the next run a re-index, nothing more
        log.warning(
            "cannot cache the index of %s in %s (%s); it will be rebuilt next time",
            info.path,
            entry.rsplit("/", 1)[0],
            exc,
        )


# ------------------------------------------------------------------------------------------------------------ indexing


def index_file(
    url: str,
    size: int,
    mtime: str,
    compression: str = "auto",
    stride: int = DEFAULT_STRIDE,
    block_bytes: int = tfrecord.DEFAULT_BLOCK,
    on_corrupt: str = "fail",
) -> FileInfo:
    """Read one file once: count records, note every ``stride``-th boundary, check every length CRC (framing). Data
    CRCs are checked when records are read for training, not here: indexing must stay I/O bound.

    ``on_corrupt="skip"``: damaged framing becomes a *hole*, the bytes from the damage to the next valid record
    (:func:`tfrecord.find_resync`) or to the end of the file. Otherwise damage raises with the file, offset and record.

    A Parquet / ORC file (by extension, or ``compression`` = ``parquet`` / ``orc`` from ``data.format``,
    :func:`table.read_option`) is indexed from its footer alone (:func:`table.index_table`).
    """
    fmt = table.file_format(url, compression if compression in table.TABLE_FORMATS else "auto")
    if fmt in table.TABLE_FORMATS:
        rows, starts, columns, nbytes = table.index_table(url, size, mtime, fmt)
        STATS.add(bytes_read=nbytes)
        return FileInfo(url, size, mtime, rows, False, 0, starts, size, (), fmt, columns)
    with open_read(url) as raw:
        head = raw.read(tfrecord.HEADER)
    STATS.add(bytes_read=len(head))
    gz = tfrecord.detect_gzip(url, compression, head)  # a wrong data.compression fails here, naming the file
    offsets: list[int] = []
    holes: list[tuple[int, int]] = []
    rec = base = pos = 0  # records counted; file offset of buf[0]; position in buf
    buf, eof = b"", False
    skip = on_corrupt == "skip"
    with tfrecord.open_records(url, gz) as f:
        while True:
            if not eof:
                block = f.read(block_bytes)
                STATS.add(bytes_read=len(block))  # decompressed bytes for gz: what was processed
                if block:
                    base += pos
                    buf = buf[pos:] + block if pos < len(buf) else block
                    pos = 0
                else:
                    eof = True
            fr = tfrecord.scan(buf, pos, 1 << 62)
            bad_at = None
            if len(fr.offsets):
                offs = fr.offsets
                bad = tfrecord.check_headers(np.frombuffer(buf, dtype=np.uint8), offs)
                if bad >= 0:
                    bad_at, offs = int(offs[bad]), offs[:bad]
                first = (-rec) % stride
                offsets.extend((offs[first::stride] + base).tolist())
                rec += len(offs)
                while len(offsets) > MAX_OFFSETS:  # bounded size per file: keep every other one
                    offsets, stride = offsets[::2], stride * 2
                pos = fr.end if bad_at is None else bad_at
            if bad_at is None and len(buf) - pos >= tfrecord.HEADER and not tfrecord.header_ok(buf, pos):
                bad_at = pos  # a bad length: do not buffer to EOF
            if bad_at is not None:
                if not skip:
                    tfrecord._raise_bad_header(url, base + bad_at, rec)
                resync = tfrecord.find_resync(buf, bad_at + 1)
                if resync is None and not eof:
                    pos = bad_at
                    continue  # look further (the buffer grows until found)
                end = resync if resync is not None else len(buf)
                holes.append((base + bad_at, base + end))
                log.debug(
                    "%s: bytes %d..%d skipped (damaged record header at record %d); %s",
                    url,
                    base + bad_at,
                    base + end,
                    rec,
                    "resumed at the next valid record" if resync is not None else "no valid record after it",
                )
                pos = end
                continue
            if eof:
                if pos < len(buf):
                    if not skip:
                        tfrecord._raise_incomplete(url, buf, pos, base, rec)
                    holes.append((base + pos, base + len(buf)))
                    log.debug("%s: bytes %d..%d skipped (truncated last record)", url, base + pos, base + len(buf))
                    pos = len(buf)
                break
    return FileInfo(url, size, mtime, rec, gz, stride, tuple(offsets), base + pos, tuple(holes))


def cached_or_indexed(
    url: str,
    size: int,
    mtime: str,
    compression: str = "auto",
    cache_dir: str | None = None,
    *,
    stride: int = DEFAULT_STRIDE,
    use_cache: bool = True,
    on_corrupt: str = "fail",
    listed: bool = False,
    read: bool = True,
) -> FileInfo | None:
    """One file's index: the cached one when it still fits the file, else read now (and cached for the next reader).

    ``listed``: found by a listing or a glob, so an error about a file that is not TFRecord says how to leave such a
    side file out (:func:`side_file_hint`). ``read=False``: only a cached index, else None (a cheap check)."""
    if use_cache:
        hit = _load_cached(url, size, mtime, stride, compression, cache_dir, on_corrupt)
        if hit is not None:
            STATS.add(cache_hits=1)
            log.debug("%s: %d records (cached index)", url, hit.records)
            return hit
    if not read:
        return None
    t0 = time.monotonic()
    try:
        fi = index_file(url, size, mtime, compression, stride, on_corrupt=on_corrupt)
    except DataError as exc:
        hint = side_file_hint(url, exc) if listed else ""
        if not hint:
            raise
        raise type(exc)(
            f"{exc}{hint}", path=exc.path, offset=exc.offset, record=exc.record, feature=exc.feature
        ) from None
    STATS.add(files_indexed=1)
    log.debug("%s: %d records (indexed in %.2fs)", url, fi.records, time.monotonic() - t0)
    if use_cache:
        _store(fi, compression, cache_dir, stride)
    return fi


def describe_hole(fi: FileInfo, start: int, end: int) -> str:
    """Where a damaged byte range of ``fi`` is, for people: the file, the offsets, and whether it ran to the end."""
    what = (
        "to the end of the file: a truncated or damaged last record"
        if end >= fi.data_bytes
        else "damaged framing; reading resumed at the next valid record"
    )
    return f"{fi.path}: bytes {start}..{end} skipped ({what})"


@dataclass(frozen=True)
class Listing:
    """What the data URLs name now: the non-empty data files as (URL, size, mtime), sorted, and what the listing
    found to warn about (empty files). Every task lists for itself; :meth:`digest` says whether two are the same."""

    files: tuple[tuple[str, int, str], ...]
    warnings: tuple[str, ...]
    named: frozenset[str]

    def digest(self, stride: int, compression: str, on_corrupt: str) -> str:
        """Key of the manifest this listing gives with these options (the whole-manifest cache's name)."""
        h = hashlib.sha256(f"{INDEX_VERSION}|{stride}|{compression}|{on_corrupt}|{MAX_OFFSETS}".encode())
        for url, size, mtime in self.files:
            h.update(f"\n{url}|{size}|{mtime}".encode())
        return h.hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.files)


def list_data(urls: list[str] | str) -> Listing:
    """The data files ``urls`` (fsspec URLs, globs, directories) name, by :func:`data_files`: sorted, duplicates
    removed, zero-length files left out with a warning (Hadoop jobs write empty part files); if nothing is left the
    error says so. ``Listing.named``: the files named without a wildcard (data whatever their name)."""
    if isinstance(urls, str):
        urls = [urls]
    found: dict[str, dict[str, Any]] = {}
    named = set()
    for url in urls:
        fs, path = fsspec.core.url_to_fs(url)
        files = data_files(fs, path)
        if not files:
            raise NoDataError(f"{url}: {_why_no_data(fs, path)}")
        found.update((fs.unstrip_protocol(p), info) for p, info in files.items())
        if not _GLOB_CHARS & set(url):
            named.add(fs.unstrip_protocol(path))
    warnings: list[str] = []
    todo = []
    for url, info in sorted(found.items()):
        size = int(info.get("size") or 0)
        if size == 0:
            warnings.append(f"{url}: empty file (0 bytes), skipped")
            continue
        todo.append((url, size, mtime_of(info)))
    if not todo:
        raise NoDataError(f"{', '.join(urls)}: no records (every matched file is empty)")
    return Listing(tuple(todo), tuple(warnings), frozenset(named))


def manifest_entry(cache_dir: str | None, digest: str) -> str:
    """Where the cache dir keeps the whole manifest of a listing (:meth:`Listing.digest`)."""
    return f"{(cache_dir or paths.index_cache_dir()).rstrip('/')}/manifests/{digest}.json"


def load_manifest(cache_dir: str | None, digest: str) -> Manifest | None:
    """The cached whole manifest of a listing, or None (missing, unreadable or of another version)."""
    text = read_text(manifest_entry(cache_dir, digest))
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION or doc.get("digest") != digest:
        return None
    return Manifest.from_doc(doc)


def store_manifest(cache_dir: str | None, digest: str, manifest: Manifest) -> str | None:
    """Cache the whole manifest of a listing; its URL, or None when the cache dir is not writable (logged)."""
    url = manifest_entry(cache_dir, digest)
    text = json.dumps({"version": INDEX_VERSION, "digest": digest, **manifest.to_doc()}, separators=(",", ":"))
    try:
        write_text(url, text)
        return url
    except Exception as exc:  # noqa: BLE001 - an unwritable cache costs the next run one manifest build
        log.warning("cannot cache the manifest in %s (%s); the next run rebuilds it", url.rsplit("/", 2)[0], exc)
        return None


def index_files(
    listing: Listing,
    which: Iterable[int],
    compression: str = "auto",
    cache_dir: str | None = None,
    *,
    stride: int = DEFAULT_STRIDE,
    parallel: int = 8,
    use_cache: bool = True,
    on_corrupt: str = "fail",
    timeout: float = 3600.0,
    read: bool = True,
) -> dict[int, FileInfo]:
    """The indexes of ``listing.files[i]`` for ``i`` in ``which``, in parallel: cached ones, else read (and cached).
    ``read=False``: only the cached ones (a cheap probe). Bounded by ``timeout`` (the error names files not done)."""
    ids = list(which)
    if not ids:
        return {}
    shared = [_segments(cache_dir)] if use_cache and any(segments.segmented(listing.files[i][0]) for i in ids) else []
    for store in shared:  # new indexes: one segment at the end (not one file each)
        store.refresh()
        with store.lock:
            store.batches += 1
    try:
        return _index_files(
            listing, ids, compression, cache_dir, stride, parallel, use_cache, on_corrupt, timeout, read
        )
    finally:
        for store in shared:
            with store.lock:
                store.batches -= 1
            store.flush()


def _index_files(
    listing: Listing,
    ids: list[int],
    compression: str,
    cache_dir: str | None,
    stride: int,
    parallel: int,
    use_cache: bool,
    on_corrupt: str,
    timeout: float,
    read: bool,
) -> dict[int, FileInfo]:
    def one(i: int) -> FileInfo | None:
        url, size, mtime = listing.files[i]
        return cached_or_indexed(
            url,
            size,
            mtime,
            compression,
            cache_dir,
            stride=stride,
            use_cache=use_cache,
            on_corrupt=on_corrupt,
            listed=url not in listing.named,
            read=read,
        )

    ex = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(ids))), thread_name_prefix="tfyarn-index")
    try:
        futures = [ex.submit(one, i) for i in ids]
        done, pending = wait(futures, timeout=timeout, return_when=FIRST_EXCEPTION)
        for fut in done:
            fut.result()  # raises the first failure
        if pending:
            late = [listing.files[i][0] for i, fut in zip(ids, futures) if fut in pending]
            raise WaitTimeout(
                f"indexing {len(ids)} files: {len(late)} not finished within {timeout:g}s "
                f"(e.g. {', '.join(late[:3])}); index them once with `tfyarn data index` or raise "
                f"the timeout"
            )
        out = {i: fut.result() for i, fut in zip(ids, futures)}
    except BaseException:
        ex.shutdown(wait=False, cancel_futures=True)  # do not wait for a hung read: the error says what hung
        raise
    ex.shutdown(wait=True)  # all done: the threads exit at once, none is left behind
    return {i: fi for i, fi in out.items() if fi is not None}


def assemble(listing: Listing, files: Iterable[FileInfo], loud: bool = True) -> Manifest:
    """The manifest of ``listing`` from its files' indexes (in listing order), with every warning (empty files,
    damaged ranges skipped, files without records), logged by :func:`report_warnings`."""
    files = tuple(files)
    warnings = list(listing.warnings)
    for fi in files:
        for a, b in fi.holes:
            warnings.append(f"{describe_hole(fi, a, b)} (on_corrupt: skip)")
        if fi.records == 0:
            warnings.append(f"{fi.path}: no records")
    report_warnings(warnings, loud)
    log.info(
        "manifest: %d files, %d records, %d bytes",
        len(files),
        sum(f.records for f in files),
        sum(f.size for f in files),
    )
    return Manifest(files, tuple(warnings))


def build_manifest(
    urls: list[str] | str,
    compression: str = "auto",
    cache_dir: str | None = None,
    *,
    stride: int = DEFAULT_STRIDE,
    parallel: int = 8,
    use_cache: bool = True,
    on_corrupt: str = "fail",
    timeout: float = 3600.0,
    log_warnings: bool = True,
    whole: bool = False,
) -> Manifest:
    """Expand ``urls`` (fsspec URLs, globs, directories, as :func:`list_data`) and index every file, in parallel,
    using cached indexes.

    A framing error (not TFRecord, truncated, bad length CRC) fails the build unless ``on_corrupt="skip"`` (the spec's
    ``data.on_corrupt``): then the damaged bytes become a hole that readers jump over, listed in
    ``Manifest.warnings`` (logged as warnings if ``log_warnings``, else at debug level). ``timeout`` bounds the whole
    build. ``whole``: also use and fill the whole-manifest cache
    (one read instead of one per file when nothing changed), as a job's tasks and ``tfyarn data index`` do.
    """
    if on_corrupt not in ("fail", "skip"):
        raise ValueError(f"on_corrupt must be 'fail' or 'skip', not {on_corrupt!r}")
    listing = list_data(urls)
    digest = listing.digest(stride, compression, on_corrupt)
    if whole and use_cache:
        hit = load_manifest(cache_dir, digest)
        if hit is not None:
            STATS.add(cache_hits=len(hit.files))
            log.debug(
                "%d files: the whole manifest from the cache (%s)", len(hit.files), manifest_entry(cache_dir, digest)
            )
            report_warnings(hit.warnings, log_warnings)
            return hit
    got = index_files(
        listing,
        range(len(listing.files)),
        compression,
        cache_dir,
        stride=stride,
        parallel=parallel,
        use_cache=use_cache,
        on_corrupt=on_corrupt,
        timeout=timeout,
    )
    manifest = assemble(listing, (got[i] for i in range(len(listing.files))), log_warnings)
    if whole and use_cache:
        store_manifest(cache_dir, digest, manifest)
    return manifest


def summarize(manifest: Manifest) -> str:
    """Human-readable summary for ``tfyarn data index GLOB``: totals, per-file spread (skew), warnings."""
    files = manifest.files
    counts = [f.records for f in files]
    lines = [
        f"{len(files)} files, {manifest.total_records:,} records, {manifest.total_bytes:,} bytes"
        f"{' (' + str(sum(f.gz for f in files)) + ' gzip)' if any(f.gz for f in files) else ''}"
    ]
    if counts:
        lo, hi = min(counts), max(counts)
        skew = f"{hi / lo:.1f}x" if lo else "inf (a file has no records)"
        lines.append(
            f"records per file: min {lo:,}  median {statistics.median(counts):,.0f}  max {hi:,}  (max/min {skew})"
        )
    shown = files if len(files) <= 20 else files[:10] + files[-10:]
    width = max((len(f.path) for f in shown), default=4)
    lines.append(f"{'file':<{width}}  {'records':>12}  {'bytes':>14}")
    for i, f in enumerate(shown):
        if len(files) > 20 and i == 10:
            lines.append(f"... {len(files) - 20} more files ...")
        lines.append(f"{f.path:<{width}}  {f.records:>12,}  {f.size:>14,}")
    for w in manifest.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
