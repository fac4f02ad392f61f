"""A task's logs live on the real cluster (``pytest -m yarn``): ``logs -f`` streams every line once and ends with
the app. Which task died and how (kill -9 → exit code 137 in the status and the application's diagnostics) and the
attempt of a retry's application are checked by test_cluster_faults.py's attempts test; an async ps worker
restarted in its own slot (worker:1 restarting, its rejoin counted) by test_cluster_hosts.py, on the other host.

Each job is small: this very Python on the nodes, the session's tiny data set on HDFS (conftest ``dataset``).
"""
import os
import subprocess
import sys
import threading
import time

import pytest

from clusterutil import JOB_S, assert_clean, job, needs_yarn, unique
from tfyarn import runner
from tfyarn.backends.base import AppState

pytestmark = [*needs_yarn, pytest.mark.timeout(2 * JOB_S)]

TICKER = '''
import time
from tfyarn.train import custom_train


@custom_train
def ticker(ctx, helpers):
    """Prints numbered lines over time: what `logs -f` must stream, each line once."""
    for i in range(int(helpers.params["lines"])):
        print(f"tick {ctx.task_id} {i}", flush=True)
        time.sleep(float(helpers.params["every_s"]))
    return {"ticks": int(helpers.params["lines"])}
'''


@pytest.fixture
def owned(yarn):
    """Apps a test submits: killed at its end if a failed assertion left one running."""
    apps = []
    yield apps
    for app_id in apps:
        if not yarn.status(app_id).state.is_terminal:
            yarn.kill(app_id)


def test_logs_follow_streams_every_line_once_and_ends_with_the_app(yarn, dataset, tmp_path, owned):
    """`tfyarn logs APP --task chief:0 -f` (the CLI, as a user runs it): lines arrive while the job runs, every one
    once and in order, none of the NodeManager's header or footer, and the command returns when the app ends."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "ticker.py").write_text(TICKER)
    lines = 40
    spec = job(dataset, unique("logs-f"), mode="allreduce", workers=1, model="ticker:ticker", code=str(code),
               params={"lines": lines, "every_s": 0.25})
    app_id = yarn.submit(spec)
    owned.append(app_id)
    proc = subprocess.Popen([sys.executable, "-m", "tfyarn.cli", "logs", app_id, "--task", "chief:0", "-f"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    got = []                                                    # (time received, line)

    def read():
        for line in proc.stdout:
            got.append((time.time(), line.rstrip("\n")))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        st = runner.wait(yarn, app_id, timeout=JOB_S)
        assert st.state is AppState.SUCCEEDED, st.diagnostics
        rc = proc.wait(timeout=90)                              # the aggregated-log wait is bounded by 30 s
        ended = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    assert rc == 0, proc.stderr.read()[-2000:]
    texts = [t for _, t in got]
    assert all(t.startswith("chief:0 | ") for t in texts), texts[:5]
    ticks = [t[len("chief:0 | "):] for t in texts if "| tick " in t]
    assert ticks == [f"tick chief:0 {i}" for i in range(lines)]      # every line once, in order
    for junk in ("End of LogType", "may not be complete", "LogContents:", "LogLength:", "*" * 20):
        assert not any(junk in t for t in texts), junk
    first_tick = next(ts for ts, t in got if "| tick " in t)
    assert first_tick < st.finished, "lines stream while the job runs, not only at the end"
    assert ended - st.finished < 60
    assert_clean(yarn, app_id)
