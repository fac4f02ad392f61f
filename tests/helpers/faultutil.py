"""Helpers of the fault-injection suite: a tiny real ps job (1 ps + chief + 1 worker), a way to wait for a task's
step, and to signal a task's process found by its task dir (the launcher's processes, not mocks)."""
from __future__ import annotations

import time
from pathlib import Path

import psutil

from launch_helpers import app_processes, task_processes, task_step, wait_for_step  # noqa: F401 - re-exported
from tfyarn.spec import load_spec_dict

JOBS = Path(__file__).resolve().parents[1] / "functional" / "faults" / "jobs"
FEATURES = {"label": {"dtype": "float32"}, "user_id": {"dtype": "int64"}, "item_id": {"dtype": "int64"}}


def write_data(root: Path, records: int = 2400, files: int = 2, seed: int = 5) -> list[str]:
    from tfyarn.data import write_synthetic
    return write_synthetic(str(root), "recommender", files=files, records=records, skew=1.5, seed=seed,
                           users=100, items=100)


def fault_spec(tmp_path: Path, *, train=None, sync: bool = False, batch: int = 50, epochs: int = 2,
               delay: float = 0.05, worker: dict | None = None, retry: dict | None = None,
               checkpoint_every: int | None = None, timeouts: dict | None = None, data: dict | None = None,
               workers: int = 1):
    """1 ps + chief + ``workers`` workers training ``slow_recommender`` (``delay`` s per step) on small data.

    Timeouts are short enough that a fault is diagnosed in seconds, and still generous for a loaded 2-core box
    (TF import + rendezvous can take 10 s there)."""
    doc = {
        "name": "faults", "model": "fault_models:slow_recommender", "code": str(JOBS), "mode": "ps", "sync": sync,
        "params": {"num_users": 100, "num_items": 100, "dim": 4, "learning_rate": 0.2, "step_delay_s": delay},
        "data": {"train": train or write_data(tmp_path / "data"), "features": FEATURES, "batch_size": batch,
                 "epochs": epochs, **(data or {})},
        "roles": {"ps": {"instances": 1}, "chief": {"instances": 1},
                  "worker": {"instances": workers, **(worker or {})}},
        "timeouts": {"rendezvous": 90, "stall": 60, "step": 60, "shutdown": 15, **(timeouts or {})},
    }
    if retry:
        doc["retry"] = retry
    if checkpoint_every:
        doc["checkpoint"] = {"dir": f"file://{tmp_path / 'ckpt'}", "every_steps": checkpoint_every,
                             "every_secs": None, "keep": 3}
    return load_spec_dict(doc)


def planned_steps(spec) -> list[int]:
    """Steps per worker of each epoch, as the planner gives them to every worker."""
    from tfyarn.data import build_manifest, plan
    m = build_manifest(spec.data.train)
    return [plan(m, spec.num_training_workers, e, spec.data.shuffle_seed, spec.data.batch_size).steps
            for e in range(spec.data.epochs)]


def task_process(app_id: str, task: str, timeout: float = 30.0) -> psutil.Process:
    """The live process of ``task`` (role:index) of a local app (``launch_helpers.task_processes``)."""
    deadline = time.monotonic() + timeout
    while True:
        p = task_processes(app_id).get(task)
        if p is not None:
            return p
        assert time.monotonic() < deadline, f"no live process for {task} of {app_id} within {timeout:g}s"
        time.sleep(0.1)


def corrupt_record(path: str, index: int) -> int:
    """Flip one byte inside the payload of record ``index`` of an uncompressed TFRecord file (its data CRC no longer
    matches; the framing stays intact). Returns the record's byte offset."""
    import struct
    data = bytearray(Path(path).read_bytes())
    off = 0
    for _ in range(index):
        (n,) = struct.unpack_from("<Q", data, off)
        off += 12 + n + 4
    (n,) = struct.unpack_from("<Q", data, off)
    assert n > 8, f"record {index} of {path} is too short to corrupt"
    data[off + 12 + n // 2] ^= 0x40
    Path(path).write_bytes(bytes(data))
    return off
