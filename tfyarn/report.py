"""The run report: what happened over time, per worker, kept next to the checkpoints after the job is gone.

The summary holds end figures; when a run is slow or its loss misbehaves, people ask *when* and *which worker*, which
needs the progress history. Training tasks record their own (:mod:`tfyarn.train.history`, read by
:func:`load_task_history`), so the curves do not depend on who followed the job; the follower's samples
(:class:`ProgressHistory`, appended to ``progress.jsonl`` as they arrive, so a crashed launcher still leaves them) fill
in for tasks that recorded none. :func:`write_run_report` writes ``report.json`` (``tfyarn.report/1``) and
``report.png`` into the app dir and ``checkpoint.dir``. matplotlib is optional (extra ``report``): without it there
is no PNG.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

from tfyarn.contracts.status import AppState, AppStatus
from tfyarn.common.fsio import replace
from tfyarn.common.fsretry import retry

log = logging.getLogger(__name__)

SCHEMA = "tfyarn.report/1"
REPORT_JSON = "report.json"
REPORT_PNG = "report.png"
HISTORY_FILE = "progress.jsonl"
#: Fields of a progress record kept in the history (the rest of a record is task-specific detail).
POINT_FIELDS = ("step", "global_step", "epoch", "loss", "examples_per_sec", "attempt", "restart")


class ProgressHistory:
    """Per-task progress points over time from the raw ``progress/<task>`` KV items, deduplicated by the record's own
    timestamp: polling faster than tasks publish costs nothing."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else None
        self.points: list[dict[str, Any]] = []
        self._seen: dict[str, Any] = {}

    def record(self, items: dict[str, str], now: float | None = None) -> int:
        """Add the new records among ``items``; returns how many were new (and appended to the file)."""
        new = []
        for key, raw in sorted(items.items()):
            try:
                rec = json.loads(raw)
                task = key.split("/", 1)[1]
            except (ValueError, IndexError):
                continue
            stamp = rec.get("time")
            if self._seen.get(task) == (rec if stamp is None else stamp):
                continue
            self._seen[task] = rec if stamp is None else stamp
            point = {"task": task, "time": float(stamp if stamp is not None else (now or time.time()))}
            point.update({k: rec.get(k) for k in POINT_FIELDS if rec.get(k) is not None})
            if rec.get("reported") is False or rec.get("heartbeat"):  # a program's record: no step of its own
                point.pop("step", None)
            if (rec.get("taken") or {}).get("batches"):  # what a program took from train_dataset() by then
                point["batches_taken"] = rec["taken"]["batches"]
            new.append(point)
        if new:
            self.points.extend(new)
            if self.path:
                with open(self.path, "a") as f:
                    f.writelines(json.dumps(p, separators=(",", ":")) + "\n" for p in new)
        return len(new)

    @classmethod
    def load(cls, path: Path) -> "ProgressHistory":
        """Read a ``progress.jsonl`` (a torn last line, from a launcher killed mid-write, is ignored)."""
        h = cls(None)
        if Path(path).exists():
            for line in Path(path).read_text().splitlines():
                try:
                    h.points.append(json.loads(line))
                except ValueError:
                    continue
        return h


def load_task_history(url: str, app_id: str) -> list[dict[str, Any]]:
    """The points the training tasks of ``app_id`` recorded themselves under ``url`` (the checkpoint dir), each
    with its ``segment`` (the file: one task process); [] when there are none. A torn line is skipped."""
    import fsspec

    from tfyarn.train.history import TASK_HISTORY_DIR  # noqa: PLC0415 - the writer owns it (tfyarn.train loads numpy)

    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    d = f"{root.rstrip('/')}/{TASK_HISTORY_DIR}/{app_id}"
    try:
        names = sorted(p for p in fs.ls(d, detail=False) if p.endswith(".jsonl") and "/.tmp-" not in p)
    except FileNotFoundError:
        return []
    points = []
    for path in names:
        segment = path.rsplit("/", 1)[-1][: -len(".jsonl")]
        with fs.open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        for line in text.splitlines():
            try:
                p = json.loads(line)
            except ValueError:
                continue
            if isinstance(p, dict) and "task" in p and "time" in p:
                points.append({**p, "segment": segment})
    return points


