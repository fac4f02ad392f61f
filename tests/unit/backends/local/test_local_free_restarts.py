"""The local launcher restarts an async ps worker whose failure is the cluster's (issue 40: TF's "RunGraph request
received twice" from the ps) without using ``max_restarts``, up to ``retry.cluster_faults``, as the YARN exit report
does; the model's own AbortedError uses the budget, and a sync job's worker never rejoins."""

from __future__ import annotations

from types import SimpleNamespace

from tfyarn.backends.local.processes import TaskProcess as _Task
from tfyarn.runner.local_app import Launcher
from tfyarn.spec import load_spec_dict

TWICE = ("AbortedError: Graph execution error: From /job:ps/replica:0/task:0: "
         "The same RunGraph (Worker) request was received twice.")


def _launcher(sync: bool, faults: int = 2):
    spec = load_spec_dict({
        "name": "free", "model": "tfyarn.models.recommender:model", "mode": "ps", "sync": sync,
        "data": {"train": ["/tmp/x-*.tfrecord"], "features": {"label": {"dtype": "float32"}}, "batch_size": 8},
        "roles": {"ps": {"instances": 1}, "chief": {"instances": 1},
                  "worker": {"instances": 1, **({} if sync else {"max_restarts": 0})}},
        "retry": {"cluster_faults": faults},
    })
    fake = SimpleNamespace(spec=spec, _stop=SimpleNamespace(is_set=lambda: False))
    fake._free_restart = lambda task, code: Launcher._free_restart(fake, task, code)
    return fake


def test_a_peers_error_restarts_an_async_worker_free_of_max_restarts_up_to_the_bound(tmp_path):
    fake = _launcher(sync=False)
    task = _Task("worker:0", tmp_path, exit_code=1, diagnostics=TWICE)
    for n in (1, 2):
        assert Launcher._restartable(fake, task) and task.free_restarts == n
        task.restarts += 1
    assert not Launcher._restartable(fake, task)  # retry.cluster_faults 2 used, max_restarts 0
    own = _Task("worker:0", tmp_path, exit_code=1, diagnostics="AbortedError: model gave up")
    assert not Launcher._restartable(fake, own) and own.free_restarts == 0
    fake = _launcher(sync=True)
    sync = _Task("worker:0", tmp_path, exit_code=1, diagnostics=TWICE)
    assert not Launcher._restartable(fake, sync) and sync.free_restarts == 0  # a lockstep job: a new attempt
