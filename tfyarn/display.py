"""What people see while a job runs and when it ends (machines read ``status --output json`` instead).

On a terminal: a live progress line (rich). Elsewhere (cron, Oozie, CI logs): plain timestamped lines at a bounded
rate, so scheduler logs stay readable.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from tfyarn.backends.base import AppStatus


def _fmt_eta(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_text(st: AppStatus) -> str:
    p = st.progress or {}
    running = sum(1 for t in st.tasks if t.state == "RUNNING")
    parts = [f"{st.state.value.lower()}", f"tasks {running}/{len(st.tasks)} running"]
    if p.get("global_step") is not None:
        total = p.get("total_steps")
        parts.append(f"step {p['global_step']}" + (f"/{total}" if total else ""))
    if p.get("epoch") is not None:
        parts.append(f"epoch {p['epoch']}")
    if p.get("examples_per_sec"):
        parts.append(f"{p['examples_per_sec']:,.0f} ex/s")
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.4f}")
    if p.get("eta_s") is not None:
        parts.append(f"ETA {_fmt_eta(p['eta_s'])}")
    return " · ".join(parts)


class ProgressView:
    """Callable for ``on_update``: a live line on a TTY, else a timestamped line every ``every`` seconds."""

    def __init__(self, out: TextIO | None = None, every: float = 10.0, live: bool | None = None):
        self.out = out or sys.stderr
        self.every = every
        self.live = self.out.isatty() if live is None else live
        self._last = 0.0
        self._last_text = ""

    def __call__(self, st: AppStatus) -> None:
        text = progress_text(st)
        now = time.monotonic()
        if self.live:
            self.out.write("\r\033[K" + text)
            self.out.flush()
        elif text != self._last_text and (now - self._last >= self.every or st.state.is_terminal):
            self.out.write(time.strftime("%Y-%m-%dT%H:%M:%S ") + text + "\n")
            self.out.flush()
            self._last, self._last_text = now, text

    def close(self) -> None:
        if self.live:
            self.out.write("\r\033[K")
            self.out.flush()


def summary_text(st: AppStatus) -> str:
    """The end-of-run summary: outcome, steps per worker, examples/s, first and last loss."""
    took = f" in {st.finished - st.started:.1f}s" if st.finished and st.started else ""
    lines = [f"job {st.name} {st.state.value}{took} ({st.app_id})"]
    if st.diagnostics:
        lines.append(f"  diagnosis: {st.diagnostics}")
    s = st.summary or {}
    if s:
        lines.append(f"  global step {s.get('global_step')}/{s.get('total_steps')} · {s.get('epochs')} epochs · "
                     f"mode {s.get('mode')}{' sync' if s.get('sync') else ''} · "
                     f"global batch {s.get('global_batch_size')}")
        spw = s.get("steps_per_worker") or {}
        if spw:
            lines.append("  steps per worker: " + " ".join(f"{k}={v}" for k, v in spw.items()))
        if s.get("examples_per_sec") is not None:
            lines.append(f"  examples/s: {s['examples_per_sec']:,.0f}")
        first, last = s.get("first_loss"), s.get("last_loss")
        if first is not None and last is not None:
            change = (last - first) / abs(first) * 100 if first else 0.0
            word = "down" if last < first else "UP"
            lines.append(f"  loss: first {first:.4f} -> last {last:.4f} ({word} {abs(change):.1f}%)")
        if s.get("checkpoint_dir"):
            lines.append(f"  checkpoints: {s['checkpoint_dir']}")
    failed = [t for t in st.tasks if t.state == "FAILED"]
    for t in failed:
        lines.append(f"  {t.task} failed (exit {t.exit_code}); log: {t.log}")
    return "\n".join(lines)