def merge_points(followed: list[dict[str, Any]], recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every task's points: its own recorded history where it has one (denser, and there whoever followed), the
    follower's samples (in the order it saw them) for the others — and for the time before a task's first recorded
    point (a process killed before its first upload left none; its samples keep its line and its restart visible)."""
    recorded = sorted(recorded, key=lambda p: p["time"])
    first: dict[str, dict[str, Any]] = {}
    for p in recorded:
        first.setdefault(p["task"], p)

    def earlier_process(p: dict[str, Any]) -> bool:
        f = first[p["task"]]
        return (
            p["time"] < f["time"]
            and "restart" in p
            and (p.get("attempt"), p["restart"]) != (f.get("attempt"), f.get("restart"))
        )

    kept = [p for p in followed if p["task"] not in first or earlier_process(p)]
    return sorted(kept + recorded, key=lambda p: p["time"]) if recorded else kept


def _segments(pts: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One task's points cut where a new process took over: another history file (``segment``), another attempt or
    restart number, or (follower samples) the step going back — a restarted task resumes from its checkpoint."""
    out: list[list[dict[str, Any]]] = []
    prev = None
    for p in pts:
        key = (p.get("segment"), p.get("attempt"), p.get("restart"))
        back = prev is not None and (p.get("step") or 0) < (prev.get("step") or 0)
        if prev is None or key != (prev.get("segment"), prev.get("attempt"), prev.get("restart")) or back:
            out.append([])
        out[-1].append(p)
        prev = p
    return out


def restarts(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where a task started again during the run: ``{task, time, step, attempt, kind}`` for every segment of a task
    after its first (``kind``: "attempt" when the job attempt changed, else "restart")."""
    out = []
    for task, pts in sorted(_by_task(points).items()):
        segs = _segments(pts)
        for before, seg in zip(segs, segs[1:]):
            first = seg[0]
            kind = "attempt" if first.get("attempt") != before[-1].get("attempt") else "restart"
            out.append(
                {
                    "task": task,
                    "time": first["time"],
                    "step": first.get("step"),
                    "attempt": first.get("attempt"),
                    "kind": kind,
                }
            )
    return sorted(out, key=lambda r: r["time"])


def _by_task(points: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_task: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        by_task.setdefault(p["task"], []).append(p)
    return by_task


def _rate_points(pts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A task's points whose examples/s is meaningful: not the first of a segment, whose window is the instant
    between the reporter's start and step 1 (a few microseconds, so a huge, meaningless rate)."""
    return [p for seg in _segments(pts) for p in seg[1:] if p.get("examples_per_sec") is not None]


def _task_stats(points: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for task, pts in sorted(_by_task(points).items()):
        losses = [p["loss"] for p in pts if p.get("loss") is not None]
        rates = [p["examples_per_sec"] for p in _rate_points(pts)]
        steps = [p["step"] for p in pts if p.get("step") is not None]
        taken = [p["batches_taken"] for p in pts if p.get("batches_taken") is not None]
        out[task] = {
            "points": len(pts),
            # None: a user's program that reported no step (not 0); batches_taken: what it took from
            # train_dataset() (tfyarn counts it whether or not the program reports)
            "last_step": max(steps) if steps else None,
            **({"batches_taken": max(taken)} if taken else {}),
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "mean_examples_per_sec": round(sum(rates) / len(rates), 1) if rates else None,
            "max_examples_per_sec": max(rates) if rates else None,
            "first_time": pts[0]["time"],
            "last_time": pts[-1]["time"],
        }
    return out


def build_report(status: dict[str, Any], points: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``tfyarn.report/1`` document from a status dict (``AppStatus.to_dict()``) and history points."""
    started, finished = status.get("started"), status.get("finished")
    return {
        "schema": SCHEMA,
        "app_id": status.get("app_id"),
        "name": status.get("name"),
        "state": status.get("state"),
        "exit_code": status.get("exit_code"),
        "diagnostics": status.get("diagnostics", ""),
        "started": started,
        "finished": finished,
        "duration_s": round(finished - started, 3) if started and finished else None,
        "summary": status.get("summary"),
        "tasks": _task_stats(points),
        "restarts": restarts(points),
        "history": HISTORY_FILE,
        "plot": None,
        "phases": status.get("phases"),
        # the final tfyarn.status/1 document (tasks with their resources): the job's page after the end
        "status": {k: v for k, v in status.items() if k != "phases"},
    }


def preload_plotting() -> None:
    """Import matplotlib while the job runs (call it in a thread): the report's plot is drawn after the end, on the
    CLI's exit path or before the in-app supervisor ends the app, where its import cost ~1-2 s on a loaded box."""
    try:
        import matplotlib.backends.backend_agg
        import matplotlib.figure  # noqa: F401
    except Exception:  # noqa: BLE001 - optional (extra 'report'): the report says so when it is missing
        pass


def history_figure(
    points: list[dict[str, Any]], title: str, t0: float | None = None, tasks: list[dict[str, Any]] | None = None
) -> Any:
    """The report's figure (None without matplotlib): loss and examples/s over seconds since ``t0``, one colour per
    task, each task process its own line, a dashed mark where a task started again. Tick labels are plain:
    matplotlib's automatic offset turned a short job's axis into "+1.467e1". ``tasks`` (the final status's) adds a
    panel of each task's memory (peak RSS against its container's) and CPU: how close each came to YARN's limit."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'tfyarn[report]'): no plot in the run report")
        return None
    t0 = t0 if t0 is not None else min((p["time"] for p in points), default=0.0)
    used = [t for t in tasks or [] if (t.get("peak_rss_mib") or t.get("rss_mib")) is not None]
    fig = Figure(figsize=(10, 7 + 0.35 * len(used) + (1 if used else 0)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    if used:
        grid = fig.add_gridspec(3, 1, height_ratios=[3.5, 3.5, 1 + 0.35 * len(used)])
        ax_loss = fig.add_subplot(grid[0])
        ax_rate = fig.add_subplot(grid[1], sharex=ax_loss)
        _resource_panel(fig.add_subplot(grid[2]), used)
    else:
        ax_loss, ax_rate = fig.subplots(2, 1, sharex=True)
    _plot_tasks(ax_loss, ax_rate, points, t0)
    _label_axes(ax_loss, ax_rate, title)
    if not points:
        ax_loss.text(0.5, 0.5, "no progress was reported", ha="center", va="center", transform=ax_loss.transAxes)
    return fig


def _plot_tasks(ax_loss: Any, ax_rate: Any, points: list[dict[str, Any]], t0: float) -> None:
    """Each task's loss and examples/s in its colour, one line per task process, and a dashed mark where a task
    started again (restart or attempt)."""
    by_task = _by_task(points)
    for i, (task, pts) in enumerate(sorted(by_task.items())):
        colour = f"C{i % 10}"  # matplotlib's default cycle: one colour per task
        labelled: set[Any] = set()
        for seg in _segments(pts):
            lp = [(p["time"] - t0, p["loss"]) for p in seg if p.get("loss") is not None]
            rp = [(p["time"] - t0, p["examples_per_sec"]) for p in seg[1:] if p.get("examples_per_sec") is not None]
            for ax, xy in ((ax_loss, lp), (ax_rate, rp)):
                if xy:
                    ax.plot(*zip(*xy), marker=".", linewidth=1.2, color=colour, label=None if ax in labelled else task)
                    labelled.add(ax)
    for r in restarts(points):
        colour = f"C{sorted(by_task).index(r['task']) % 10}"
        text = f"{r['task']} {'restart' if r['kind'] == 'restart' else 'attempt ' + str(r.get('attempt'))}"
        for ax in (ax_loss, ax_rate):
            ax.axvline(r["time"] - t0, color=colour, linestyle="--", linewidth=1.0, alpha=0.8)
        ax_loss.annotate(
            text,
            (r["time"] - t0, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize="small",
            color=colour,
        )


def _label_axes(ax_loss: Any, ax_rate: Any, title: str) -> None:
    """Titles, grids, plain tick labels and a legend where a line has one."""
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(title)
    ax_rate.set_ylabel("examples/s")
    ax_rate.set_xlabel("seconds since start")
    for ax in (ax_loss, ax_rate):
        ax.grid(True, alpha=0.3)
        ax.ticklabel_format(axis="both", style="plain", useOffset=False)
        if ax.get_legend_handles_labels()[0]:  # a task may have reported no loss or no rate
            ax.legend(loc="best", fontsize="small")


def _resource_panel(ax: Any, tasks: list[dict[str, Any]]) -> None:
    """One bar per task: its peak resident memory (the process tree's) against its container's memory, with its
    last CPU %; a task at 90 % of its memory or more in red (YARN kills a container over its limit)."""
    names = [t["task"] for t in tasks]
    peaks = [float(t.get("peak_rss_mib") or t.get("rss_mib") or 0) for t in tasks]
    limits = [t.get("memory_mib") for t in tasks]
    colours = ["C3" if lim and p >= 0.9 * lim else "C0" for p, lim in zip(peaks, limits)]
    ys = range(len(tasks))
    ax.barh(ys, peaks, color=colours, height=0.6)
    for y, p, lim, t in zip(ys, peaks, limits, tasks):
        if lim:
            ax.plot([lim, lim], [y - 0.4, y + 0.4], color="black", linewidth=1.5)
        cpu = t.get("cpu_percent")
        text = f"{p:,.0f}" + (f" / {lim:,} MiB" if lim else " MiB") + (f" · CPU {cpu:.0f} %" if cpu is not None else "")
        ax.annotate(text, (p, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize="small")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("peak resident memory, MiB (black: the container's memory)")
    ax.set_xlim(0, max([*peaks, *(lim or 0 for lim in limits)]) * 1.35 or 1)
    ax.grid(True, axis="x", alpha=0.3)


def _upload(local: Path, url: str) -> None:
    retry(lambda: _upload_once(local, url), "report upload to", url)


def _upload_once(local: Path, url: str) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    fs.makedirs(root, exist_ok=True)
    tmp = f"{root}/.tmp-{local.name}"
    fs.put_file(str(local), tmp)
    replace(fs, tmp, f"{root}/{local.name}")


def write_run_report(
    app_dir: Path,
    status: dict[str, Any],
    points: list[dict[str, Any]],
    checkpoint_url: str | None = None,
    history_from: str | None = None,
) -> dict[str, Any]:
    """Write ``report.json`` + ``report.png`` into ``app_dir`` and copy both to ``checkpoint_url`` (when set).

    ``points`` are the follower's samples; ``history_from`` (the checkpoint dir) adds the points the training tasks
    recorded themselves (:func:`load_task_history`), which replace the samples of those tasks."""
    app_dir = Path(app_dir)
    recorded = []
    if history_from:
        try:
            recorded = load_task_history(history_from, str(status.get("app_id")))
        except OSError as exc:  # the report still has the follower's samples
            log.warning("could not read the tasks' progress history under %s: %s", history_from, exc)
    points = merge_points(points, recorded)
    report = build_report(status, points)
    report["recorded_by_tasks"] = sorted({p["task"] for p in recorded})
    title = f"{status.get('name')} ({status.get('app_id')}) {status.get('state')}"
    fig = history_figure(points, title, t0=status.get("started"), tasks=status.get("tasks"))
    if fig is not None:
        fig.savefig(str(app_dir / REPORT_PNG))
        report["plot"] = REPORT_PNG
    if checkpoint_url:
        report["checkpoint_dir"] = checkpoint_url
    (app_dir / REPORT_JSON).write_text(json.dumps(report, indent=1, sort_keys=True))
    if checkpoint_url:
        for name in (REPORT_JSON, REPORT_PNG, HISTORY_FILE):
            if (app_dir / name).exists():
                _upload(app_dir / name, checkpoint_url)
        log.info("run report written to %s and %s", app_dir, checkpoint_url)
    return report


# ------------------------------------------------------------------------------------------------ reading reports
def report_at(url: str, app_id: str) -> str | None:
    """``<url>/report.json`` when it is there and is ``app_id``'s (a checkpoint dir holds the report of the last run
    that trained into it), else None."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url.rstrip("/"))
    try:
        with fs.open(f"{root.rstrip('/')}/{REPORT_JSON}") as f:
            report = json.loads(f.read())
    except (FileNotFoundError, ValueError):
        return None
    return f"{url.rstrip('/')}/{REPORT_JSON}" if report.get("app_id") == app_id else None


def copy_report(report: dict[str, Any], png: str | None, dest: Path) -> list[Path]:
    """Copy report.json (and the PNG) into ``dest``; returns the files written."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    out = [dest / REPORT_JSON]
    out[0].write_text(json.dumps(report, indent=1, sort_keys=True))
    if png:
        import fsspec

        with fsspec.open(png, "rb") as src:
            (dest / REPORT_PNG).write_bytes(src.read())
        out.append(dest / REPORT_PNG)
    return out


def write_report(
    out_dir: Path,
    st: AppStatus,
    points: list[dict[str, Any]],
    checkpoint_url: str | None,
    extra: Mapping[str, Any] | None = None,
) -> Path | None:
    """The run report of an ended job in ``out_dir`` and next to its checkpoints; returns the report.json (None:
    nothing to report, or it failed: a warning). A run that failed before its first step keeps its report in
    ``out_dir`` only: beside the checkpoints it would replace the report of the run that wrote them. Never changes
    the job's outcome."""
    try:
        if not points and not checkpoint_url and not extra:
            return None
        trained = st.state is AppState.SUCCEEDED or any((p.get("step") or 0) > 0 for p in points)
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_run_report(
            out_dir,
            st.to_dict() | dict(extra or {}),
            points,
            checkpoint_url if trained else None,
            history_from=checkpoint_url,
        )
        if (st.summary or {}).get("mlflow"):  # tracking.mlflow: the report and the outcome into the run
            from tfyarn.train.tracking import log_report  # noqa: PLC0415 - tfyarn.train loads numpy; status stays light

            log_report(st.to_dict(), out_dir)
        return out_dir / REPORT_JSON
    except Exception:
        log.warning("could not write the run report of %s", st.app_id, exc_info=True)
        return None


def checkpoint_url(spec: Any) -> str | None:
    """The spec's resolved checkpoint dir (None without a spec or a dir): where the report also goes."""
    return spec.checkpoint.dir if spec is not None and spec.checkpoint.dir else None


def checkpoint_step(url: str | None, name: str) -> int | None:
    """The global step of the committed checkpoint ``name`` under ``url`` (its index entry; async ps names a
    checkpoint by the step read before the save, its entry holds the step saved), else None."""
    if not name or not url:
        return None
    try:
        from tfyarn.train.checkpoint import CheckpointStore  # noqa: PLC0415 - tfyarn.train loads numpy; status stays light

        entries = CheckpointStore(url).index().get("checkpoints", [])
        found = [int(e["global_step"]) for e in entries if e.get("name") == name]
    except Exception as exc:  # noqa: BLE001 - a summary figure must not fail the job
        log.debug("checkpoint index of %s: %s", url, exc)
        found = []
    return found[0] if found else None
