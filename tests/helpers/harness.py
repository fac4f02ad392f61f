"""A minimal multi-process harness for training tests: every task a separate Python process on 127.0.0.1.

Why not the real launcher: trainer tests must not depend on the launcher's progress, and must exercise exactly what a
task receives (a TaskContext, TF_CONFIG, the KV) — real gRPC over loopback, the real KV service
(:class:`tfyarn.backends.local.kvserver.KVServer` + :class:`HttpKV`). Ports are reserved here (the rendezvous does that
in production), each task gets ``TFYARN_*`` env and a JSON cluster, builds its context and calls ``target(ctx)``.

Usage::

    with LocalCluster(spec, tmp_path, target="tfyarn.train.allreduce:run") as c:
        c.start()
        codes = c.wait(timeout=120)           # {task: returncode}; kills everything on timeout
        c.log("worker:0")                     # that task's stderr
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """Start ``spec.tasks()`` (or ``tasks``) as processes running ``target`` (``module:function``) with a context."""

    def __init__(self, spec, workdir: Path, target: str = "tfyarn.task.main:run_role",
                 tasks: list[str] | None = None, env: dict[str, str] | None = None,
                 targets: dict[str, str] | None = None):
        from tfyarn.backends.local.kvserver import KVServer
        from tfyarn.tasklib.kv import HttpKV
        from tfyarn.spec import CLUSTER_ROLES
        self.spec, self.workdir, self.target = spec, Path(workdir), target
        self.targets = targets or {}
        self.tasks = tasks or spec.tasks()
        self.env = env or {}
        self.server = KVServer().start()
        self.kv = HttpKV(self.server.url)
        self.cluster: dict[str, list[str]] = {}
        for role in CLUSTER_ROLES:
            n = spec.instances(role)
            if n:
                self.cluster[role] = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.procs: dict[str, subprocess.Popen] = {}
        self.started_at: float | None = None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spec_file = self.workdir / "spec.json"
        self.spec_file.write_text(spec.to_json())

    def log_path(self, task: str) -> Path:
        return self.workdir / f"{task.replace(':', '_')}.log"

    def log(self, task: str) -> str:
        return self.log_path(task).read_text(errors="replace")

    def start(self, tasks: list[str] | None = None) -> "LocalCluster":
        self.started_at = time.monotonic()
        for task in tasks or self.tasks:
            role, index = task.split(":")
            env = {**os.environ, **self.env,
                   "TFYARN_SPEC_FILE": str(self.spec_file), "TFYARN_ROLE": role, "TFYARN_INDEX": index,
                   "TFYARN_KV": self.server.url, "TFYARN_APP_ID": "test", "TFYARN_HARNESS_CLUSTER":
                   json.dumps(self.cluster), "TFYARN_HARNESS_TARGET": self.targets.get(task, self.target),
                   "TF_CPP_MIN_LOG_LEVEL": "2",
                   "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), self.env.get("PYTHONPATH", ""),
                                                             os.environ.get("PYTHONPATH", "")) if p)}
            taskdir = self.workdir / task.replace(":", "_")
            taskdir.mkdir(exist_ok=True)
            with open(self.log_path(task), "w") as err:
                self.procs[task] = subprocess.Popen([sys.executable, str(HERE)], env=env, cwd=taskdir,
                                                    stdout=err, stderr=subprocess.STDOUT)
        return self

    def wait(self, timeout: float, tasks: list[str] | None = None, stop_on_failure: bool = True) -> dict[str, int]:
        """Wait for ``tasks`` (default all) to exit; on timeout kill every task and raise naming the ones still up.

        Like the launcher, a task exiting non-zero stops the others (``stop_on_failure``): their codes are then
        negative (killed) and the failing task's is positive.
        """
        deadline = time.monotonic() + timeout
        want = tasks or list(self.procs)
        while True:
            codes = {t: self.procs[t].poll() for t in want}
            if all(c is not None for c in codes.values()):
                return codes  # type: ignore[return-value]
            if stop_on_failure and any(c not in (None, 0) for c in codes.values()):
                self.kill()
                return {t: self.procs[t].poll() for t in want}  # type: ignore[misc]
            if time.monotonic() >= deadline:
                alive = [t for t, c in codes.items() if c is None]
                self.kill()
                tails = "\n".join(f"--- {t}\n{self.log(t)[-3000:]}" for t in alive)
                raise TimeoutError(f"tasks still running after {timeout:g}s: {', '.join(alive)}\n{tails}")
            time.sleep(0.1)

    def wait_key(self, key: str, timeout: float, what: str) -> str:
        """Wait for a KV key like ``kv.wait``, but fail at once (with the log tail) if any task exits non-zero."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.kv.get(key)
            if v is not None:
                return v
            bad = {t: p.poll() for t, p in self.procs.items() if p.poll() not in (None, 0)}
            if bad:
                raise RuntimeError(f"while waiting for {what}: {bad} exited\n" +
                                   "\n".join(f"--- {t}\n{self.log(t)[-3000:]}" for t in bad))
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} ({key})")
            time.sleep(0.1)

    def signal(self, task: str, sig: int) -> None:
        os.kill(self.procs[task].pid, sig)

    def kill(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        self.kill()
        self.server.stop()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _task_main() -> int:
    """Inside a task process: build the TaskContext from the env, set TF_CONFIG, call the target."""
    from tfyarn.tasklib.context import TaskContext, failure_key
    from tfyarn.tasklib.kv import HttpKV
    from tfyarn.spec import load_spec_json

    role, index = os.environ["TFYARN_ROLE"], int(os.environ["TFYARN_INDEX"])
    task = f"{role}:{index}"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [{task}] %(name)s: %(message)s")
    spec = load_spec_json(Path(os.environ["TFYARN_SPEC_FILE"]).read_text())
    cluster = json.loads(os.environ["TFYARN_HARNESS_CLUSTER"])
    port = int(cluster[role][index].rsplit(":", 1)[1]) if role in cluster else None
    kv = HttpKV(os.environ["TFYARN_KV"])
    ctx = TaskContext(spec=spec, role=role, index=index, kv=kv, cluster=cluster, port=port, workdir=Path.cwd(),
                      app_id="test")
    if role in cluster:
        os.environ["TF_CONFIG"] = ctx.tf_config_json()
    mod, _, fn = os.environ["TFYARN_HARNESS_TARGET"].partition(":")
    try:
        getattr(importlib.import_module(mod), fn)(ctx)
    except BaseException as exc:
        logging.getLogger("harness").exception("task %s failed", task)
        try:
            kv.put(failure_key(task), f"{type(exc).__name__}: {exc}"[:2000])
        except Exception:  # noqa: BLE001 - best effort: exit code 1 still reports the failure
            pass
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_task_main())


