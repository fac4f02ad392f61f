"""What people see while a job runs and when it ends (machines read ``status --output json`` instead).

:func:`progress_view` (the ``on_update`` of ``run`` / ``wait``) is a rich live table of the tasks under a progress bar
on a terminal (:class:`LiveView`), and elsewhere (cron, CI, Airflow logs) one timestamped line at most every
``every`` seconds plus one at each state change (:class:`LineView`), so scheduler logs stay bounded.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

from tfyarn.contracts.status import AppStatus
from tfyarn.contracts.progress import memory_warnings

#: Seconds between two plain progress lines when nothing changed state (non-TTY).
LINE_EVERY_S = 10.0
_STATE_STYLE = {
    "RUNNING": "green",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "KILLED": "yellow",
    "TIMED_OUT": "bold red",
    "PENDING": "dim",
}


def _fmt_eta(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_text(st: AppStatus) -> str:
    """One line: state, running tasks, step/total, epoch, examples/s, loss, ETA."""
    p = st.progress or {}
    running = sum(1 for t in st.tasks if t.state == "RUNNING")
    parts = [f"{st.state.value.lower()}", f"tasks {running}/{len(st.tasks)} running"]
    parts += _predict_parts(p) if p.get("rows_total") is not None else _training_parts(p)
    if p.get("eta_s") is not None:
        parts.append(f"ETA {_fmt_eta(p['eta_s'])}")
    return " · ".join(parts)


def _predict_parts(p: dict[str, Any]) -> list[str]:
    """A predict job's rows done of all and its rate."""
    parts = [f"rows {p.get('rows') or 0:,}/{p['rows_total']:,}"]
    if p.get("rows_per_sec"):
        parts.append(f"{p['rows_per_sec']:,.0f} rows/s")
    return parts


def _training_parts(p: dict[str, Any]) -> list[str]:
    """A training job's step, what a user's program took, epoch, examples/s, loss and latest evaluation."""
    parts = []
    if p.get("global_step") is not None:
        total = p.get("total_steps")
        parts.append(f"step {p['global_step']}" + (f"/{total}" if total else ""))
    if p.get("taken"):  # a user's program: what each task took from train_dataset(), reported or not
        parts.append(f"batches taken from train_dataset() {_per_task(p['taken'])}")
    if p.get("epoch") is not None:
        parts.append(f"epoch {p['epoch']}")
    if p.get("examples_per_sec"):
        parts.append(f"{p['examples_per_sec']:,.0f} ex/s" + (" taken" if p.get("examples_from") else ""))
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.4f}")
    if p.get("eval"):
        parts.append(f"eval {_eval_text(p['eval'], brief=True)}")
    return parts


#: Keys of an evaluation record that are not metrics.
_EVAL_META = ("checkpoint", "global_step", "epoch", "batches", "examples", "time", "eval_seconds")


def _per_task(values: dict[str, Any]) -> str:
    """``chief:0=26 worker:0=26``."""
    return " ".join(f"{k}={v}" for k, v in values.items())


def _eval_text(ev: dict, brief: bool = False) -> str:
    """``loss 0.7221 · accuracy 0.5250 (ckpt-120, global step 120, 1,000 examples)``; brief: the metrics and the
    step."""
    metrics = " · ".join(f"{k} {v:.4f}" for k, v in ev.items() if k not in _EVAL_META and isinstance(v, (int, float)))
    if brief:
        return f"{metrics} @ step {ev.get('global_step')}"
    return (
        f"{metrics} ({ev.get('checkpoint')}, global step {ev.get('global_step')}, "
        f"{int(ev.get('examples') or 0):,} examples)"
    )


