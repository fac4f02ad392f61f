"""JobSpec → skein.ApplicationSpec through real skein objects, and the container script actually run by bash."""
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import skein
import yaml

from yarnutil import make_spec
from tfyarn.backends.yarn import appspec
from tfyarn.backends.yarn.backend import YarnBackend
from tfyarn.errors import TfyarnError
from tfyarn.backends.yarn.appspec import Shipped, build_application_spec, container_script, write_spec_file
from tfyarn.gateway.packaging import EnvRef
from tfyarn.contracts.triage import FREE_RESTARTS

ENV = EnvRef("pack", "./env/bin/python", archive_url="hdfs://nn:8020/user/alice/.tfyarn/envs/env-venv-abc.tar.gz",
             env_hash="abc", kind="venv")


def shipped(**kw):
    d = dict(env=ENV, spec_file="/tmp/s/spec.json", tfyarn_src="/tmp/s/tfyarn.zip", code="/tmp/s/code.zip")
    d.update(kw)
    return Shipped(**d)


def test_round_trip_and_fields(spec):
    app = build_application_spec(spec, shipped(), master_memory_mib=1024, master_vcores=2,
                                 file_systems=["hdfs://other-ns"])
    assert isinstance(app, skein.ApplicationSpec)
    for text in (app.to_yaml(), appspec.to_yaml(app)):
        assert skein.ApplicationSpec.from_yaml(text) == app
    assert skein.ApplicationSpec.from_json(app.to_json()) == app
    assert skein.ApplicationSpec.from_protobuf(app.to_protobuf()).services == app.services

    assert (app.name, app.queue, app.user) == ("yarn-test", "ml", "alice")
    assert app.tags == {"tfyarn", "tfyarn-name:yarn-test", "team-a", "nightly", "tfyarn-supervised"}
    assert app.file_systems == ["hdfs://other-ns"]
    assert app.master.resources == skein.Resources(memory=1024, vcores=2)
    assert app.acls == skein.ACLs(enable=True, view_users=["bob"], modify_groups=["ml-ops"], ui_users=["*"])
    assert set(app.services) == {"ps", "chief", "worker", appspec.SUPERVISOR_SERVICE}
    sup = app.services[appspec.SUPERVISOR_SERVICE]  # not a task: small, restarted if killed; fails the app only when
    # it cannot start (its script exits 0 once it has: test_the_supervisor_container_exits_0_once_started…)
    assert (sup.instances, sup.resources.vcores, sup.max_restarts, sup.allow_failures) == (
        1, 1, appspec.SUPERVISOR_RESTARTS, False)
    assert sup.resources.memory == appspec.SUPERVISOR_MEMORY_MIB and "TFYARN_ROLE" not in sup.env
    assert set(sup.files) == {"env", "tfyarn_src", "tfyarn-spec.json"}
    assert f"-m {appspec.SUPERVISOR_MODULE} || code=$?\n" in sup.script and sup.script.endswith("exit 0\n")
    assert "tfyarn.task" not in sup.script.replace(appspec.SUPERVISOR_MODULE, "")
    w = app.services["worker"]
    assert (w.instances, w.resources.memory, w.resources.vcores, w.resources.gpus) == (3, 4096, 4, 1)
    assert w.node_label == "gpu" and w.max_restarts == (2 + FREE_RESTARTS) * 3
    assert w.allow_failures     # supervised: skein never fails the app itself (the exit report or supervisor ends it)
    # skein restarts per service; tfyarn per task: 3 workers x 2 restarts each share one budget of 6 (held by the
    # exit report), and async ps workers get FREE_RESTARTS more each from skein for preemptions and lost nodes
    assert w.env == {"TF_CPP_MIN_LOG_LEVEL": "2", "TFYARN_ROLE": "worker", "TFYARN_ATTEMPT": "0"}
    assert "TFYARN_KV" not in w.env and "TFYARN_INDEX" not in w.env
    assert app.services["chief"].resources == skein.Resources(memory=3072, vcores=2)
    assert app.services["ps"].resources.memory == 1024 and app.services["ps"].node_label == ""
    files = w.files
    assert set(files) == {"env", "tfyarn_src", "code", "tfyarn-spec.json"}
    assert files["env"].source == ENV.archive_url
    assert str(files["env"].type) == "ARCHIVE" and str(files["env"].visibility) == "PRIVATE"
    assert str(files["code"].type) == "ARCHIVE" and files["code"].source == "file:///tmp/s/code.zip"
    assert str(files["tfyarn-spec.json"].type) == "FILE"


