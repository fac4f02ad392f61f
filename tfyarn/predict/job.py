"""One scoring task: this worker's parts of the plan, read, scored and committed, three stages in parallel.

    reader thread (read + parse ~16k rows at a time) ──batches (≤ prefetch)──▶ this thread (the model, one fixed
    batch shape) ──rows (≤ 8)──▶ writer thread (arrow → Parquet/TFRecord, temp name, rename, the part's record)

Every worker computes the same plan (:func:`tfyarn.data.planner.scoring_plan`) from the input's manifest and skips
the parts already committed (a retried or restarted task rewrites only the unfinished ones). The task that sees
every part's record writes ``_SUCCESS`` and the run summary (KV ``summary``).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any

from tfyarn.contracts.kv_keys import SUMMARY_KEY
from tfyarn.data.manifest import section_manifest
from tfyarn.data.planner import scoring_plan
from tfyarn.predict.model import BatchModel, fetch_saved_model
from tfyarn.predict.output import OutputDir, PartWriter, put_unless
from tfyarn.predict.reader import PartReader, PartStats
from tfyarn.train.progress import ProgressReporter

log = logging.getLogger("tfyarn.predict")


class _Reader:
    """The reader thread over this task's parts: ``("batch", part, feats, kept, n)`` then ``("end", part, stats)``
    per part, then ``("done",)``; an error is handed over as ``("error", exc)``."""

    def __init__(self, reader: PartReader, parts: list[Any], prefetch: int):
        self.reader, self.parts = reader, parts
        self.q: queue.Queue = queue.Queue(maxsize=prefetch)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tfyarn-predict-reader", daemon=True)
        self.thread.start()

    def _put(self, item: tuple) -> None:
        put_unless(self.q, item, self.stop.is_set)

    def _run(self) -> None:
        try:
            for part in self.parts:
                stats = PartStats()
                for feats, kept, n in self.reader.batches(part, stats):
                    if self.stop.is_set():
                        return
                    self._put(("batch", part, feats, kept, n))
                self._put(("end", part, stats))
            self._put(("done",))
        except BaseException as exc:  # noqa: BLE001 - handed to the scoring loop, which raises it
            self._put(("error", exc))

    def get(self, timeout: float) -> tuple:
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            alive = self.thread.is_alive()
            raise TimeoutError(f"no input batch within {timeout:g}s (reader thread alive: {alive})") from None

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5.0)


def run(ctx: Any) -> dict[str, Any]:
    """Score this task's parts; returns its figures (and the run's totals when it wrote ``_SUCCESS``)."""

    spec, p = ctx.spec, ctx.spec.predict
    t0 = time.monotonic()
    rank, workers = ctx.index, spec.instances("worker")
    out = OutputDir(p.output, p.output_format)
    features = spec.scoring_features
    manifest = section_manifest(p.input, p, p.index_cache)  # what every scoring task plans from
    plan = scoring_plan(manifest, workers, p.part_rows)
    mine = [part for part in plan if part.worker == rank]
    done = out.committed()
    todo = [part for part in mine if part.index not in done]
    rows_total = sum(part.rows for part in mine)
    rows_done = sum(part.rows for part in mine if part.index in done)
    log.info(
        "%s: %d of %d parts (%d rows) are this worker's; %d already committed, %d to score (%d rows)",
        ctx.task_id,
        len(mine),
        len(plan),
        rows_total,
        len(mine) - len(todo),
        len(todo),
        rows_total - rows_done,
    )
    reporter = ProgressReporter(ctx.kv, ctx.task_id, attempt=ctx.attempt)
    reporter.extra.update(rows=rows_done, rows_total=rows_total, parts=len(mine) - len(todo), parts_total=len(mine))
    reporter.report(0, 0, force=True)
    mine_figures = {"rows_in": 0, "rows_out": 0, "skipped": 0, "parts": 0, "bytes": 0}
    if todo:
        reader = PartReader(manifest, features, p.keep, p.batch_size, p.on_corrupt)
        local_model, source = fetch_saved_model(spec, ctx.workdir)
        model = BatchModel(local_model, p.signature, features, p.batch_size)

        def committed(record: dict[str, Any]) -> None:
            for k in mine_figures:
                mine_figures[k] += 1 if k == "parts" else record[k]
            reporter.extra["parts"] = reporter.extra.get("parts", 0) + 1

        _score(ctx, reader, todo, model, out, reporter, committed, p.prefetch, spec.timeouts.stall)
    else:
        source = p.saved_model or p.checkpoint
    rate = reporter.final()["examples_per_sec"]
    figures = {"task": ctx.task_id, "seconds": round(time.monotonic() - t0, 3), **mine_figures, "rows_per_sec": rate}
    log.info("%s: %s", ctx.task_id, json.dumps(figures))
    totals = out.finish(len(plan), {"job": "predict", "model": source, "workers": workers, "batch_size": p.batch_size})
    if totals is not None:
        log.info(
            "%s: the run is complete: %d rows in, %d out, %d skipped, %d parts, %d bytes in %s",
            ctx.task_id,
            totals["rows_in"],
            totals["rows_out"],
            totals["skipped"],
            totals["parts"],
            totals["bytes"],
            out.url,
        )
        ctx.kv.put(SUMMARY_KEY, json.dumps(totals, separators=(",", ":")))
    return figures | ({"run": totals} if totals else {})


def _score(
    ctx: Any,
    reader: PartReader,
    todo: list[Any],
    model: Any,
    out: OutputDir,
    reporter: Any,
    committed: Any,
    prefetch: int,
    timeout: float,
) -> None:
    writer = PartWriter(out, ctx.index, committed)
    feed = _Reader(reader, todo, prefetch)
    reporter.begin()
    step, rows, part_rows_out, part_t0 = 0, reporter.extra["rows"], 0, time.monotonic()
    try:
        while True:
            item = feed.get(timeout)
            kind = item[0]
            if kind == "error":
                raise item[1]
            if kind == "done":
                break
            if kind == "end":
                _, part, stats = item
                writer.put(("end", part.index, stats, part_rows_out, time.monotonic() - part_t0))
                rows += stats.rows_in - part_rows_out  # the part's skipped rows are done too
                part_rows_out, part_t0 = 0, time.monotonic()
                continue
            _, part, feats, kept, n = item
            preds = model(feats, n)
            writer.put(("rows", part.index, kept, preds))
            part_rows_out += n
            rows += n
            step += 1
            reporter.extra["rows"] = rows
            reporter.report(step, 0, examples=n)
        writer.close()
    finally:
        feed.close()  # (after a failure the writer thread is left: a daemon, its part never renamed into place)
    reporter.extra["rows"] = rows
    reporter.report(step, 0, force=True)