# ------------------------------------------------------------------------------------------------ rich rendering
def tasks_table(st: AppStatus) -> Any:
    """A rich Table: one row per task (role, index, state, host, restarts, local step, exit code)."""
    from rich.table import Table

    per_task = (st.progress or {}).get("per_task") or {}
    taken = (st.progress or {}).get("taken") or {}  # a program's batches from train_dataset(), when no step
    table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for col in ("role", "#", "state", "host", "restarts", "step", "exit"):
        table.add_column(col, justify="left" if col in ("role", "state", "host") else "right")
    for t in st.tasks:
        role, _, index = t.task.partition(":")
        step = per_task.get(t.task)
        table.add_row(
            role,
            index,
            f"[{_STATE_STYLE.get(t.state, '')}]{t.state}[/]",
            t.host or "-",
            str(t.restarts),
            (f"{taken[t.task]} taken" if t.task in taken else "-") if step is None else str(step),
            "" if t.exit_code is None else str(t.exit_code),
        )
    return table


def progress_line(st: AppStatus, width: int = 30) -> Any:
    """The progress bar with its figures: global step / total (%), examples/s, ETA, loss, epoch."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    p = st.progress or {}
    known, total = p.get("global_step"), p.get("total_steps")
    step = known or 0
    bar = ProgressBar(
        total=float(total) if total else None,
        completed=float(min(step, total or step)),
        width=width,
        animation_time=0.0 if st.state.is_terminal else None,
    )
    if known is None:  # a user's program that reports no step: what it took from train_dataset(), if anything
        figures = [f"batches taken {_per_task(p['taken'])}" if p.get("taken") else "step not reported"]
    else:
        figures = [f"step {step}/{total} ({100.0 * step / total:.0f}%)" if total else f"step {step}"]
    figures.append(f"{p['examples_per_sec']:,.0f} ex/s" if p.get("examples_per_sec") else "- ex/s")
    figures.append(f"ETA {_fmt_eta(p.get('eta_s'))}")
    figures.append(f"loss {p['loss']:.4f}" if p.get("loss") is not None else "loss -")
    if p.get("epoch") is not None:
        figures.append(f"epoch {p['epoch']}")
    grid = Table.grid(padding=(0, 1))
    grid.add_row(f"[{_STATE_STYLE.get(st.state.value, '')}]{st.state.value}[/]", bar, "  ".join(figures))
    return grid


def render_status(st: AppStatus) -> Any:
    """Everything the live view shows for one status: a title, the task table, the progress line (and the
    TensorBoard URL while one is served)."""
    from rich.console import Group
    from rich.text import Text

    parts = [Text(f"{st.name} ({st.app_id})", style="bold"), tasks_table(st), progress_line(st)]
    url = tensorboard_url(st)
    if url:
        parts.append(Text(f"TensorBoard: {url}"))
    return Group(*parts)


def tensorboard_url(st: AppStatus) -> str | None:
    """The URL the tensorboard role published, while the job runs (the role stops with training)."""
    return None if st.state.is_terminal else (st.progress or {}).get("tensorboard_url")


def status_text(st: AppStatus) -> str:
    """What ``tfyarn status`` prints: the summary of an ended job, else the progress line and the TensorBoard URL;
    then one line per task."""
    lines = [summary_text(st) if st.state.is_terminal else f"{st.app_id} {st.name}: {progress_text(st)}"]
    url = tensorboard_url(st)
    if url:
        lines.append(f"  tensorboard: {url}")
    page = (st.progress or {}).get("page_url")
    if page and not st.state.is_terminal:
        lines.append(f"  page: {page}")
    if not st.state.is_terminal:
        lines += [f"  memory: {w}" for w in memory_warnings(st.tasks)]
    for t in st.tasks:
        lines.append(
            f"  {t.task:<14} {t.state:<10} host={t.host or '-'} restarts={t.restarts}"
            + (f" exit={t.exit_code}" if t.exit_code is not None else "")
            + _resources_text(t)
        )
    return "\n".join(lines)


def _resources_text(t: Any) -> str:
    """`` cpu=87.5% rss=412/2,048MiB peak=420MiB``: what the task's process tree used (what is known of it)."""
    out = f" cpu={t.cpu_percent:.0f}%" if t.cpu_percent is not None else ""
    if t.rss_mib is not None:
        out += f" rss={t.rss_mib:,}" + (f"/{t.memory_mib:,}" if t.memory_mib else "") + "MiB"
    if t.peak_rss_mib is not None:
        out += f" peak={t.peak_rss_mib:,}MiB"
    return out