def test_sidecar_tensorboard_and_zero_instance_roles():
    s = make_spec(roles={"worker": {"instances": 2}, "ps": {"instances": 1}, "evaluator": {"instances": 0},
                         "tensorboard": {"instances": 1, "env": {"TMPDIR": "/scratch"}}},
                  checkpoint={"dir": "hdfs:///ckpt"})
    app = build_application_spec(s, shipped())
    assert set(app.services) == {"worker", "ps", "tensorboard", appspec.SUPERVISOR_SERVICE}
    assert set(build_application_spec(s, shipped(), supervise=False).services) == {"worker", "ps", "tensorboard"}
    assert app.services["tensorboard"].allow_failures and app.services["worker"].allow_failures
    bare = build_application_spec(s, shipped(), supervise=False)     # no supervisor: skein fails the app as ever
    assert bare.services["tensorboard"].allow_failures and not bare.services["worker"].allow_failures
    # a role whose env sets TMPDIR keeps it; the others get the container's own tmp/
    assert 'export TMPDIR="$PWD/tmp"' in app.services["worker"].script
    assert "TMPDIR" not in app.services["tensorboard"].script
    assert app.services["tensorboard"].env["TMPDIR"] == "/scratch"


def test_python_source_ships_no_env_and_kerberos_ships_no_keytab(tmp_path):
    """Tasks read HDFS with delegation tokens: neither the keytab nor its path reaches the app, its YAML or the spec
    file the tasks read (tfyarn.cluster.kerberos)."""
    kt = tmp_path / "me.keytab"
    kt.write_bytes(b"\x05\x02secret")
    kt.chmod(0o600)
    s = make_spec(environment={"python": "/opt/py 3/bin/python"}, kerberos={"principal": "me@EX", "keytab": str(kt)})
    spec_file = write_spec_file(s, tmp_path / "ship")
    app = build_application_spec(s, shipped(env=EnvRef("python", "/opt/py 3/bin/python"), code=None,
                                            spec_file=spec_file))
    w = app.services["worker"]
    assert set(w.files) == {"tfyarn-spec.json", "tfyarn_src"}
    text = app.to_yaml() + Path(spec_file).read_text()
    assert "secret" not in text and str(kt) not in text and "me.keytab" not in text
    assert "kinit" not in w.script and not any("KRB" in k for k in w.env)
    assert "\n'/opt/py 3/bin/python' -m tfyarn.task || code=$?\n" in w.script


