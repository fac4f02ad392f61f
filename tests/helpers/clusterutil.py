"""Helpers of the cluster suite (``pytest -m yarn``): real YARN + HDFS named by ``HADOOP_CONF_DIR``.

Why these shapes: the suite must stay within ~20 minutes on 2 cores, so one small synthetic data set is written once
per session, models are tiny, jobs run the node's Python (``environment.python`` = this interpreter: the
NodeManagers run on this machine) except where packing is what is tested, and every app carries this session's tag so
that a test asserts on its own apps and processes only (other people's jobs may share the cluster).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from launch_helpers import app_processes  # containers export TFYARN_APP_ID too
from tfyarn.backends.yarn import records
from tfyarn.spec import load_spec_dict

ROOT = Path(__file__).resolve().parents[2]
FAULT_JOBS = ROOT / "tests" / "functional" / "faults" / "jobs"
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}
#: Upper bound for one job on a loaded 2-core box (TF import in several containers at once is the slow part).
JOB_S = float(os.environ.get("TFYARN_TEST_YARN_TIMEOUT", "300"))

needs_yarn = [pytest.mark.yarn, pytest.mark.skipif(
    not os.environ.get("HADOOP_CONF_DIR"),
    reason="needs a live YARN cluster: set HADOOP_CONF_DIR (scripts/hadoop-cluster start prints it)")]


#: On every app the suite submits (one per pytest process): a test asserts on its own apps only.
SESSION_TAG = f"tfyarn-test-{uuid.uuid4().hex[:10]}"


def write_dataset(url: str) -> str:
    """The suites' skewed recommender data under ``url`` (4 files, the largest 3x the smallest); returns its glob.
    HDFS for the YARN suite, a local directory for the contract suite's local half: the same records."""
    from tfyarn.data.synth import write_synthetic
    write_synthetic(url, kind="recommender", files=4, records=4000, skew=3, seed=1, users=100, items=100)
    return url.rstrip("/") + "/*.tfrecord"


def unique(name: str) -> str:
    return f"{name}-{time.time_ns() % 10**12:012d}"


def job_doc(data: str, name: str, *, mode: str = "ps", sync: bool = True, ps: int = 1, workers: int = 1,
            epochs: int = 2, batch: int = 100, ckpt: str | None = None, every_steps: int | None = None,
            memory: str = "1 GiB", **over: Any) -> dict:
    """A small recommender job on ``data`` (a glob) run by this very Python on the nodes; ``over`` replaces keys."""
    roles: dict[str, Any] = {"chief": {"instances": 1, "memory": memory},
                             "worker": {"instances": workers, "memory": memory}}
    if mode == "ps":
        roles = {"ps": {"instances": ps, "memory": memory}, **roles}
    doc: dict[str, Any] = {
        "name": name, "model": "tfyarn.models.recommender:model", "mode": mode, "sync": sync,
        "params": {"num_users": 100, "num_items": 100, "dim": 8, "learning_rate": 0.2},
        "data": {"train": [data], "features": FEATURES, "batch_size": batch, "epochs": epochs},
        "roles": roles, "environment": {"python": sys.executable},
        "timeouts": {"rendezvous": 180, "stall": 180, "step": 120, "shutdown": 30, "allocation": 180},
        "tags": [SESSION_TAG, name],
    }
    if ckpt:
        doc["checkpoint"] = {"dir": ckpt, "every_steps": every_steps, "every_secs": None if every_steps else 600,
                             "keep": 3}
    doc.update(over)
    return doc


def job(*a: Any, **kw: Any):
    return load_spec_dict(job_doc(*a, **kw))


def planned_steps(spec) -> list[int]:
    """Steps per worker of each epoch, as every worker's planner computes them (reads the manifest from HDFS)."""
    from tfyarn.data import build_manifest, plan
    m = build_manifest(spec.data.train)
    return [plan(m, spec.num_training_workers, e, spec.data.shuffle_seed, spec.data.batch_size).steps
            for e in range(spec.data.epochs)]


# ---------------------------------------------------------------------------------------------- task processes
def task_process(backend, app_id: str, task: str, timeout: float = 60.0) -> psutil.Process:
    """The Python process of ``task`` (``role:index``): the container whose skein id the app's task map gives it."""
    deadline = time.monotonic() + timeout
    while True:
        live = backend.reader._live(app_id, records.saved_spec(app_id)) or {}
        ids = [cid for cid, t in (live.get("taskmap") or {}).items() if t == task]
        for p in app_processes(app_id):
            try:
                env = p.environ()
                if env.get("SKEIN_CONTAINER_ID") in ids and "tfyarn.task" in " ".join(p.cmdline()):
                    return p
            except psutil.Error:
                continue
        assert time.monotonic() < deadline, f"no live process for {task} of {app_id} within {timeout:g}s"
        time.sleep(0.5)


