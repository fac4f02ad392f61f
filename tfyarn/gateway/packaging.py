"""Ship the job's Python environment to YARN once, then reuse it: content-hashed archives in an HDFS staging dir.

The archive's name is a hash of what is installed (distributions + versions, the interpreter, the platform, the files
of editable installs; tfyarn excluded: appspec ships its source apart), so an unchanged environment maps to the same
``<staging>/envs/<hash>.tar.gz``: a re-submit uploads 0 bytes, and as the URL and its timestamp do not change, the
NodeManagers localize it from their ``PRIVATE`` cache instead of downloading and unpacking it again.

Sources (``spec.environment``): ``archive:`` (prebuilt, used as is), ``python:`` (an interpreter on every node), or
``pack:`` ``auto`` | ``conda`` | ``venv`` (conda-pack / venv-pack of the gateway's env; ``none``: ``python3`` from the
node's PATH). A venv does not contain its interpreter: the nodes need the same base Python at the same path.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import os
import platform
import re
import sys
import time
import uuid
from contextlib import nullcontext, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from tfyarn.cluster import hdfs
from tfyarn.common import paths
from tfyarn.errors import TfyarnError
from tfyarn.gateway.pgzip import ParallelGzipWriter

log = logging.getLogger(__name__)

#: ``progress(stage, done, total)``; stage is one of hash | pack | upload | cached | done. total may be None.
Progress = Callable[[str, int, "int | None"], None]

#: Where YARN unpacks the environment archive inside each container (``./env/bin/python``).
ENV_DIR = "env"
#: Distributions (normalized names) never part of the env hash: tfyarn is shipped separately.
EXCLUDED_DISTS = frozenset({"tfyarn"})
#: Directories never hashed in editable source trees (caches, VCS data, nested environments, build output).
SKIP_DIRS = frozenset(
    ".git .hg .svn __pycache__ .venv venv env .tox .nox node_modules build dist .mypy_cache .pytest_cache "
    ".ruff_cache .ipynb_checkpoints".split()
)
SKIP_SUFFIXES = (".pyc", ".pyo", ".egg-info")
HASH_FORMAT = 1


class PackagingError(TfyarnError):
    """The environment cannot be packed or uploaded; the message says what to change."""


@dataclass(frozen=True)
class EnvRef:
    """What the container script needs to find Python (``python``: the command *inside the container*), and what
    ``ensure_env`` did to get there."""

    source: str  # pack | archive | python | none
    python: str
    archive_url: str | None = None  # localized by YARN as ./env (pack, archive)
    env_hash: str | None = None  # pack only
    kind: str | None = None  # venv | conda (pack only)
    uploaded_bytes: int = 0
    cached: bool = False  # the staging dir already had this archive

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------- hashing


def detect_env_kind(prefix: str | os.PathLike | None = None) -> str:
    """``conda`` when ``prefix`` is a conda env (``conda-meta/``), ``venv`` when it has ``pyvenv.cfg``."""
    p = Path(prefix or sys.prefix)
    if (p / "conda-meta").is_dir():
        return "conda"
    if (p / "pyvenv.cfg").is_file():
        return "venv"
    raise PackagingError(
        f"{p} is neither a conda environment nor a virtualenv: run tfyarn from one, or set "
        f"environment.archive (a prebuilt tar.gz) or environment.python (a python on every node)"
    )


def site_packages(prefix: str | os.PathLike) -> list[Path]:
    globs = ("lib/python3*/site-packages", "Lib/site-packages")
    return [d for g in globs for d in sorted(Path(prefix).glob(g)) if d.is_dir()]


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    editable_path: str | None = None


def installed_distributions(prefix: str | os.PathLike | None = None) -> list[Distribution]:
    """Every distribution installed in ``prefix`` (default: this interpreter's env), sorted by normalized name."""

    seen: dict[str, Distribution] = {}
    for dist in md.distributions(path=[str(p) for p in site_packages(prefix or sys.prefix)]):
        name = dist.metadata["Name"]
        if not name:
            continue
        editable = None
        with suppress(ValueError):  # an unreadable direct_url.json: not an editable install
            du = json.loads(dist.read_text("direct_url.json") or "{}")
            if du.get("dir_info", {}).get("editable") and du.get("url", "").startswith("file://"):
                editable = du["url"][len("file://") :]
        key = re.sub(r"[-_.]+", "-", name).lower()  # the normalized name (PEP 503)
        seen.setdefault(key, Distribution(key, dist.version or "", editable))
    return [seen[k] for k in sorted(seen)]


def hash_tree(root: str | os.PathLike, max_files: int = 50_000) -> str:
    """sha256 over (relative path, content) of every file under ``root``, skipping caches and nested envs. Content,
    not mtimes: a ``git checkout`` that restores the same bytes must not invalidate the cache."""
    root = Path(root)
    h = hashlib.sha256()
    n = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and not d.endswith(SKIP_SUFFIXES) and not d.startswith(".")
        )
        for fn in sorted(filenames):
            if fn.endswith(SKIP_SUFFIXES):
                continue
            fp = Path(dirpath) / fn
            if not fp.is_file():
                continue
            n += 1
            if n > max_files:
                raise PackagingError(
                    f"editable source {root} has more than {max_files} files; "
                    f"install it non-editable or move data out of it"
                )
            h.update(fp.relative_to(root).as_posix().encode() + b"\0")
            with open(fp, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def _python_tag(prefix: Path, kind: str) -> str:
    if kind == "venv":
        lines = (prefix / "pyvenv.cfg").read_text().splitlines()
        cfg = {k.strip().lower(): v.strip() for k, _, v in (ln.partition("=") for ln in lines if "=" in ln)}
        return f"venv home={cfg.get('home', '?')} version={cfg.get('version') or cfg.get('version_info', '?')}"
    libs = sorted(p.name for p in prefix.glob("lib/python3*") if p.is_dir())
    return f"conda {','.join(libs)}"


@dataclass(frozen=True)
class Fingerprint:
    env_hash: str
    kind: str
    document: dict[str, Any] = field(repr=False)


def env_fingerprint(
    prefix: str | os.PathLike | None = None, kind: str | None = None, installed: list[Distribution] | None = None
) -> Fingerprint:
    """The content hash naming the packed archive of ``prefix`` (stable across runs; changes with what matters).
    ``installed``: its :func:`installed_distributions`, when the caller has them already."""
    p = Path(prefix or sys.prefix).resolve()
    kind = kind or detect_env_kind(p)
    dists, local = [], {}
    for d in installed if installed is not None else installed_distributions(p):
        if d.name in EXCLUDED_DISTS:
            continue
        dists.append([d.name, d.version])
        if d.editable_path and Path(d.editable_path).is_dir():
            local[d.name] = hash_tree(d.editable_path)
    doc = {
        "format": HASH_FORMAT,
        "kind": kind,
        "python": _python_tag(p, kind),
        "platform": f"{sys.platform}-{platform.machine()}",
        "distributions": dists,
        "editable": local,
    }
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return Fingerprint(digest, kind, doc)


# ------------------------------------------------------------------------------------------------------------ packing


def pack_level() -> int:
    """gzip level of packed envs (``TFYARN_PACK_LEVEL``, default 1): level 4 made a TF venv's archive ~10% smaller
    for ~1.7x the CPU time, and that CPU time was most of a cold submit on a small gateway. 0: a plain ``.tar``
    (no compression CPU at all; ~3.5x the bytes to upload and localize, which the NodeManagers untar without gzip)."""
    try:
        return min(9, max(0, int(os.environ.get("TFYARN_PACK_LEVEL", "1"))))
    except ValueError:
        return 1


def archive_suffix() -> str:
    """The packed env's extension, which tells YARN how to unpack it."""
    return ".tar" if pack_level() == 0 else ".tar.gz"


def _pack_venv(venv_pack: Any, prefix: str | os.PathLike, tmp: Path, gzipped: bool) -> None:
    """venv-pack's tar, gzipped on every core (:class:`tfyarn.gateway.pgzip.ParallelGzipWriter`) or plain, straight into
    ``tmp``; venv-pack itself (one thread, through a temp file in /tmp) if its internals are not the ones we know."""
    try:
        from venv_pack.core import Packer
        from venv_pack.formats import archive

        env = venv_pack.Env(str(prefix))
        files, context = env.files, env._context
    except (ImportError, AttributeError) as exc:
        log.debug("venv-pack internals unknown (%s): packing with venv_pack.pack", exc)
        venv_pack.pack(
            prefix=str(prefix),
            output=str(tmp),
            format="tar.gz" if gzipped else "tar",
            force=True,
            compress_level=pack_level(),
        )
        return

    with open(tmp, "wb") as raw:
        out = ParallelGzipWriter(raw, level=pack_level()) if gzipped else nullcontext(raw)
        with out as sink, archive(sink, "tar", compress_level=0) as arc:
            packer = Packer(context, arc, None)
            for f in files:
                packer.add(f)
            packer.finish()


def pack_env(prefix: str | os.PathLike, kind: str, output: str | os.PathLike, progress: Progress | None = None) -> Path:
    """Pack ``prefix`` into ``output`` (``.tar.gz``, or a plain tar for any other name) with conda-pack or
    venv-pack; atomic (temp file, then rename)."""
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    gzipped = out.name.endswith((".tar.gz", ".tgz"))
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.partial{'.tar.gz' if gzipped else '.tar'}")
    if progress:
        progress("pack", 0, None)
    t0 = time.monotonic()
    try:
        if kind == "conda":
            try:
                import conda_pack
            except ImportError:
                raise PackagingError("pack: conda needs conda-pack (pip install 'tfyarn[pack]')") from None
            conda_pack.pack(
                prefix=str(prefix),
                output=str(tmp),
                format="tar.gz" if gzipped else "tar",
                ignore_editable_packages=True,
                n_threads=-1,
                force=True,
                compress_level=pack_level(),
            )
        elif kind == "venv":
            try:
                import venv_pack
            except ImportError:
                raise PackagingError("pack: venv needs venv-pack (pip install 'tfyarn[pack]')") from None
            try:
                _pack_venv(venv_pack, prefix, tmp, gzipped)
            except venv_pack.VenvPackException as exc:
                raise PackagingError(
                    f"venv-pack refused {prefix}: {exc}. Put that code in the job's `code:` dir "
                    f"or install it non-editable"
                ) from None
        else:
            raise PackagingError(f"unknown environment kind {kind!r} (conda or venv)")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    size = out.stat().st_size
    log.info("packed %s env %s → %s (%.1f MB, %.1fs)", kind, prefix, out.name, size / 1e6, time.monotonic() - t0)
    if progress:
        progress("pack", size, size)
    return out


def check_not_editable(prefix: str | os.PathLike, installed: list[Distribution]) -> None:
    """Refuse to pack an env holding editable installs (``pip install -e``), tfyarn itself excepted (it ships apart):
    their code stays on the gateway (conda-pack leaves them out, venv-pack packs a path file naming a gateway
    directory), and the containers would fail with ModuleNotFoundError after the upload and the allocation."""
    editable = [d for d in installed if d.editable_path and d.name not in EXCLUDED_DISTS]
    if editable:
        names = ", ".join(f"{d.name} ({d.editable_path})" for d in editable)
        raise PackagingError(
            f"the environment to pack ({prefix}) has editable installs whose code would not be "
            f"shipped: {names}. Install them normally (`pip install <dir>`, not `-e`), move their "
            f"code to the job's `code:` directory, or uninstall them if the job does not use them"
        )


def _commit_once(fs: Any, tmp: str, path: str) -> None:
    """Rename ``tmp`` to ``path`` unless ``path`` exists. Archives are named by their content's hash, so one that is
    there already (another submit staged the same env meanwhile) is the same archive — and must stay the very file:
    YARN checks a localized resource's timestamp against the one recorded at submit, so replacing it would make the
    containers of the job that staged it first fail to start ("resource changed on src filesystem")."""
    if fs.exists(path):
        fs.rm(tmp)
        return
    try:
        fs.mv(tmp, path)  # hdfs-native refuses an existing destination: the race below
    except FileExistsError:
        fs.rm(tmp)


def upload(local: str | os.PathLike, fs: Any, path: str, progress: Progress | None = None) -> int:
    """Copy ``local`` to ``path`` on ``fs`` via a temporary name, then rename: readers never see a partial archive."""
    local = Path(local)
    total = local.stat().st_size
    parent = path.rsplit("/", 1)[0] or "/"
    fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.{path.rsplit('/', 1)[-1]}.{uuid.uuid4().hex[:8]}.partial"
    done = 0
    try:
        with open(local, "rb") as src, fs.open(tmp, "wb") as dst:
            for block in iter(lambda: src.read(8 << 20), b""):
                dst.write(block)
                done += len(block)
                if progress:
                    progress("upload", done, total)
        _commit_once(fs, tmp, path)
    except BaseException:
        with suppress(Exception):  # best effort cleanup, the original error matters
            if fs.exists(tmp):
                fs.rm(tmp)
        raise
    return done


def ensure_env(
    spec: Any,
    staging_dir: str,
    progress: Progress | None = None,
    *,
    prefix: str | None = None,
    fs: Any = None,
    local_cache: str | os.PathLike | None = None,
    dry_run: bool = False,
    conf: dict[str, str] | None = None,
) -> EnvRef:
    """Make the job's environment available to YARN (archives in ``<staging_dir>/envs/``, through ``fs``, default
    the URL's); return how the containers find their Python. ``dry_run``: name the archive (hashing only), nothing
    packed or uploaded."""
    env = spec.environment
    if env.archive:
        return EnvRef("archive", f"./{ENV_DIR}/bin/python", archive_url=env.archive)
    if env.python:
        return EnvRef("python", env.python)
    mode = getattr(env.pack, "value", env.pack)
    if mode == "none":
        return EnvRef("none", "python3")
    pfx = prefix or sys.prefix
    kind = detect_env_kind(pfx) if mode == "auto" else mode
    installed = installed_distributions(pfx)  # read once: the check and the hash both need them
    check_not_editable(pfx, installed)
    if progress:
        progress("hash", 0, None)
    fp = env_fingerprint(pfx, kind, installed=installed)

    staging = hdfs.qualify(staging_dir, conf) if conf is not None else staging_dir
    url = hdfs.join(staging, "envs", f"env-{fp.kind}-{fp.env_hash[:24]}{archive_suffix()}")
    ref = EnvRef("pack", f"./{ENV_DIR}/bin/python", archive_url=url, env_hash=fp.env_hash, kind=kind)
    if dry_run:
        return ref
    return stage_env(ref, progress, prefix=pfx, fs=fs, local_cache=local_cache, conf=conf)


def stage_env(
    ref: EnvRef,
    progress: Progress | None = None,
    *,
    prefix: str | None = None,
    fs: Any = None,
    local_cache: str | os.PathLike | None = None,
    conf: dict[str, str] | None = None,
) -> EnvRef:
    """Make the archive a dry-run ``ref`` names exist (pack ``prefix`` into the local cache, upload it); a ``ref``
    that ships no archive of ours is returned as it is. The submit of a dry-run request: what it named is staged."""
    if ref.source != "pack" or ref.archive_url is None or ref.kind is None or ref.env_hash is None:
        return ref
    url = ref.archive_url

    if fs is None:
        fs, path = hdfs.get_fs(url, conf=conf)
    else:
        path = fs._strip_protocol(url)
    if fs.exists(path):
        log.info("environment %s already staged at %s: nothing to upload", ref.env_hash[:12], url)
        if progress:
            progress("cached", 0, 0)
        return replace(ref, cached=True)
    local = Path(local_cache or paths.cache_dir() / "envs") / url.rsplit("/", 1)[-1]
    if not local.is_file():
        pack_env(prefix or sys.prefix, ref.kind, local, progress)
    sent = upload(local, fs, path, progress)
    log.info("uploaded environment %s (%.1f MB) to %s", ref.env_hash[:12], sent / 1e6, url)
    if progress:
        progress("done", sent, sent)
    return replace(ref, uploaded_bytes=sent)