def test_the_supervisor_container_exits_0_once_started_and_fails_the_app_when_it_cannot_start(tmp_path):
    """A supervisor that crashes (or is killed) after it started must not fail the job: skein would count a
    non-zero exit (its service allows none). One that could not start (no marker file) must (issue 41): its exit
    fails the app at once, its log says why."""
    script = container_script(ENV, code=False, supervisor=True)
    env = {"PATH": os.environ["PATH"], "SKEIN_APPLICATION_ID": "application_1_0007"}
    started = f"#!/bin/sh\necho \"ARGS $*\"; touch {appspec.SUPERVISOR_STARTED}; exit 3\n"
    cdir = _fake_container_dir(tmp_path / "a", script, started)
    r = subprocess.run(["bash", "script.sh"], cwd=cdir, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and f"ARGS -m {appspec.SUPERVISOR_MODULE}" in r.stdout, (r.stdout, r.stderr)
    assert "-c" not in r.stdout  # no check: it had started
    cdir = _fake_container_dir(tmp_path / "b", script, "#!/bin/sh\necho \"ARGS $*\"; exit 3\n")
    r = subprocess.run(["bash", "script.sh"], cwd=cdir, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 3 and "ARGS -c " in r.stdout and r.stdout.rstrip().endswith("3 supervisor"), r.stdout
    killed = "#!/bin/sh\nkill -9 $$\n"  # killed before its marker (the app's own shutdown): not a start failure
    cdir = _fake_container_dir(tmp_path / "c", script, killed)
    r = subprocess.run(["bash", "script.sh"], cwd=cdir, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, (r.stdout, r.stderr)


def test_a_task_whose_python_lacks_tfyarn_says_so_and_keeps_its_exit_code(tmp_path):
    """The exit report cannot run (it needs tfyarn and skein): the container script's stdlib check names the missing
    module and the interpreter in the log, and the container exits with the task's own code (YARN: FAILED)."""
    from tfyarn.contracts import startup
    script = container_script(EnvRef("python", "/usr/bin/python3"), code=False)
    if subprocess.run(["/usr/bin/python3", "-c", "import pydantic"], capture_output=True).returncode == 0:
        pytest.skip("/usr/bin/python3 has pydantic here")
    cdir = _fake_container_dir(tmp_path, script, "#!/bin/sh\nexit 0\n")
    r = subprocess.run(["bash", "script.sh"], cwd=cdir, capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ["PATH"], "TFYARN_ROLE": "chief"})
    assert r.returncode == 1, (r.stdout, r.stderr)
    code, why = startup.parse_log(r.stderr)
    assert code == 1 and why.startswith("cannot start: No module named 'pydantic' (python /usr/bin/python3 3."), why
    script = container_script(EnvRef("python", str(tmp_path / "no-such-python")), code=False)
    (cdir / "script.sh").write_text(script)
    r = subprocess.run(["bash", "script.sh"], cwd=cdir, capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ["PATH"]})
    assert r.returncode == 127 and startup.parse_log(r.stderr) == (
        127, f"cannot start: python {tmp_path / 'no-such-python'} did not run (environment)"), r.stderr


def _fake_container_dir(tmp_path, script, python_impl):
    """A directory laid out the way YARN localizes our files (env/, tfyarn_src/, code/, tfyarn-spec.json)."""
    cdir = tmp_path / "container"
    (cdir / "env" / "bin").mkdir(parents=True)
    py = cdir / "env" / "bin" / "python"
    py.write_text(python_impl)
    py.chmod(0o755)
    src_zip = appspec.build_tfyarn_zip(tmp_path / "ship")
    zipfile.ZipFile(src_zip).extractall(cdir / "tfyarn_src")
    (cdir / "code").mkdir()
    (cdir / "tfyarn-spec.json").write_text("{}")
    (cdir / "script.sh").write_text(script)
    return cdir


def test_container_script_exports_the_task_contract_and_execs_runtime(tmp_path):
    script = container_script(ENV, code=True)
    dump = tmp_path / "dump.txt"
    cdir = _fake_container_dir(tmp_path, script, f'#!/bin/sh\n{{ echo "ARGS $*"; env; }} > {dump}\n')
    env = {"PATH": os.environ["PATH"], "SKEIN_APPLICATION_ID": "application_1_0007",
           "SKEIN_CONTAINER_ID": "worker_2", "CONTAINER_ID": "container_1_0007_01_000004",
           "TFYARN_ROLE": "worker", "TFYARN_KV": "http://leak", "PYTHONPATH": "/site/extra"}
    res = subprocess.run(["bash", "script.sh"], cwd=cdir, env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "[tfyarn] container worker_2 yarn=container_1_0007_01_000004" in res.stderr
    out = dump.read_text().splitlines()
    vals = dict(line.split("=", 1) for line in out if "=" in line and not line.startswith("ARGS"))
    assert out[0] == "ARGS -m tfyarn.task"
    assert vals["TFYARN_APP_ID"] == "application_1_0007"
    assert vals["TFYARN_SPEC_FILE"] == f"{cdir}/tfyarn-spec.json"
    assert vals["TFYARN_CODE_DIR"] == f"{cdir}/code"
    assert vals["PYTHONPATH"] == f"{cdir}/tfyarn_src:/site/extra"
    assert vals["TFYARN_KV"] == "skein:" and "TFYARN_INDEX" not in vals
    # temporary files in the container's directory (YARN deletes it with the container), created by the script
    assert vals["TMPDIR"] == f"{cdir}/tmp" and (cdir / "tmp").is_dir()


def test_a_task_that_dies_is_reported_and_the_container_keeps_its_exit_code(tmp_path):
    """kill -9 of the task's Python: the script (still alive: Python is its child) runs the exit report with 137 and
    when it died, then exits 137 itself, as the container would have with ``exec``."""
    script = container_script(ENV, code=False)
    calls = tmp_path / "calls.txt"
    fake = (f'#!/bin/bash\necho "$*" >> {calls}\n'
            'if [ "$2" = tfyarn.task ]; then kill -9 $$; fi\n'
            'exit 0\n')
    cdir = _fake_container_dir(tmp_path, script, fake)
    t0 = time.time()
    res = subprocess.run(["bash", "script.sh"], cwd=cdir, capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"]})
    assert res.returncode == 137, res.stderr
    first, report = calls.read_text().splitlines()
    assert first == "-m tfyarn.task"
    mod, code, died = report.split()[1:]
    assert mod == "tfyarn.task.yarn.exit_report" and code == "137" and t0 - 1 <= float(died) <= time.time()
    calls.unlink()                                          # a task that succeeds: no report
    cdir2 = _fake_container_dir(tmp_path / "ok", script, f'#!/bin/bash\necho "$*" >> {calls}\n')
    res = subprocess.run(["bash", "script.sh"], cwd=cdir2, capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"]})
    assert res.returncode == 0 and calls.read_text().splitlines() == ["-m tfyarn.task"]


def test_a_role_that_sets_tmpdir_keeps_it(tmp_path):
    script = container_script(ENV, code=False, own_tmpdir=False)
    dump = tmp_path / "dump.txt"
    cdir = _fake_container_dir(tmp_path, script, f'#!/bin/sh\nenv > {dump}\n')
    res = subprocess.run(["bash", "script.sh"], cwd=cdir, capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"], "TMPDIR": "/scratch/mine"})
    assert res.returncode == 0, res.stderr
    assert "TMPDIR=/scratch/mine" in dump.read_text().splitlines() and not (cdir / "tmp").exists()


def test_shipped_tfyarn_source_is_what_imports(tmp_path):
    """The zip put on PYTHONPATH wins over any tfyarn installed in the env (the gateway's code runs)."""
    cdir = _fake_container_dir(tmp_path, "", "")
    res = subprocess.run([sys.executable, "-c", "import tfyarn.task.yarn.kv_yarn as m; print(m.__file__)"],
                         env={"PYTHONPATH": str(cdir / "tfyarn_src"), "PATH": os.environ["PATH"]},
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(str(cdir / "tfyarn_src" / "tfyarn"))


def test_zips_are_content_addressed(tmp_path):
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "m.py").write_text("X = 1\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "junk.pyc").write_bytes(b"x")
    a = appspec.build_code_zip(code, tmp_path / "ship")
    assert appspec.build_code_zip(code, tmp_path / "ship2") .rsplit("/", 1)[1] == a.rsplit("/", 1)[1]
    assert zipfile.ZipFile(a).namelist() == ["pkg/m.py"]
    (code / "pkg" / "m.py").write_text("X = 2\n")
    assert appspec.build_code_zip(code, tmp_path / "ship") != a
    assert appspec.build_code_zip(code, tmp_path / "nowrite", write=False) and not (tmp_path / "nowrite").exists()


def test_backend_dryrun_is_loadable_and_writes_nothing(tmp_path, monkeypatch, spec):
    monkeypatch.setenv("TFYARN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path / "noconf"))
    b = YarnBackend(staging_dir="hdfs://nn:8020/user/alice/.tfyarn")
    request = b.dryrun(spec)
    text = str(request)
    app = skein.ApplicationSpec.from_yaml(text)
    assert app == request.app
    assert text == str(b.dryrun(spec))                             # stable: same spec → same YAML
    src = app.services["worker"].files["env"].source
    assert src.startswith("hdfs://nn:8020/user/alice/.tfyarn/envs/env-venv-") and src.endswith(".tar.gz")
    assert f"# environment: this Python's venv packed to {src} (packed and uploaded at submit" in text
    assert f"# ships: {request.shipped.spec_file}" in text and str(tmp_path / "cache" / "ship") in text
    assert not (tmp_path / "cache").exists()
    assert yaml.safe_load(text)["tags"] == sorted(yaml.safe_load(text)["tags"])


def test_submit_sends_exactly_the_dry_run_request_and_refuses_a_stale_one(tmp_path, monkeypatch):
    """torchx's schedule(submit_dryrun(…)): the ApplicationSpec printed is the one submitted; the shipped files it
    names are written at submit, and a code dir changed since the dry run is refused, not shipped silently."""
    monkeypatch.setenv("TFYARN_CACHE_DIR", str(tmp_path / "cache"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "m.py").write_text("X = 1\n")
    spec = make_spec(code=str(code), environment={"python": "/opt/py/bin/python"})
    submitted = []

    class RM:
        def submit(self, app):
            submitted.append(app)
            return "application_1_0001"
    b = YarnBackend(client=RM(), preflight=False, staging_dir=str(tmp_path / "staging"))
    b.conn.conf = {}
    request = b.dryrun(spec)
    assert not Path(request.shipped.code).exists()
    assert b.schedule(request) == "application_1_0001" and submitted == [request.app]
    assert Path(request.shipped.code).is_file() and Path(request.shipped.spec_file).is_file()
    stale = b.dryrun(spec)
    (code / "m.py").write_text("X = 2\n")
    with pytest.raises(TfyarnError, match="changed since its dry run"):
        b.schedule(stale)
    assert len(submitted) == 1


def test_shipped_tfyarn_carries_the_built_c_loops(tmp_path):
    """Tasks on YARN import tfyarn from the shipped source zip: the C extension built on the gateway must be in it
    and importable from the extracted tree, or every task silently runs the slower Python loops."""
    import subprocess
    import sys

    from tfyarn.data import native
    if native.records is None:
        pytest.skip("tfyarn.data._records is not built here")
    src_zip = appspec.build_tfyarn_zip(tmp_path / "ship")
    names = zipfile.ZipFile(src_zip).namelist()
    assert any(n.startswith("tfyarn/data/_records.") and n.endswith(".so") for n in names), names
    zipfile.ZipFile(src_zip).extractall(tmp_path / "tfyarn_src")
    probe = "import tfyarn.data.native as n, sys; print(n.records.__file__); sys.exit(n.records is None)"
    res = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "tfyarn_src")})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().startswith(str(tmp_path / "tfyarn_src")), res.stdout