def wait_no_processes(app_id: str, timeout: float = 60.0) -> list[psutil.Process]:
    """[] once no process of ``app_id`` is left (the NodeManager cleans a container up within seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        left = app_processes(app_id)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def assert_clean(backend, *app_ids: str, tag: str | None = None) -> None:
    """Nothing of these apps is left: no process on this machine, no app of theirs (or with ``tag``) still active."""
    for app_id in app_ids:
        left = wait_no_processes(app_id)
        assert left == [], f"{app_id} left processes: {[(p.pid, p.cmdline()[:4]) for p in left]}"
        assert backend.status(app_id).state.is_terminal, f"{app_id} still active"
    if tag:
        active = [a.app_id for a in backend.list() if tag in a.tags]
        assert active == [], f"apps tagged {tag} still active: {active}"


def wait_until(pred: Callable[[], Any], timeout: float, what: str, poll: float = 1.0) -> Any:
    """``pred()``'s first truthy value; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(poll)


def wait_for_step(backend, app_id: str, task: str, step: int, timeout: float = JOB_S) -> int:
    """Wait until ``task`` reports local step >= ``step`` (from the app's KV); fails if the app ends first."""
    def reached():
        st = backend.status(app_id)
        now = int((st.progress.get("per_task") or {}).get(task) or 0)
        assert not st.state.is_terminal, f"{app_id} ended ({st.state.value}: {st.diagnostics}) before {task} " \
                                          f"step {step}"
        return now if now >= step else 0
    return wait_until(reached, timeout, f"{task} of {app_id} to reach step {step}", poll=0.5)


