"""The epoch planner: which records each worker reads in an epoch, computed identically everywhere.

Why: with round-robin *file* sharding, workers get different numbers of steps, and a synchronous job
(MultiWorkerMirroredStrategy, SyncReplicas) then blocks forever in the collective of the worker that still has data.
Here **every worker gets exactly the same number of steps**, computed from the manifest alone, so the plan needs no
communication and survives restarts.

How (a pure function of manifest, num_workers, epoch, seed, batch_size):

1. Number all records globally in manifest (sorted path) order: ``0 .. T-1``.
2. ``steps = T // (W * B)``; each worker reads exactly ``steps * B`` records; ``D = T - W * steps * B < W * B`` are
   dropped this epoch.
3. The dropped records are the cyclic window ``[r + epoch * D, r + (epoch + 1) * D)`` (``r`` from the seed): the
   window slides every epoch, so no record is dropped twice before every other record has been dropped once.
4. What is left, cut at file boundaries into pieces, is ordered by a hash of (seed, epoch, piece) — a reshuffle
   every epoch that does not depend on numpy's or Python's RNG streams, so it is identical across versions and hosts.
5. The ordered pieces are laid end to end and cut into ``W`` consecutive shares of ``steps * B`` records each,
   splitting files into record ranges where a cut falls inside one (1 file and 4 workers works; a 10x skewed file
   set is balanced to the record).

Nothing depends on the previous epoch, so the worker count may change between epochs and a restarted job recomputes
the plan from the epoch number alone.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from dataclasses import dataclass
from hashlib import blake2b
from itertools import accumulate
from typing import Any, Iterable, Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class RecordRange:
    """Records ``[start, stop)`` of one file."""

    path: str
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class EpochPlan:
    epoch: int
    num_workers: int
    batch_size: int
    steps: int  # identical for every worker
    shares: tuple[tuple[RecordRange, ...], ...]  # shares[worker]: exactly steps * batch_size records
    dropped: int  # records not read by anyone this epoch (< workers x batch)
    dropped_ranges: tuple[RecordRange, ...] = ()


def _rotation(seed: int, total: int) -> int:
    h = blake2b(f"{seed}|rotation".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") % total


def _numbered(manifest: Any) -> tuple[list[tuple[str, int]], list[int], int]:
    """The non-empty files in path order as (path, records), each one's first record's global number, the total."""
    files = getattr(manifest, "files", manifest)
    pairs = sorted((f.path, f.records) if hasattr(f, "records") else (str(f[0]), int(f[1])) for f in files)
    files = [(p, n) for p, n in pairs if n > 0]
    starts = list(accumulate((n for _, n in files), initial=0))
    return files, starts[:-1], starts[-1]


def _slice(files: Sequence[tuple[str, int]], starts: Sequence[int], lo: int, hi: int) -> list[tuple[str, int, int]]:
    """Global record interval [lo, hi) (no wrap) → per-file (path, start, stop). Only the files it touches are
    visited (found by bisection), as plain tuples: planning 100,000 files must stay well under a second per epoch."""
    out = []
    i = max(0, bisect_right(starts, lo) - 1)
    end = len(files)
    while i < end and starts[i] < hi:
        path, n = files[i]
        s = starts[i]
        a = lo - s if lo > s else 0
        b = hi - s if hi < s + n else n
        if a < b:
            out.append((path, a, b))
        i += 1
    return out


def plan(manifest: Any, num_workers: int, epoch: int, seed: int, batch_size: int) -> EpochPlan:
    """The epoch's plan. ``manifest`` is a :class:`Manifest` (or any sequence of (path, records) pairs)."""
    if num_workers <= 0 or batch_size <= 0 or epoch < 0:
        raise ValueError(
            f"plan needs num_workers > 0, batch_size > 0, epoch >= 0 (got {num_workers}, {batch_size}, {epoch})"
        )
    files, starts, total = _numbered(manifest)
    steps = total // (num_workers * batch_size)
    per_worker = steps * batch_size
    dropped = total - num_workers * per_worker
    if steps == 0:
        log.warning(
            "plan: %d records are fewer than one global batch (%d workers x %d); 0 steps",
            total,
            num_workers,
            batch_size,
        )
        return EpochPlan(
            epoch, num_workers, batch_size, 0, ((),) * num_workers, total, tuple(RecordRange(p, 0, n) for p, n in files)
        )

    def cyclic(lo: int, length: int) -> list[tuple[str, int, int]]:
        lo %= total
        if lo + length <= total:
            return _slice(files, starts, lo, lo + length)
        return _slice(files, starts, lo, total) + _slice(files, starts, 0, lo + length - total)

    # With nothing to drop there is no window to rotate: keep whole files whole (fewer ranges, fewer seeks).
    drop_at = (_rotation(seed, total) + epoch * dropped) % total if dropped else 0
    dropped_ranges = [RecordRange(*r) for r in cyclic(drop_at, dropped)] if dropped else []
    kept = cyclic(drop_at + dropped, total - dropped)
    prefix = f"{seed}|{epoch}|"
    kept.sort(key=lambda r: blake2b(f"{prefix}{r[0]}|{r[1]}".encode(), digest_size=16).digest())
    shares = _deal(kept, num_workers, per_worker)
    return EpochPlan(epoch, num_workers, batch_size, steps, tuple(shares), dropped, tuple(dropped_ranges))


