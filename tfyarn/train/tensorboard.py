"""The TensorBoard role: mirror the job's event files from the checkpoint dir, serve them, publish the URL.

Why a mirror: TensorBoard reads ``hdfs://`` only through TF's filesystems, and TF 2.21 has none for HDFS, so
tf-yarn's TensorBoard task silently showed nothing. Here the event files under ``checkpoint.dir`` (``train/``,
``eval/``) are copied through fsspec to a local directory every few seconds, and TensorBoard serves that directory.
Without the ``tensorboard`` package (no longer installed with TF) the role fails at once, naming it.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tfyarn.errors import WaitTimeout
from tfyarn.tasklib.context import DONE_KEY, TENSORBOARD_URL_KEY, TaskContext
from tfyarn.tasklib.watchdog import install_stack_dumps
from tfyarn.train.evaluator import training_ended_badly
from tfyarn.train.events import fs_path

log = logging.getLogger("tfyarn.train.tensorboard")

SYNC_S = 5.0


class MissingTensorBoard(RuntimeError):
    pass


class EventMirror:
    """Copy new or grown event files from ``url`` (any fsspec URL) into ``local``, keeping relative paths."""

    def __init__(self, url: str, local: Path):
        self.fs, self.root = fs_path(url)
        self.local = Path(local)
        self.local.mkdir(parents=True, exist_ok=True)
        self._sizes: dict[str, int] = {}

    def sync(self) -> int:
        """One pass; returns how many files were copied. A missing dir (nothing written yet) copies nothing."""
        if not self.fs.exists(self.root):
            return 0
        n = 0
        for path, info in self.fs.find(self.root, detail=True).items():
            name = path.rsplit("/", 1)[-1]
            if "tfevents" not in name or name.startswith(".tmp-"):
                continue
            size = int(info.get("size") or 0)
            rel = path[len(self.root) :].lstrip("/")
            if self._sizes.get(rel) == size:
                continue
            dst = self.local / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.part")
            self.fs.get_file(path, str(tmp))
            os.replace(tmp, dst)  # TensorBoard never reads a half-copied file
            self._sizes[rel] = size
            n += 1
        return n


def run(ctx: TaskContext, max_wait_s: float | None = None) -> str:
    """Mirror, serve, publish ``tensorboard/url``; return on ``control/done`` (after a last sync) or abort."""
    install_stack_dumps(ctx.kv, ctx.task_id)
    try:
        from tensorboard import program
    except ImportError:
        raise MissingTensorBoard(
            "the tensorboard role needs the 'tensorboard' package in the job's Python environment (it is no longer "
            "installed with TensorFlow): pip install tensorboard, or remove roles.tensorboard from the spec"
        ) from None
    if not ctx.spec.checkpoint.dir:
        raise ValueError("the tensorboard role needs checkpoint.dir (it serves the event files written there)")
    url = ctx.spec.checkpoint.dir
    mirror = EventMirror(url, Path(ctx.workdir) / "tensorboard-logs")
    mirror.sync()
    for noisy in ("tensorboard", "werkzeug"):  # per-request INFO lines would drown the task's log
        logging.getLogger(noisy).setLevel(logging.WARNING)
    tb = program.TensorBoard()
    bind = "127.0.0.1" if ctx.host in ("127.0.0.1", "localhost") else "0.0.0.0"
    tb.configure(
        argv=[None, "--logdir", str(mirror.local), "--host", bind, "--port", "0", "--reload_interval", str(int(SYNC_S))]
    )
    served = tb.launch()  # e.g. http://0.0.0.0:6006/ — rewrite with our address
    port = served.rstrip("/").rsplit(":", 1)[1]
    public = f"http://{ctx.host}:{port}/"
    ctx.kv.put(TENSORBOARD_URL_KEY, public)
    log.info("TensorBoard serving %s (mirror of %s) at %s", mirror.local, url, public)
    deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
    while True:
        try:
            mirror.sync()
        except OSError as exc:  # a transient filesystem error must not end the role
            log.warning("event file sync from %s failed: %s", url, exc)
        done = ctx.kv.get(DONE_KEY) is not None
        reason = "training done" if done else training_ended_badly(ctx)
        if reason is not None:
            mirror.sync()
            log.log(logging.INFO if done else logging.WARNING, "%s: TensorBoard stops", reason)
            return public
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"tensorboard: control/done not set within {max_wait_s:g}s")
        time.sleep(SYNC_S)
