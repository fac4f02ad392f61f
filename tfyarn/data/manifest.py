"""The manifest: what every worker must agree on before it can plan an epoch without talking to anyone.

Per file its index (:class:`FileInfo`, made by the file's record source, :mod:`tfyarn.data.sources`): URL, size,
mtime, record count, and where a reader may start (TFRecord: the byte offset of every ``stride``-th record, so a worker
starts reading record ``k`` by seeking to ``offsets[k // stride]``; offsets are thinned beyond :data:`MAX_OFFSETS`,
~20 KB of manifest per file at most; for GZIP files they are positions in the decompressed stream, which cannot seek.
A table: the first row of each row group / stripe).

Built from a listing (:mod:`listing`) and the indexes, cached or made (:mod:`index_cache`); the whole manifest is
cached too (``manifests/<digest of the listing>.json``), so a job's second run reads one file, not one per data file.
"""

from __future__ import annotations

import json
import logging
import statistics
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from tfyarn.data import segments, sources
from tfyarn.data.fileindex import DEFAULT_STRIDE, INDEX_VERSION, MAX_OFFSETS, STATS, FileInfo, describe_hole, fileinfo
from tfyarn.data.index_cache import cached_or_indexed, manifest_entry, read_json, segment_store, write_text
from tfyarn.data.listing import Listing, list_data
from tfyarn.errors import WaitTimeout

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_STRIDE",
    "MAX_OFFSETS",
    "FileInfo",
    "Manifest",
    "assemble",
    "build_manifest",
    "describe_hole",
    "index_files",
    "load_manifest",
    "report_warnings",
    "section_manifest",
    "store_manifest",
    "summarize",
]


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


def report_warnings(warnings: Iterable[str], loud: bool) -> None:
    """Log a manifest's warnings: as warnings when ``loud``, else at debug level (every training task builds the
    same manifest, and one of them saying so is enough)."""
    for w in warnings:
        log.log(logging.WARNING if loud else logging.DEBUG, "%s", w)


def load_manifest(cache_dir: str | None, digest: str) -> Manifest | None:
    """The cached whole manifest of a listing, or None (missing, unreadable or of another version)."""
    doc = read_json(manifest_entry(cache_dir, digest))
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
    use_cache: bool = True,
    parallel: int = 8,
    timeout: float = 3600.0,
    **opts: Any,
) -> dict[int, FileInfo]:
    """The indexes of ``listing.files[i]`` for ``i`` in ``which``, in parallel: cached ones, else read (and cached)
    by each file's source. ``opts``: each file's, as :func:`cached_or_indexed` takes them (``format``, ``stride``,
    ``on_corrupt``; ``read=False``: only the cached ones, a cheap probe). Bounded by ``timeout`` (the error names
    files not done)."""
    ids = list(which)
    if not ids:
        return {}
    shared = (
        [segment_store(cache_dir)] if use_cache and any(segments.segmented(listing.files[i][0]) for i in ids) else []
    )
    for store in shared:  # new indexes: one segment at the end (not one file each)
        store.refresh()
        with store.lock:
            store.batches += 1

    def one(i: int) -> FileInfo | None:
        url, size, mtime = listing.files[i]
        named = url in listing.named
        return cached_or_indexed(
            url, size, mtime, compression, cache_dir, use_cache=use_cache, listed=not named, **opts
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
    finally:
        for store in shared:
            with store.lock:
                store.batches -= 1
            store.flush()
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
    m = Manifest(files, tuple(warnings))
    log.info("manifest: %d files, %d records, %d bytes", len(files), m.total_records, m.total_bytes)
    return m


def build_manifest(
    urls: list[str] | str,
    compression: str = "auto",
    cache_dir: str | None = None,
    *,
    format: str = "auto",
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

    ``format``: ``data.format`` (a source's name, or ``auto``: each file's by its name, :func:`sources.for_file`);
    ``compression``: TFRecord's (``data.compression``). A framing error (not TFRecord, truncated, bad length CRC)
    fails the build unless ``on_corrupt="skip"`` (the spec's ``data.on_corrupt``): then the damaged bytes become a
    hole that readers jump over, listed in ``Manifest.warnings`` (logged as warnings if ``log_warnings``, else at
    debug level). ``timeout`` bounds the whole
    build. ``whole``: also use and fill the whole-manifest cache
    (one read instead of one per file when nothing changed), as a job's tasks and ``tfyarn data index`` do.
    """
    if on_corrupt not in ("fail", "skip"):
        raise ValueError(f"on_corrupt must be 'fail' or 'skip', not {on_corrupt!r}")
    listing = list_data(urls)
    digest = listing.digest(stride, sources.cache_option(format, compression), on_corrupt)
    if whole and use_cache:
        hit = load_manifest(cache_dir, digest)
        if hit is not None:
            STATS.add(cache_hits=len(hit.files))
            log.debug(
                "%d files: the whole manifest from the cache (%s)", len(hit.files), manifest_entry(cache_dir, digest)
            )
            report_warnings(hit.warnings, log_warnings)
            return hit
    every = range(len(listing.files))
    opts: dict[str, Any] = dict(format=format, stride=stride, on_corrupt=on_corrupt, use_cache=use_cache)
    got = index_files(listing, every, compression, cache_dir, parallel=parallel, timeout=timeout, **opts)
    manifest = assemble(listing, (got[i] for i in every), log_warnings)
    if whole and use_cache:
        store_manifest(cache_dir, digest, manifest)
    return manifest


def section_manifest(urls: Iterable[str], section: Any, cache_dir: str | None) -> Manifest:
    """The manifest of ``urls`` read as a spec section says (``data:`` or ``predict:``: its ``format``,
    ``compression`` and ``on_corrupt``), through the whole-manifest cache: every task of a job builds the same one,
    so all but the first read one file."""
    return build_manifest(
        list(urls), section.compression, cache_dir, format=section.format, on_corrupt=section.on_corrupt, whole=True
    )


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
    lines += [f"warning: {w}" for w in manifest.warnings]
    return "\n".join(lines)