# ------------------------------------------------------------------------------------------------------- test data

RECOMMENDER_FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}


def write_recommender_files(directory: Path, sizes: list[int], seed: int = 0) -> list[str]:
    """TFRecord files of recommender examples with the given record counts (no TF: tfyarn.data's writer)."""
    import numpy as np
    from tfyarn.data.example import encode_example
    from tfyarn.data.tfrecord import TFRecordWriter

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i, n in enumerate(sizes):
        path = directory / f"part-{i:05d}.tfrecord"
        users, items = rng.integers(0, 1000, n), rng.integers(0, 1000, n)
        labels = ((users + items) % 3 == 0).astype(np.float32)       # learnable: a loss that can go down
        with TFRecordWriter(str(path)) as w:
            for u, it, y in zip(users, items, labels):
                w.write(encode_example({"label": [float(y)], "user_id": [int(u)], "item_id": [int(it)]},
                                       {"label": "float", "user_id": "int64", "item_id": "int64"}))
        paths.append(str(path))
    return paths


# ------------------------------------------------------------------------------------------------------ exports

def check_export_matches_checkpoint(spec, version_dir: str | Path, checkpoint: str) -> None:
    """The SavedModel in ``version_dir`` serves exactly the model of ``checkpoint`` (a committed checkpoint of the
    spec's checkpoint.dir): its serving signature's predictions equal those of the spec's model restored from the
    checkpoint (the evaluator's way), on a batch of ids covering the tables."""
    import numpy as np
    import tensorflow as tf
    from tfyarn.train.checkpoint import CheckpointStore, restore_model_variables
    from tfyarn.train.model import build_model, load

    store = CheckpointStore(spec.checkpoint.dir)
    entry = next(e for e in store.index()["checkpoints"] if e["name"] == checkpoint)
    import tempfile
    prefix = store.download(entry, tempfile.mkdtemp(prefix="export-check-"))
    model = build_model(load(spec.model, spec.params))
    restore_model_variables(model.variables, prefix, entry["model_variables"])
    rng = np.random.default_rng(5)
    feats = {k: rng.integers(0, 2000, 64).astype(np.int64) for k in ("user_id", "item_id")}
    want = model({k: tf.constant(v) for k, v in feats.items()}, training=False).numpy()
    serve = tf.saved_model.load(str(version_dir)).signatures["serving_default"]
    assert sorted(serve.structured_input_signature[1]) == ["item_id", "user_id"]   # the features, not the label
    got = serve(**{k: tf.constant(v) for k, v in feats.items()})["predictions"].numpy()
    assert got.shape == (64,) and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.std(got) > 0                         # a trained model, not a constant