def _deal(kept: list[tuple[str, int, int]], num_workers: int, per_worker: int) -> list[tuple[RecordRange, ...]]:
    """``kept`` (in the epoch's order) cut into ``num_workers`` consecutive shares of ``per_worker`` records each,
    neighbouring pieces of one file merged into one range."""
    shares: list[tuple[RecordRange, ...]] = []
    it = iter(kept)
    cur = next(it, None)
    for _ in range(num_workers):
        need = per_worker
        share: list[list[Any]] = []  # [path, start, stop], made RecordRanges once complete
        while need:
            assert cur is not None, "planner invariant: kept records == workers x per_worker"
            path, start, stop = cur
            take = min(need, stop - start)
            if share and share[-1][0] == path and share[-1][2] == start:  # contiguous: one range
                share[-1][2] = start + take
            else:
                share.append([path, start, start + take])
            need -= take
            cur = (path, start + take, stop) if start + take < stop else next(it, None)
        shares.append(tuple(RecordRange(p, a, b) for p, a, b in share))
    return shares


def round_robin_steps(counts: Iterable[int], num_workers: int, batch_size: int) -> list[int]:
    """Steps per worker under naive round-robin file sharding (the stall baseline the benchmark compares with)."""
    per = [0] * num_workers
    for i, n in enumerate(counts):
        per[i % num_workers] += n
    return [r // batch_size for r in per]


def advance(share: tuple[RecordRange, ...] | list[RecordRange], n: int) -> list[RecordRange]:
    """The share without its first ``n`` records (resume mid-epoch by seeking, not by reading)."""
    out = []
    for r in share:
        if n >= len(r):
            n -= len(r)
            continue
        out.append(RecordRange(r.path, r.start + n, r.stop))
        n = 0
    return out


@dataclass(frozen=True)
class Part:
    """One output part of a scoring run: records ``ranges`` (in order, possibly across files), scored by ``worker``.
    ``index`` numbers the parts in input order over the whole run, so the output's parts read in name order are
    the input's rows in manifest order."""

    index: int
    worker: int
    ranges: tuple[RecordRange, ...]

    @property
    def rows(self) -> int:
        return sum(len(r) for r in self.ranges)


def scoring_plan(manifest: Any, num_workers: int, part_rows: int) -> tuple[Part, ...]:
    """Every record once (one epoch, no shuffle, nothing dropped): the records in manifest order cut into
    ``num_workers`` consecutive shares of equal size (±1 record), each share into parts of at most ``part_rows``.

    A pure function of (manifest, workers, part_rows): a retried task recomputes the same parts and rewrites only
    those without a committed output."""
    if num_workers <= 0 or part_rows <= 0:
        raise ValueError(f"scoring_plan needs num_workers > 0 and part_rows > 0 (got {num_workers}, {part_rows})")
    files, starts, total = _numbered(manifest)
    parts: list[Part] = []
    for w in range(num_workers):
        lo, hi = total * w // num_workers, total * (w + 1) // num_workers
        for a in range(lo, hi, part_rows):
            ranges = tuple(RecordRange(*r) for r in _slice(files, starts, a, min(hi, a + part_rows)))
            parts.append(Part(len(parts), w, ranges))
    return tuple(parts)
