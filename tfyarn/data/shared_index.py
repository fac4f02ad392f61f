"""Indexing shared by a job's training tasks: each indexes ~1/N of the files not indexed yet, and every task builds
the identical manifest from what the others published.

Why: a manifest reads every byte once; if each of N tasks indexed everything, a read-only 1 TB data set would cost
N TB of reads before the first step. With the indexes and the whole manifest cached, a second run reads 0 data bytes.

Protocol, KV keys under ``index/<attempt>/<name>/`` (rank = data rank; the leader is rank 0, the chief):

0. Every task lists the data itself and tries the whole-manifest cache (one read); a ``manifest`` key already set
   (a restarted task) is used as is.
1. ``probe/<rank>``: the task's digest of the listing and, of its stripe (files ``i % N == rank``), the cached
   indexes and the ids of the files not indexed yet — or ``whole``: it found the whole manifest cached.
2. The leader gathers the probes, checks every task listed the same files, and hands the missing files out by bytes
   (largest first to the least loaded task): ``assign``.
3. Each task indexes its files (each cached as soon as it is done): ``part/<rank>``, or ``error`` (damaged data).
4. The leader assembles the manifest, caches it, and publishes ``manifest``; the others wait for that one key.

A published value is ``{"inline": value}`` when small, else ``{"file": url}`` of a JSON file in the cache dir
(``exchange/<app>-<attempt>-<name>/``, removed by the leader once the manifest is out; the manifest's own file is the
whole-manifest cache entry).

Liveness: ``beat/<rank>`` ticks every :data:`BEAT_S` with the data bytes the task has read. A task waited for is given
up when ``failure/<task>`` or ``exit/<task>`` appears, or its ticks (or, while it indexes, its bytes) stop for
``stall`` seconds; the leader then does the rest of its work itself. A leader that dies fails the others' wait naming
it (a dead chief ends the attempt anyway; the next starts with the indexes cached so far). Every wait is also bounded
by ``timeout`` overall.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from dataclasses import asdict
from typing import Any, Callable

import fsspec  # noqa: TID253 - the data path reads through fsspec

from tfyarn.data import index_cache, listing as listing_mod, manifest as mf, sources
from tfyarn.data.fileindex import DEFAULT_STRIDE, STATS, FileInfo, fileinfo
from tfyarn.data.errors import DataError
from tfyarn.common import paths
from tfyarn.contracts.kv_keys import EXIT_PREFIX, FAILURE_PREFIX, exit_key, failure_key, index_namespace
from tfyarn.errors import WaitTimeout

log = logging.getLogger(__name__)

BEAT_S = 2.0
#: KV values above this go to a file (the KV is the YARN application master's memory; one leader read of every
#: task's value must stay well below gRPC's 4 MB message limit).
INLINE_BUDGET = 2_000_000


class IndexAborted(DataError):
    """The shared indexing cannot produce a manifest (damaged data, tasks that listed different files)."""


class Exchange:
    """This job attempt's keys and files for one manifest (``name``: ``train``), as seen by task ``rank``."""

    def __init__(
        self,
        kv: Any,
        tasks: list[str],
        rank: int,
        app_id: str,
        attempt: int,
        cache_dir: str | None,
        name: str = "train",
    ):
        self.kv, self.tasks, self.rank = kv, tasks, rank
        self.ns = index_namespace(attempt, name)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{app_id}-{attempt}-{name}")
        self.dir = f"{(cache_dir or paths.index_cache_dir()).rstrip('/')}/exchange/{safe}"
        self.inline_max = max(1024, min(32768, INLINE_BUDGET // max(1, len(tasks))))

    def key(self, kind: str, rank: int | None = None) -> str:
        return f"{self.ns}/{kind}" if rank is None else f"{self.ns}/{kind}/{rank}"

    def put(self, kind: str, value: Any, rank: int | None = None) -> None:
        """Publish ``value`` (JSON): inline when small, else through a file in the exchange dir."""
        text = json.dumps(value, separators=(",", ":"))
        if len(text) > self.inline_max:
            url = f"{self.dir}/{kind}-{'x' if rank is None else rank}.json"
            try:
                index_cache.write_text(url, text)
                self.kv.put(self.key(kind, rank), json.dumps({"file": url}))
                return
            except OSError as exc:
                log.warning("cannot write %s (%s): publishing %d bytes through the KV instead", url, exc, len(text))
        self.kv.put(self.key(kind, rank), json.dumps({"inline": value}, separators=(",", ":")))

    @staticmethod
    def value(raw: str) -> Any:
        """What :meth:`put` published, from the raw KV value."""
        ref = json.loads(raw)
        if "file" in ref:
            text = index_cache.read_text(ref["file"])
            if text is None:
                raise IndexAborted(f"the shared index file {ref['file']} cannot be read")
            return json.loads(text)
        return ref.get("inline", ref)

    def get(self, kind: str, rank: int | None = None) -> Any:
        raw = self.kv.get(self.key(kind, rank))
        return None if raw is None else self.value(raw)

    def cleanup(self) -> None:
        try:
            fs, path = fsspec.core.url_to_fs(self.dir)
            if fs.exists(path):
                fs.rm(path, recursive=True)
        except Exception as exc:  # noqa: BLE001 - leftover exchange files cost space, not correctness
            log.debug("cannot remove %s: %s", self.dir, exc)


class Heartbeat:
    """``beat/<rank>``: ticks while this task is in the protocol, with its indexing progress (bytes read)."""

    def __init__(self, ex: Exchange, period: float = BEAT_S):
        self.ex, self.period = ex, period
        self.waiting = False
        self._stop = threading.Event()
        self._tick = 0
        self._thread = threading.Thread(target=self._run, name="tfyarn-index-beat", daemon=True)

    def beat(self) -> None:
        self._tick += 1
        self.ex.kv.put(
            self.ex.key("beat", self.ex.rank),
            json.dumps({"tick": self._tick, "bytes": STATS.snapshot()["bytes_read"], "waiting": self.waiting}),
        )

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - a missed beat is judged by the others' stall timeout
                log.debug("index heartbeat: %s", exc)

    def __enter__(self) -> "Heartbeat":
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=self.period + 5)


class Watch:
    """The waiter's view of one peer: is it still alive and making progress? (Clocks are the waiter's own.)"""

    def __init__(self, ex: Exchange, rank: int, stall: float):
        self.ex, self.rank, self.stall = ex, rank, stall
        self.task = ex.tasks[rank]
        self._raw: str | None = None
        self._tick_at = self._moved_at = time.monotonic()
        self._tick: Any = None
        self._bytes: Any = None

    def dead(self, seen: dict[str, str] | None = None) -> str | None:
        """Why the peer is given up, or None while it may still deliver. ``seen``: a snapshot of the KV's
        ``failure/``, ``exit/`` and beat keys (:func:`liveness_snapshot`; one read for every peer), else its own
        keys are read."""
        kv = self.ex.kv
        beat_key = self.ex.key("beat", self.rank)
        for key, what in ((failure_key(self.task), "failed"), (exit_key(self.task), "ended")):
            v = seen.get(key) if seen is not None else kv.get(key)
            if v is not None:
                return f"{self.task} {what}: {v[:300]}"
        now = time.monotonic()
        raw = seen.get(beat_key) if seen is not None else kv.get(beat_key)
        if raw is not None and raw != self._raw:
            self._raw = raw
            beat = json.loads(raw)
            if beat.get("tick") != self._tick:
                self._tick, self._tick_at = beat.get("tick"), now
            if beat.get("bytes") != self._bytes or beat.get("waiting"):
                self._bytes, self._moved_at = beat.get("bytes"), now
        if now - self._tick_at > self.stall:
            return f"{self.task} silent for {self.stall:g}s (no index heartbeat)"
        if now - self._moved_at > self.stall:
            return f"{self.task} read no data for {self.stall:g}s while indexing (a hung read?)"
        return None


def liveness_snapshot(ex: Exchange) -> dict[str, str]:
    """Every task's failure, exit and beat keys in three prefix reads (not three reads per task)."""
    out: dict[str, str] = {}
    for prefix in (FAILURE_PREFIX, EXIT_PREFIX, ex.key("beat") + "/"):
        out.update(ex.kv.items(prefix))
    return out


def shared_manifest(
    urls: list[str] | str,
    *,
    kv: Any,
    tasks: list[str],
    rank: int,
    app_id: str,
    attempt: int = 0,
    compression: str = "auto",
    format: str = "auto",
    on_corrupt: str = "fail",
    cache_dir: str | None = None,
    stride: int = DEFAULT_STRIDE,
    stall: float = 600.0,
    timeout: float = 3600.0,
) -> mf.Manifest:
    """The manifest of ``urls``, built together by the tasks ``tasks`` (this one is ``tasks[rank]``): identical on
    every task, each having read ~1/N of the bytes not indexed yet (see the module docstring). Only the leader logs
    the manifest's warnings as warnings."""
    t0 = time.monotonic()
    before = STATS.snapshot()
    if len(tasks) <= 1:
        m = mf.build_manifest(
            urls,
            compression,
            cache_dir,
            format=format,
            stride=stride,
            on_corrupt=on_corrupt,
            timeout=timeout,
            whole=True,
        )
    else:
        ex = Exchange(kv, tasks, rank, app_id, attempt, cache_dir)
        opts = dict(compression=compression, format=format, stride=stride, on_corrupt=on_corrupt)
        listing = listing_mod.list_data(urls)
        # beats slow down for large jobs (1,000 tasks: every 10 s, ~100 KV writes a second)
        with Heartbeat(ex, max(BEAT_S, len(tasks) / 100)) as hb:
            m = _Run(ex, listing, cache_dir, opts, stall, timeout, hb).go()
    cost = {k: v - before[k] for k, v in STATS.snapshot().items()}
    log.info(
        "%s: manifest of %d files ready in %.2fs; this task read %d data bytes indexing %d files, used %d "
        "cached indexes",
        tasks[rank] if tasks else "task",
        len(m.files),
        time.monotonic() - t0,
        cost["bytes_read"],
        cost["files_indexed"],
        cost["cache_hits"],
    )
    return m


class _Run:
    """One task's pass through the protocol (leader or not)."""

    def __init__(
        self,
        ex: Exchange,
        listing: listing_mod.Listing,
        cache_dir: str | None,
        opts: dict[str, Any],
        stall: float,
        timeout: float,
        hb: Heartbeat,
    ):
        self.ex, self.listing, self.cache_dir, self.opts, self.stall = ex, listing, cache_dir, opts, stall
        self.hb = hb  # says whether this task is waiting (a waiter reads no data)
        self.loud = ex.rank == 0
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        option = sources.cache_option(opts["format"], opts["compression"])
        self.digest = listing.digest(opts["stride"], option, opts["on_corrupt"])
        self.n = len(ex.tasks)

    # -- pieces --------------------------------------------------------------------------------------------------
    def index(self, ids: list[int], read: bool = True) -> dict[int, FileInfo]:
        left = max(1.0, self.deadline - time.monotonic())
        return mf.index_files(self.listing, ids, cache_dir=self.cache_dir, timeout=left, read=read, **self.opts)

    def stripe(self, rank: int) -> list[int]:
        return list(range(rank, len(self.listing.files), self.n))

    def probe(self, rank: int) -> dict[str, Any]:
        """What ``rank``'s stripe has cached and what it lacks (cache reads only, no data)."""
        ids = self.stripe(rank)
        cached = self.index(ids, read=False)
        return {
            "digest": self.digest,
            "cached": {str(i): asdict(fi) for i, fi in cached.items()},
            "missing": [i for i in ids if i not in cached],
        }

    def work(self, ids: list[int]) -> dict[str, Any]:
        try:
            return {"files": {str(i): asdict(fi) for i, fi in self.index(ids).items()}}
        except DataError as exc:
            return {"error": str(exc)}

    def manifest_from(self, doc: dict[str, Any]) -> mf.Manifest:
        if "error" in doc:
            raise IndexAborted(doc["error"])
        if doc.get("digest") != self.digest:
            raise self.other_files(self.ex.tasks[self.ex.rank])
        m = mf.Manifest.from_doc(doc)
        mf.report_warnings(m.warnings, self.loud)
        return m

    def other_files(self, who: str) -> IndexAborted:
        return IndexAborted(
            f"{who} listed other files than {self.ex.tasks[0]} (the data changed while the job "
            f"started?): every task must plan from the same files; start it again"
        )

    # -- the protocol ----------------------------------------------------------------------------------------------
    def go(self) -> mf.Manifest:
        ex = self.ex
        published = ex.get("manifest")
        if published is not None:  # a restarted task: the manifest is out already
            return self.manifest_from(published)
        hit = mf.load_manifest(self.cache_dir, self.digest)
        if ex.kv.get(ex.key("probe", ex.rank)) is None:
            ex.put("probe", {"digest": self.digest, "whole": True} if hit is not None else self.probe(ex.rank), ex.rank)
        if hit is not None:
            mf.report_warnings(hit.warnings, self.loud)
        if ex.rank == 0:
            return self.lead(hit)
        return hit if hit is not None else self.follow()

    def follow(self) -> mf.Manifest:
        ex = self.ex
        got = self.wait_leader(("manifest", "assign"))  # a late task takes the manifest, never a stale hand-out
        if got[0] == "assign":
            mine = got[1].get(str(ex.rank), [])
            if ex.kv.get(ex.key("part", ex.rank)) is None:
                ex.put("part", self.work(mine), ex.rank)
            got = self.wait_leader(("manifest",))
        return self.manifest_from(got[1])

    def wait_leader(self, kinds: tuple[str, ...]) -> tuple[str, Any]:
        """The first of ``kinds`` the leader publishes; bounded by its liveness and by the overall timeout."""
        ex = self.ex
        watch = Watch(ex, 0, self.stall)
        delay = 0.05
        self.hb.waiting = True
        try:
            while True:
                for kind in kinds:
                    v = ex.get(kind)
                    if v is not None:
                        return kind, v
                why = watch.dead()
                if why is not None:
                    raise WaitTimeout(
                        f"{ex.tasks[ex.rank]} waiting for {ex.tasks[0]} to publish the shared data "
                        f"index ({'/'.join(kinds)}): {why}"
                    )
                if time.monotonic() > self.deadline:
                    raise WaitTimeout(
                        f"timed out after {self.timeout:g}s waiting for {ex.tasks[0]} to publish the "
                        f"shared data index ({'/'.join(kinds)})"
                    )
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)
        finally:
            self.hb.waiting = False

    def gather(self, kind: str, cover: Callable[[int], Any]) -> dict[int, Any]:
        """Every task's ``kind`` value (mine included); the value of a task given up as dead comes from ``cover``."""
        ex = self.ex
        out: dict[int, Any] = {}
        watches = {r: Watch(ex, r, self.stall) for r in range(self.n)}
        prefix = ex.key(kind) + "/"
        delay = 0.05
        self.hb.waiting = True
        try:
            while True:
                for key, raw in ex.kv.items(prefix).items():
                    r = int(key[len(prefix) :])
                    if r not in out and 0 <= r < self.n:
                        out[r] = ex.value(raw)
                missing = [r for r in range(self.n) if r not in out]
                if not missing:
                    return out
                seen = liveness_snapshot(ex)
                for r in missing:
                    why = watches[r].dead(seen)
                    if why is not None:
                        log.warning("shared data index: %s; %s covers its %s", why, ex.tasks[0], kind)
                        self.hb.waiting = False
                        out[r] = cover(r)
                        self.hb.waiting = True
                if time.monotonic() > self.deadline:
                    late = ", ".join(ex.tasks[r] for r in range(self.n) if r not in out)
                    raise WaitTimeout(
                        f"timed out after {self.timeout:g}s waiting for the shared data index ({kind}) of {late}"
                    )
                if len(out) < self.n:
                    time.sleep(delay)
                    delay = min(delay * 1.5, 1.0)
        finally:
            self.hb.waiting = False

    def lead(self, hit: mf.Manifest | None) -> mf.Manifest:
        ex = self.ex
        if hit is not None:  # cached whole: publish it, nobody has anything to index
            self.publish(hit, cached=True)
            return hit
        try:
            probes = self.gather("probe", self.probe)
            bad = [ex.tasks[r] for r, p in probes.items() if p["digest"] != self.digest]
            if bad:
                raise self.other_files(", ".join(bad))
            hit = (
                mf.load_manifest(self.cache_dir, self.digest) if any(p.get("whole") for p in probes.values()) else None
            )  # another task found it cached meanwhile
            if hit is None:
                probes = {r: (self.probe(r) if p.get("whole") else p) for r, p in probes.items()}
                hit = self.build(probes)
        except IndexAborted as exc:
            ex.put("manifest", {"error": str(exc)})
            raise
        self.publish(hit, cached=False)
        ex.cleanup()
        return hit

    def publish(self, m: mf.Manifest, cached: bool) -> None:
        """``manifest``: the cache entry's URL when it is large and cached, else the manifest itself."""
        ex = self.ex
        url = (
            index_cache.manifest_entry(self.cache_dir, self.digest)
            if cached
            else mf.store_manifest(self.cache_dir, self.digest, m)
        )
        doc = {"digest": self.digest, **m.to_doc()}
        if url is not None and len(json.dumps(doc, separators=(",", ":"))) > ex.inline_max:
            ex.kv.put(ex.key("manifest"), json.dumps({"file": url}))  # the cache entry is the manifest
        else:
            ex.put("manifest", doc)

    def build(self, probes: dict[int, Any]) -> mf.Manifest:
        ex = self.ex
        infos: dict[int, FileInfo] = {}
        missing: list[int] = []
        for p in probes.values():
            infos.update((int(i), fileinfo(d)) for i, d in p["cached"].items())
            missing += p["missing"]
        assign = ex.get("assign")  # a restarted leader keeps the plan the others follow
        if assign is None:
            assign = plan_work(missing, [self.listing.files[i][1] for i in range(len(self.listing.files))], self.n)
            ex.put("assign", assign)
        if ex.kv.get(ex.key("part", 0)) is None:
            ex.put("part", self.work(assign.get("0", [])), 0)
        parts = self.gather("part", lambda r: self.work(assign.get(str(r), [])))
        errors = [p["error"] for p in parts.values() if "error" in p]
        if errors:
            raise IndexAborted(errors[0])
        for p in parts.values():
            infos.update((int(i), fileinfo(d)) for i, d in p["files"].items())
        lost = [i for i in range(len(self.listing.files)) if i not in infos]
        if lost:  # cannot happen unless a task published less than assigned
            infos.update(self.index(lost))
        return mf.assemble(self.listing, (infos[i] for i in range(len(self.listing.files))), self.loud)


def plan_work(missing: list[int], sizes: list[int], num_tasks: int) -> dict[str, list[int]]:
    """Hand the files ``missing`` out to ``num_tasks`` tasks by bytes: the largest first, each to the task with the
    fewest bytes so far (ties: the lowest rank). Deterministic: ``{str(rank): sorted file ids}``."""
    heap = [(0, r) for r in range(num_tasks)]
    out: dict[str, list[int]] = {str(r): [] for r in range(num_tasks)}
    for i in sorted(set(missing), key=lambda i: (-sizes[i], i)):
        load, r = heapq.heappop(heap)
        out[str(r)].append(i)
        heapq.heappush(heap, (load + sizes[i], r))
    for ids in out.values():
        ids.sort()
    return out