# ------------------------------------------------------------------------------------------------ the two views
class LineView:
    """Plain timestamped lines at a bounded rate: a line every ``every`` s if the text changed, and at once when the
    job's or a task's state changes. ``clock`` is injectable so tests check the rate without sleeping."""

    def __init__(
        self,
        out: TextIO | Any,
        every: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        stamp: Callable[[], str] | None = None,
    ):
        self.out, self.every, self.clock = out, every, clock
        self.stamp = stamp or (lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self._last = -float("inf")
        self._last_text = ""
        self._states: tuple = ()

    def __call__(self, st: AppStatus) -> None:
        states = (st.state.value,) + tuple((t.task, t.state) for t in st.tasks)
        text = progress_text(st)
        now = self.clock()
        changed = states != self._states
        if changed or (text != self._last_text and now - self._last >= self.every):
            line = f"{self.stamp()} {st.app_id} {text}"
            if changed and self._states:
                old = dict(self._states[1:])
                moved = [f"{t.task} {t.state}" for t in st.tasks if old.get(t.task) != t.state]
                if moved:
                    line += " [" + ", ".join(moved) + "]"
            self.out.write(line + "\n")
            self.out.flush()
            self._last, self._last_text, self._states = now, text, states

    def echo(self, task: str, line: str) -> None:
        """A task's output line (the ``echo`` of ``run``)."""
        self.out.write(f"{task:>13} | {line}\n")
        self.out.flush()

    def close(self) -> None:
        pass


class LiveView:
    """A rich live display (task table + progress bar), refreshed on each status; ``close`` leaves the last frame."""

    def __init__(self, console: Any = None, out: TextIO | None = None):
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(file=out or sys.stderr, force_terminal=True)
        self._live = Live(
            console=self.console,
            refresh_per_second=4,
            transient=False,
            redirect_stdout=True,
            redirect_stderr=True,
            auto_refresh=True,
        )
        self._started = False

    def __call__(self, st: AppStatus) -> None:
        if not self._started:
            self._live.start()
            self._started = True
        self._live.update(render_status(st), refresh=True)

    def echo(self, task: str, line: str) -> None:
        """A task's output line, above the live display (thread-safe: rich serialises console output)."""
        from rich.text import Text

        self.console.print(Text(f"{task:>13} | {line}"), soft_wrap=True)

    def close(self) -> None:
        if self._started:
            self._live.stop()
            self._started = False


def progress_view(
    out: TextIO | None = None, every: float = LINE_EVERY_S, live: bool | None = None
) -> LiveView | LineView:
    """The ``on_update`` (and ``echo``) of ``run`` / ``wait``: the live view on a TTY, else plain timestamped lines
    every ``every`` seconds."""
    out = out or sys.stderr
    return LiveView(out=out) if (_isatty(out) if live is None else live) else LineView(out, every)


def _isatty(out: TextIO) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


def _skipped_lines(s: dict[str, Any], shown: int = 5) -> list[str]:
    """The records a run skipped as corrupt: how many, by which task, and where (file and byte offset)."""
    n = s["skipped_records"]
    by = " ".join(f"{t}={k}" for t, k in sorted((s.get("skipped_by_task") or {}).items()))
    where = list(s.get("skipped_at") or ())
    lines = [
        f"  data: {n:,} corrupt record{'s' if n != 1 else ''} skipped (on_corrupt: skip)"
        + (f": {by}" if by else "")
        + "; each is named in its task's log"
    ]
    lines += [f"    {w}" for w in where[:shown]]
    if len(where) > shown:
        lines.append(f"    ... {len(where) - shown} more in the summary's skipped_at")
    return lines


def _predict_lines(s: dict[str, Any]) -> list[str]:
    """A predict job's summary (its ``_SUCCESS``): rows in and out, skipped, parts, bytes, where."""
    lines = [
        f"  rows: {s['rows_in']:,} in, {s['rows_out']:,} out"
        + (f", {s['skipped']:,} skipped as corrupt (on_corrupt: skip)" if s.get("skipped") else ""),
        f"  output: {s.get('output')} ({s.get('parts')} {s.get('format')} parts, {s.get('bytes', 0):,} bytes)",
        f"  model: {s.get('model')} · {s.get('workers')} workers · batch {s.get('batch_size')}",
    ]
    return lines + [f"    {w}" for w in (s.get("skipped_at") or [])[:5]]


def summary_text(st: AppStatus) -> str:
    """The end-of-run summary: outcome, steps per worker, examples/s, first and last loss."""
    took = f" in {st.finished - st.started:.1f}s" if st.finished and st.started else ""
    lines = [f"job {st.name} {st.state.value}{took} ({st.app_id})"]
    if st.diagnostics:
        lines.append(f"  diagnosis: {st.diagnostics}")
    s = st.summary or {}
    if s.get("job") == "predict":
        lines += _predict_lines(s)
    elif s:
        lines += _training_lines(s)
    lines += _memory_lines(st)
    for t in st.tasks:
        if t.state == "FAILED":
            lines.append(f"  {t.task} failed (exit {t.exit_code}); log: {t.log}")
    return "\n".join(lines)


def _training_lines(s: dict[str, Any]) -> list[str]:
    """A training run's summary: its steps, rate and loss (what a user's program did not report said so), then
    where it resumed or warm-started from, what it skipped, its evaluation and what it wrote."""
    program = "entrypoint" in s  # the user's own program: what it did not report is not known
    lines = ["  " + " · ".join(_training_head(s))]
    spw = s.get("steps_per_worker") or {}
    if spw:
        lines.append("  steps per worker: " + " ".join(f"{k}={v}" for k, v in spw.items()))
    if program:
        lines += _program_lines(s)
    if s.get("examples_per_sec") is not None:
        taken = " (taken from train_dataset())" if s.get("examples_from") else ""
        lines.append(f"  examples/s{taken}: {s['examples_per_sec']:,.0f}")
    elif program:
        lines.append("  examples/s: not reported")
    first, last = s.get("first_loss"), s.get("last_loss")
    if first is not None and last is not None:
        change = (last - first) / abs(first) * 100 if first else 0.0
        word = "down" if last < first else "UP"
        lines.append(f"  loss: first {first:.4f} -> last {last:.4f} ({word} {abs(change):.1f}%)")
    elif program:
        lines.append("  loss: not reported (tfyarn.progress(loss=...), or fit's tfyarn.keras.callback())")
    if s.get("resumed_from"):
        nothing_ran = first is None and s.get("total_steps") and s.get("global_step") == s.get("total_steps")
        lines.append(
            f"  resumed from {s['resumed_from']}"
            + (" — training had already finished: no step ran" if nothing_ran else "")
        )
    if s.get("warm_started_from"):
        lines.append(f"  warm start: model variables from {s['warm_started_from']}")
    if s.get("skipped_records"):
        lines += _skipped_lines(s)
    if s.get("eval"):
        lines.append(f"  eval: {_eval_text(s['eval'])}")
    if s.get("checkpoint_dir"):
        lines.append(f"  checkpoints: {s['checkpoint_dir']}")
    if isinstance(s.get("export"), dict) and s["export"].get("url"):
        lines.append(f"  model (SavedModel): {s['export']['url']}  (from {s['export'].get('checkpoint')})")
    return lines


def _training_head(s: dict[str, Any]) -> list[str]:
    """The summary's first line: global step (of the total), epochs, mode, global batch."""
    gs = s.get("global_step")
    head = [
        f"global step {'not reported' if gs is None else gs}" + (f"/{s['total_steps']}" if s.get("total_steps") else "")
    ]
    if s.get("epochs") is not None:
        head.append(f"{s.get('epochs')} epochs")
    head.append(f"mode {s.get('mode')}{' sync' if s.get('sync') else ''}{' (custom train)' if s.get('custom') else ''}")
    if s.get("global_batch_size"):
        head.append(f"global batch {s['global_batch_size']}")
    return head


def _memory_lines(st: AppStatus) -> list[str]:
    """Tasks whose resident memory came near (or, locally, over) their role's memory: YARN would kill them."""
    lines = []
    for t in st.tasks:
        role = t.task.split(":")[0]
        if t.peak_rss_mib and t.memory_mib and t.peak_rss_mib > t.memory_mib and st.backend == "local":
            lines.append(
                f"  memory: {t.task} peaked at {t.peak_rss_mib:,} MiB resident, over roles.{role}.memory "
                f"({t.memory_mib:,} MiB): on YARN its container would be killed"
            )
        elif t.peak_rss_mib and t.memory_mib and t.peak_rss_mib >= 0.9 * t.memory_mib:
            lines.append(
                f"  memory: {t.task} peaked at {t.peak_rss_mib:,} MiB resident, "
                f"{100 * t.peak_rss_mib / t.memory_mib:.0f}% of roles.{role}.memory ({t.memory_mib:,} MiB): "
                f"YARN kills a container above it"
            )
    return lines


def _program_lines(s: dict[str, Any]) -> list[str]:
    """The user's program (``entrypoint:``): what each task took from ``train_dataset()`` (batches of the planned,
    examples, epochs) and how long its program ran — known to tfyarn whether or not the program reports."""
    lines = []
    taken = s.get("taken") or {}
    if taken:
        planned = s.get("planned_batches")
        each = " ".join(f"{t}={v['batches']}" for t, v in taken.items())
        extra = [f"of {planned} planned" if planned else "", f"{max(v['epochs'] for v in taken.values())} epochs"]
        examples = {v["examples"] for v in taken.values()}
        if len(examples) == 1:
            extra.append(f"{examples.pop():,} examples each")
        lines.append(f"  batches taken from train_dataset(): {each} ({', '.join(e for e in extra if e)})")
    elif s.get("batch_size") is not None:
        lines.append(
            "  batches taken from train_dataset(): none (the program read its own data, or in ps mode "
            "the workers' TF servers did)"
        )
    ran = s.get("program_s") or {}
    if ran:
        lines.append("  program ran: " + " ".join(f"{t}={v:.1f}s" for t, v in ran.items()))
    return lines


def report_text(report: dict[str, Any], png: str | None) -> str:
    """A few lines for people: outcome, the plot's location, per-task figures."""
    took = f" in {report['duration_s']:.1f}s" if report.get("duration_s") else ""
    lines = [f"run report of {report.get('name')} ({report.get('app_id')}): {report.get('state')}{took}"]
    if report.get("diagnostics"):
        lines.append(f"  diagnosis: {report['diagnostics']}")
    lines.append(f"  plot: {png or '(none: matplotlib missing or no progress)'}")
    for task, s in (report.get("tasks") or {}).items():
        loss = (
            f"loss {s['first_loss']:.4f} -> {s['last_loss']:.4f}"
            if s.get("first_loss") is not None and s.get("last_loss") is not None
            else "loss -"
        )
        rate = (
            f"examples/s mean {s['mean_examples_per_sec']:,.0f} max {s['max_examples_per_sec']:,.0f}"
            if s.get("mean_examples_per_sec") is not None
            else "examples/s -"
        )
        step = "step not reported" if s.get("last_step") is None else f"step {s['last_step']}"
        if s.get("batches_taken") is not None:
            step += f" · {s['batches_taken']} batches taken from train_dataset()"
        lines.append(f"  {task:<12} {step}  {loss}  {rate}  ({s.get('points')} points)")
    for t in (report.get("status") or {}).get("tasks") or []:  # each task's resource use (issue 32)
        if t.get("peak_rss_mib") is not None:
            mem = f" of {t['memory_mib']:,}" if t.get("memory_mib") else ""
            cpu = f", last CPU {t['cpu_percent']:.0f}%" if t.get("cpu_percent") is not None else ""
            lines.append(f"  {t['task']:<12} peak RSS {t['peak_rss_mib']:,}{mem} MiB{cpu}")
    return "\n".join(lines)
