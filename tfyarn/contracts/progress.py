"""Job progress from the tasks' ``progress/<task>`` KV records, as every backend reports it.

The ETA comes from how fast the *global* step itself moved over the last samples, not from summing per-task step
rates: in async ps mode every worker step is a global step, in sync mode a global step is one round of all workers,
and only the global step's own rate is right in both. A single status read (``tfyarn status`` of a YARN job, from a
fresh process) has no samples yet: it uses the global-step rate the training tasks measured themselves
(``global_steps_per_sec`` in their records; the median, so one stopped task does not skew it).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from typing import Any, Callable, Iterable, Mapping

from tfyarn.contracts.kv_keys import (
    EVAL_KEY,
    PAGE_URL_KEY,
    PROGRESS_PREFIX,
    RESOURCES_PREFIX,
    SUMMARY_KEY,
    TENSORBOARD_URL_KEY,
    TOTAL_STEPS_KEY,
)


class GlobalStepRate:
    """Global steps per second over a sliding window of (time, global step) samples."""

    def __init__(self, window_s: float = 20.0, min_span_s: float = 1.0):
        self.window_s, self.min_span_s = window_s, min_span_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, global_step: int, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        if self._samples and global_step < self._samples[-1][1]:
            self._samples.clear()  # a new attempt restarted from a checkpoint
        self._samples.append((now, global_step))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        (t0, g0), (t1, g1) = self._samples[0], self._samples[-1]
        return (g1 - g0) / (t1 - t0) if t1 - t0 >= self.min_span_s and g1 > g0 else None


def aggregate_progress(
    items: dict[str, str], total_steps: int | None, training_tasks: list[str], rate: GlobalStepRate | None = None
) -> dict:
    """The furthest global step, summed examples/s, mean loss; ETA when ``rate`` follows the job over time.

    A user's program that reported no step (``reported: false``, or the log heartbeat's record) has none: the
    global step, a task's step, examples/s and the epoch are ``None`` ("not reported"), never 0; what it took from
    ``train_dataset()`` is ``taken`` (batches per task) and its examples/s (``examples_from``)."""
    recs = {}
    for key, raw in items.items():
        try:
            recs[key.split("/", 1)[1]] = json.loads(raw)
        except (ValueError, IndexError):
            continue
    if not recs:
        return {"total_steps": total_steps} if total_steps else {}
    train = [recs[t] for t in training_tasks if t in recs]
    stepped = [r for r in recs.values() if r.get("reported") is not False and r.get("heartbeat") is None]
    gstep = max(((r.get("global_step") or r.get("step") or 0) for r in stepped), default=None)
    rates = [r["examples_per_sec"] for r in train if r.get("examples_per_sec") is not None]
    taken = {t: r["taken"] for t, r in recs.items() if (r.get("taken") or {}).get("batches")}
    from_taken = [
        r["taken"]["examples_per_sec"]
        for r in train
        if r.get("examples_per_sec") is None and (r.get("taken") or {}).get("examples_per_sec")
    ]
    losses = [r["loss"] for r in train if r.get("loss") is not None]
    epochs = [r["epoch"] for r in train if r in stepped and r.get("epoch") is not None]
    eps = round(sum(rates + from_taken), 1) if rates or from_taken else None
    out: dict[str, Any] = {
        "global_step": gstep,
        "examples_per_sec": eps,
        "loss": round(sum(losses) / len(losses), 6) if losses else None,
        "epoch": max(epochs) if epochs else None,
        "per_task": {t: r.get("step") if r in stepped else None for t, r in recs.items()},
    }
    if taken:  # a user's program: the batches each task took from train_dataset() (reported or not)
        out["taken"] = {t: v["batches"] for t, v in sorted(taken.items())}
        if from_taken and not rates:
            out["examples_from"] = "train_dataset()"
    scoring = [r for r in train if r.get("rows_total") is not None]
    if scoring:  # a predict job (tfyarn.predict): rows scored of the input's, and rows/s (= examples/s)
        rows, rows_total = sum(r.get("rows") or 0 for r in scoring), sum(r["rows_total"] for r in scoring)
        out |= {"rows": rows, "rows_total": rows_total, "rows_per_sec": round(eps or 0.0, 1)}
        out["eta_s"] = round((rows_total - rows) / eps, 1) if eps and rows < rows_total else None
        return out
    steps_per_s = rate.add(gstep) if rate is not None and gstep is not None else None
    measured = [float(r["global_steps_per_sec"]) for r in train if r.get("global_steps_per_sec")]
    if not steps_per_s and measured:  # the tasks' own global-step rates: the median, against one stopped task
        steps_per_s = statistics.median(measured)
    if total_steps:
        out["total_steps"] = total_steps
        ok = steps_per_s and gstep is not None and gstep < total_steps
        out["eta_s"] = round((total_steps - (gstep or 0)) / (steps_per_s or 1.0), 1) if ok else None
    return out


def read_progress(
    kv: Any, training: list[str], rate: GlobalStepRate
) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, str]]:
    """One read of the job's progress from ``kv`` (a KV, or a dict of every KV item): the dict for
    ``AppStatus.progress`` (with the side roles': tensorboard URL, newest evaluation), the chief's summary (None
    before it wrote one) and the raw ``progress/<task>`` items (a run report's history points)."""
    if isinstance(kv, Mapping):
        get: Callable[[str], str | None] = kv.get
        items = {k: v for k, v in kv.items() if k.startswith(PROGRESS_PREFIX)}
    else:
        get, items = kv.get, kv.items(PROGRESS_PREFIX)
    total = get(TOTAL_STEPS_KEY)
    sides = side_roles(get)
    out = aggregate_progress(items, int(total) if total and str(total).isdigit() else None, training, rate) | sides
    return out, summary_with_eval(get(SUMMARY_KEY), sides), items


def attempt_totals(
    attempts: int, wall_s: float, redone: list[dict[str, int]], resumed_step: int | None
) -> dict[str, Any]:
    """Every attempt's figures for the summary: how many, the wall time from the first one's start, the global
    steps done again (``lost_steps``: each attempt's steps past the checkpoint the next one resumed from).
    ``resumed_step``: the step the last attempt really resumed at (its summary says it; an ended attempt's tasks
    may still commit a checkpoint after its end was seen), which corrects the last entry."""
    by_attempt = [dict(r) for r in redone]
    if by_attempt and resumed_step is not None:
        last = by_attempt[-1]
        last["resumes_at"] = resumed_step
        last["lost_steps"] = max(0, last["reached"] - resumed_step)
    return {
        "attempts": attempts,
        "wall_s": round(wall_s, 1),
        "lost_steps": sum(r["lost_steps"] for r in by_attempt),
        "by_attempt": by_attempt,
    }


def side_roles(get: Callable[[str], str | None]) -> dict[str, Any]:
    """What the side roles published, for status: ``tensorboard_url`` and ``eval`` (the newest evaluation record:
    checkpoint, global step, examples, metrics). ``get`` reads one KV key (each backend has its own KV)."""
    out: dict[str, Any] = {}
    url = get(TENSORBOARD_URL_KEY)
    if url:
        out["tensorboard_url"] = url
    page = get(PAGE_URL_KEY)
    if page:
        out["page_url"] = page  # the job's page (tfyarn.web)
    raw = get(EVAL_KEY)
    if raw:
        try:
            out["eval"] = json.loads(raw)
        except ValueError:
            pass  # a torn value cannot happen with KV puts; a foreign one is not worth failing status
    return out


def summary_with_eval(raw: str | None, sides: dict[str, Any]) -> dict[str, Any] | None:
    """The chief's run summary (its KV JSON) with the evaluator's newest evaluation joined in: the evaluator evaluates
    the final checkpoint after the chief wrote the summary, so whoever reads status joins them. None: no summary yet
    (or not JSON)."""
    if not raw:
        return None
    try:
        summary = json.loads(raw)
    except ValueError:
        return None
    return summary | ({"eval": sides["eval"]} if "eval" in sides else {})


def apply_resources(tasks: Iterable[Any], items: Mapping[str, str]) -> None:
    """Each task's last ``resources/<task>`` record (:mod:`tfyarn.task.resources`: what it publishes itself) into
    its :class:`TaskStatus`: ``cpu_percent``, ``rss_mib``, and ``peak_rss_mib`` unless a higher one is known (the
    local launcher samples from outside too)."""
    recs = {}
    for key, raw in items.items():
        if key.startswith(RESOURCES_PREFIX):
            try:
                recs[key[len(RESOURCES_PREFIX) :]] = json.loads(raw)
            except ValueError:
                continue
    for t in tasks:
        rec = recs.get(t.task)
        if not rec:
            continue
        t.cpu_percent, t.rss_mib = rec.get("cpu_percent"), rec.get("rss_mib")
        peak = rec.get("peak_rss_mib")
        if peak is not None and (t.peak_rss_mib or 0) < peak:
            t.peak_rss_mib = peak


def memory_warnings(tasks: Iterable[Any], share: float = 0.9) -> list[str]:
    """One line per task whose resident memory (now, else its peak) is at least ``share`` of its container's
    (its role's ``memory``): YARN kills a container above it."""
    out = []
    for t in tasks:
        rss = t.rss_mib if t.rss_mib is not None else t.peak_rss_mib
        if rss and t.memory_mib and rss >= share * t.memory_mib:
            out.append(
                f"{t.task} uses {rss:,} MiB of resident memory, {100 * rss / t.memory_mib:.0f}% of its "
                f"container's {t.memory_mib:,} MiB (roles.{t.task.split(':')[0]}.memory)"
            )
    return out
