"""The tasks' Python on a local run (tfyarn.gateway.task_python): ``environment.python`` is what a local run starts its
tasks with, as YARN's containers do, and one that cannot start a task is refused before anything starts, in the words
of a container that cannot start (issue 41)."""
import sys
from pathlib import Path

import pytest

from launch_helpers import small_spec
from tfyarn import api
from tfyarn.backends.base import AppState
from tfyarn.errors import PreflightError
from tfyarn.gateway import task_python
from tfyarn.spec import load_spec_dict

pytestmark = pytest.mark.timeout(180)
DEBIAN_PYTHON = "/usr/bin/python3"  # Debian's own: none of tfyarn's dependencies


@pytest.mark.skipif(not Path(DEBIAN_PYTHON).exists(), reason="no /usr/bin/python3 on this machine")
def test_a_python_without_tfyarns_dependencies_is_refused_naming_the_module_and_the_python(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, environment={"python": DEBIAN_PYTHON}))
    problems = task_python.check_local(spec)
    assert len(problems) == 1 and problems[0].startswith("environment.python: cannot start: No module named"), problems
    assert f"(python {DEBIAN_PYTHON} " in problems[0], problems
    with pytest.raises(PreflightError, match="nothing was started") as err:
        api.run(spec, backend="local")
    assert "cannot start: No module named" in str(err.value)


def test_a_missing_python_is_refused(tmp_path):
    spec = load_spec_dict(small_spec(tmp_path, environment={"python": str(tmp_path / "no-such-python")}))
    assert task_python.check_local(spec) == [
        f"environment.python: {tmp_path / 'no-such-python'} is not an executable file on this machine (a local run "
        "starts its tasks with it)"]


def test_the_tasks_of_a_local_run_start_with_environment_python(tmp_path):
    """A wrapper around this Python that leaves a mark per process it starts: the start-up check and the fork server
    (or each task) ran in it, and the job trained."""
    marks = tmp_path / "started"
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\ncase "$1" in -c) echo "$$ -c";; *) echo "$$ $1 $2";; esac >> {marks}\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    spec = load_spec_dict(small_spec(tmp_path, environment={"python": str(wrapper)}))
    assert task_python.local_python(spec) == str(wrapper) and task_python.check_local(spec) == []
    started_by_check = marks.read_text().splitlines()
    assert [line.split()[1] for line in started_by_check] == ["-c"], started_by_check  # the start-up check, once
    st = api.run(spec, backend="local")
    assert st.state is AppState.SUCCEEDED, st.diagnostics
    ran = marks.read_text().splitlines()[len(started_by_check):]
    # preflight's check again, then the fork server (or each task): python -m tfyarn.task...
    assert any("-m tfyarn.task" in line for line in ran), ran
    assert all("-m tfyarn.task" in line or line.endswith(" -c") for line in ran), ran