# --------------------------------------------------------------------------------------------------------- CLI
def tfyarn(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it (a new process: its own skein driver, unless a global one runs)."""
    return subprocess.run([sys.executable, "-m", "tfyarn.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def submitted_by(proc: subprocess.Popen, find: Callable[[], Any], timeout: float, what: str) -> Any:
    """``find()``'s first truthy value while the background CLI ``proc`` runs: its stdout/stderr in the failure if
    it exits before ``find`` sees anything."""
    def found() -> Any:
        v = find()
        if not v and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the CLI exited ({proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-4000:]}")
        return v
    return wait_until(found, timeout, what)


class CliRun:
    """``tfyarn run JOB --yarn --output json`` of a job doc in the background, as a gateway a test acts beside (kills
    a task, the AM, a NodeManager); killed on the way out of the ``with`` unless it has ended."""

    def __init__(self, doc: dict, tmp_path: Path):
        import yaml

        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(doc))
        self.proc = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "run", str(path), "--yarn", "--output",
                                      "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def __enter__(self) -> CliRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def submitted(self, find: Callable[[], Any], timeout: float, what: str) -> Any:
        """``find()``'s first truthy value (the app the CLI submits), failing at once with the CLI's stderr if it
        exits first: a broken submit shows in seconds, not after ``timeout``."""
        return submitted_by(self.proc, find, timeout, what)

    def status(self, timeout: float) -> dict:
        """The final status it printed, once it exited 0 within ``timeout`` s (its stderr's tail otherwise)."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err[-4000:]
        return json.loads(out)


def attempt_record(yarn, app_id: str, attempt: int) -> dict | None:
    """How in-app attempt ``attempt`` of ``app_id`` ended (KV ``attempts/<n>``, put by its supervisor), or None
    while it has not ended."""
    raw = yarn.client().connect(app_id).kv.get(f"attempts/{attempt}")
    return json.loads(raw.decode()) if raw else None


def read_json(url: str) -> Any:
    import fsspec
    with fsspec.open(url, "rt") as f:
        return json.load(f)


def hdfs_exists(url: str) -> bool:
    import fsspec
    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(path)


def watch_end(backend, app_id: str, timeout: float = JOB_S) -> Callable[[], Any]:
    """The end record (KV ``control/end``, :mod:`tfyarn.contracts.job_end`) its ender puts before
    shutting the app down, caught live: the KV dies with the app. A thread waits for the key on the
    running app's own client (taken out of the backend's cache: the backend's kill or status reads
    do not close it). Call the result after the end: the :class:`JobEnd`, or an assertion error."""
    import threading

    from tfyarn.contracts.job_end import JobEnd
    from tfyarn.contracts.kv_keys import END_KEY
    from tfyarn.task.yarn.kv_yarn import SkeinKV

    app = wait_until(lambda: backend.conn.app_client(app_id), timeout,
                     f"the application master of {app_id}", poll=0.5)
    backend.conn._apps.pop(app_id, None)
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(SkeinKV(app.kv).wait(END_KEY, timeout, f"{app_id}'s end record"))
        except Exception as exc:  # noqa: BLE001 - reported by the caller's assertion
            got.append(exc)

    t = threading.Thread(target=run, name="test-watch-end", daemon=True)
    t.start()

    def result() -> JobEnd:
        t.join(timeout)
        assert got and isinstance(got[0], str), f"no end record of {app_id}: {got}"
        end = JobEnd.from_json(got[0])
        assert end is not None, got[0]
        return end
    return result


#: A busy loop that ends with its parent (pytest killed: no orphan spinning) and after HOG_MAX_S in any case.
HOG_MAX_S = 1800
_HOG = (
    "import os, time\n"
    "parent, end = os.getppid(), time.monotonic() + {limit}\n"
    "while os.getppid() == parent and time.monotonic() < end:\n"
    "    for _ in range(200000):\n"
    "        pass\n"
)


class CpuHog:
    """``n`` busy-loop processes at normal priority (they compete with the job's containers for real: issue 40's
    failure showed at load 30-47 only), one per core and at least 2 by default; a context manager that stops them
    whatever happens (by pid) and says how much CPU they took (:attr:`cpu_s`, over :attr:`wall_s`)."""

    def __init__(self, n: int | None = None):
        self.n = n or max(2, os.cpu_count() or 2)
        self.procs: list[subprocess.Popen] = []
        self.cpu_s = self.wall_s = 0.0

    def __enter__(self) -> "CpuHog":
        self.t0 = time.monotonic()
        code = _HOG.format(limit=HOG_MAX_S)
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        return self

    def used(self) -> float:
        """CPU seconds the hog processes have used so far."""
        total = 0.0
        for p in self.procs:
            try:
                t = psutil.Process(p.pid).cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.wall_s = time.monotonic() - self.t0
        self.cpu_s = self.used()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(30)
        print(f"cpu hog: {self.n} busy loops used {self.cpu_s:.0f} CPU s in {self.wall_s:.0f} s "
              f"(load average now {os.getloadavg()[0]:.1f})")
        # a hog that got nothing did not load the box: the run did not test what it says (at load 37 on 2 cores
        # two busy loops got 7 % of a core between them: their share of a saturated box)
        assert kind is not None or self.cpu_s >= 0.02 * self.wall_s, (
            f"the CPU hog took only {self.cpu_s:.1f} CPU s in {self.wall_s:.0f} s")


def assert_causes_named(causes: list[dict], restarts: int) -> None:
    """Every restart and attempt of a run has its cause and the triage rule that decided in the status' ``causes``
    (issue 40): at least ``restarts`` of them, each with words and a rule."""
    assert len(causes) >= restarts, (restarts, causes)
    for c in causes:
        assert c.get("words") and c.get("rule") and c.get("task"), c


@pytest.fixture
def cpu_hog():
    """The box's cores saturated by :class:`CpuHog` for the test's duration (stopped whatever happens)."""
    with CpuHog() as hog:
        yield hog


# ------------------------------------------------------------------------------------------ a job's Python
def python_without_tensorflow(dest: Path) -> str:
    """A real Python with tfyarn's own dependencies (pyproject's ``dependencies``, with theirs) and no TensorFlow:
    a venv of this interpreter whose site-packages links exactly those distributions' files from this one's (no
    download, < 1 s). The nodes run it as a job's ``environment.python``; tfyarn itself is shipped."""
    import re
    import tomllib
    import venv
    from importlib import metadata

    venv.EnvBuilder(with_pip=False, symlinks=True).create(dest)
    site = next(dest.glob("lib/python*/site-packages"))
    todo = [re.split(r"[ <>=!;\[(~]", r, maxsplit=1)[0]
            for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        todo += [re.split(r"[ <>=!;\[(~]", r, maxsplit=1)[0] for r in dist.requires or () if "extra ==" not in r]
        for top in {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (site / top).exists():
                (site / top).symlink_to(src)
    assert "tensorflow" not in seen
    return str(dest / "bin" / "python")
