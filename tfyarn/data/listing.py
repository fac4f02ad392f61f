"""What data URLs name: the data files of globs, directories and files (Hadoop's rule for side files), sorted, with
size and mtime — the input of every manifest, and what preflight and ``write_synthetic`` list.

Files are sorted: the plan depends on their order, and every worker must compute the same plan.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import fsspec

from tfyarn.data.errors import NoDataError
from tfyarn.data.fileindex import INDEX_VERSION, MAX_OFFSETS

_GLOB_CHARS = set("*?[")


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


@dataclass(frozen=True)
class Listing:
    """What the data URLs name now: the non-empty data files as (URL, size, mtime), sorted, and what the listing
    found to warn about (empty files). Every task lists for itself; :meth:`digest` says whether two are the same."""

    files: tuple[tuple[str, int, str], ...]
    warnings: tuple[str, ...]
    named: frozenset[str]

    def digest(self, stride: int, option: str, on_corrupt: str) -> str:
        """Key of the manifest this listing gives with these options (the whole-manifest cache's name; ``option``:
        :func:`tfyarn.data.sources.cache_option` of the data's format and compression)."""
        h = hashlib.sha256(f"{INDEX_VERSION}|{stride}|{option}|{on_corrupt}|{MAX_OFFSETS}".encode())
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
