"""tfyarn.cluster.kerberos without a cluster: the keytab reader (against keytabs MIT's ktutil writes), the one-line
errors' texts, the JVM option, and hdfs.set_login swapping fsspec's hdfs class (and back)."""
import shutil
import subprocess

import pytest

from tfyarn.cluster import hdfs, kerberos
from tfyarn.errors import PreflightError
from tfyarn.spec import Kerberos


def ktutil_keytab(path, *principals):
    if not shutil.which("ktutil"):
        pytest.skip("ktutil not installed (apt-get install krb5-user)")
    cmds = "".join(f"addent -password -p {p} -k 1 -e aes256-cts-hmac-sha1-96\nsecret-{i}\n"
                   for i, p in enumerate(principals))
    subprocess.run(["ktutil"], input=cmds + f"wkt {path}\nquit\n", text=True, check=True, capture_output=True,
                   timeout=30)
    path.chmod(0o600)
    return path


def test_keytab_principals_as_ktutil_writes_them(tmp_path):
    kt = ktutil_keytab(tmp_path / "two.keytab", "alice@EX.COM", "svc/host.ex.com@EX.COM")
    assert kerberos.keytab_principals(kt) == ["alice@EX.COM", "svc/host.ex.com@EX.COM"]
    kerberos.check_keytab_principal(Kerberos(principal="svc/host.ex.com@EX.COM", keytab=str(kt)))
    kerberos.check_keytab_principal(Kerberos(principal="alice", keytab=str(kt)))     # no realm: any realm
    with pytest.raises(PreflightError) as e:
        kerberos.check_keytab_principal(Kerberos(principal="bob@EX.COM", keytab=str(kt)))
    msg = str(e.value)
    assert "bob@EX.COM is not in the keytab two.keytab" in msg and "alice@EX.COM" in msg
    assert "\n" not in msg and str(tmp_path) not in msg


def test_not_a_keytab(tmp_path):
    bad = tmp_path / "bad.keytab"
    bad.write_bytes(b"hello")
    bad.chmod(0o600)
    with pytest.raises(PreflightError, match="bad.keytab is not a readable keytab"):
        kerberos.check_keytab_principal(Kerberos(principal="a@B", keytab=str(bad)))


def test_gss_text_and_proxy_refusal():
    raw = ('GSSAPIError(GssMajorCodes { raw: "0x00070000", routine_error: "GSS_S_NO_CRED" }, 2529639068, '
           '"No credentials were supplied: Cannot contact any KDC for realm \'R\'")')
    assert kerberos._gss_text(RuntimeError(raw)) == "Cannot contact any KDC for realm 'R'"
    exc = RuntimeError("Failed to submit application, exception:\nUser: alice@R is not allowed to impersonate carol")
    err = kerberos.proxy_refusal(exc, "carol")
    assert err is not None and "\n" not in str(err) and "not allowed to impersonate carol" in str(err)
    assert str(err).startswith("user: 'carol'") and err.exit_code == 2
    assert kerberos.proxy_refusal(RuntimeError("queue full"), "carol") is None
    assert kerberos.proxy_refusal(exc, None) is None


def test_driver_options(monkeypatch, tmp_path):
    monkeypatch.delenv("SKEIN_DRIVER_JAVA_OPTIONS", raising=False)
    monkeypatch.delenv("KRB5_CONFIG", raising=False)
    assert kerberos.driver_options(None) == {"java_options": ["-XX:TieredStopAtLevel=1"]}
    monkeypatch.setenv("KRB5_CONFIG", "/etc/r/krb5.conf")
    monkeypatch.setenv("SKEIN_DRIVER_JAVA_OPTIONS", "-Xmx256m -XX:TieredStopAtLevel=4")  # the user's come after ours
    kw = kerberos.driver_options(Kerberos(principal="a@R", keytab="/k/a.keytab"))
    assert kw == {"principal": "a@R", "keytab": "/k/a.keytab",
                  "java_options": ["-XX:TieredStopAtLevel=1", "-Xmx256m", "-XX:TieredStopAtLevel=4",
                                   "-Djava.security.krb5.conf=/etc/r/krb5.conf"]}
    monkeypatch.setenv("SKEIN_DRIVER_JAVA_OPTIONS", "-Djava.security.krb5.conf=/mine")
    assert kerberos.driver_options(None)["java_options"] == [
        "-XX:TieredStopAtLevel=1", "-Djava.security.krb5.conf=/mine"]


def test_login_without_kerberos_on_a_simple_cluster_is_nothing(tmp_path):
    assert kerberos.login(None, {"hadoop.security.authentication": "simple"}) is None
    assert hdfs._login is None


def test_set_login_swaps_the_fsspec_hdfs_class_and_back(tmp_path):
    import fsspec
    from hdfs_native.fsspec import HdfsFileSystem
    kt = tmp_path / "a.keytab"
    kt.write_bytes(b"\x05\x02")
    kt.chmod(0o600)
    try:
        hdfs.set_login(Kerberos(principal="a@R", keytab=str(kt)))
        cls = fsspec.get_filesystem_class("hdfs")
        assert cls is not HdfsFileSystem and issubclass(cls, HdfsFileSystem)
        assert "a.keytab" not in repr(hdfs._login)
    finally:
        hdfs.set_login(None)
    assert fsspec.get_filesystem_class("hdfs") is HdfsFileSystem


def test_short_name():
    assert kerberos.short_name("alice@R") == "alice" and kerberos.short_name("svc/h.x@R") == "svc"


def test_finished_logs_come_from_the_node_managers_when_aggregation_is_off():
    """A Kerberized cluster without native libhadoop keeps aggregation off: a finished app's logs are read from its
    NodeManagers (a stub serving the Hadoop 3 replies) at once, and one that cannot serve says why in one line."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tfyarn.backends.yarn import log_files

    good, bad = "container_1_0001_01_000002", "container_1_0001_01_000003"

    class NM(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == f"/ws/v1/node/containers/{good}/logs":
                body = json.dumps({"containerLogsInfo": {"containerLogInfo": [
                    {"fileName": "chief.log", "fileSize": "6"}]}}).encode()
            elif self.path == f"/ws/v1/node/containerlogs/{good}/chief.log":
                body = (b"Container: x\nLogType:chief.log\nLogLength:6\nLogContents:\nhello\n"
                        b"End of LogType:chief.log\n***\n")
            else:
                self.send_error(500, "Secure IO is not possible without native code extensions")
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), NM)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    addr = f"127.0.0.1:{srv.server_address[1]}"
    try:
        assert log_files.aggregation_disabled({"yarn.log-aggregation-enable": "false"})
        assert not log_files.aggregation_disabled({})
        tasks = [{"task": "chief:0", "log": f"{addr}/node/containerlogs/{good}/alice"},
                 {"task": "worker:0", "log": f"{addr}/node/containerlogs/{bad}/alice"},
                 {"task": "ps:0", "log": None}]
        got = dict(log_files.nm_finished_logs(tasks))
    finally:
        srv.shutdown()
    assert list(log_files.lines_of(got["chief:0"], label="chief:0")) == ["chief:0 | hello"]
    (line,) = log_files.lines_of(got["worker:0"], label="worker:0")
    assert line.startswith("worker:0 | [tfyarn] logs unavailable") and bad in line and "500" in line
    assert "ps:0" not in got


def test_a_command_checks_its_login_once(monkeypatch, tmp_path):
    """However many backends, preflight calls and packs ask for it, one process checks one login once (each check is
    a KDC round trip); a different keytab or principal is checked again."""
    checked = []
    monkeypatch.setattr(kerberos, "check", lambda krb, conf: checked.append(krb.principal))
    monkeypatch.setattr(kerberos, "_CHECKED", set())
    monkeypatch.setattr(kerberos.hdfs, "set_login", lambda krb: None)
    conf = {"hadoop.security.authentication": "kerberos", "fs.defaultFS": "hdfs://nn:9000"}
    alice = Kerberos(principal="alice@R", keytab=str(tmp_path / "a.keytab"))
    for _ in range(3):
        assert kerberos.login(alice, conf) is alice
    kerberos.login(Kerberos(principal="bob@R", keytab=str(tmp_path / "b.keytab")), conf)
    assert checked == ["alice@R", "bob@R"]


def test_task_python_blocker_names_the_first_closed_dir():
    """What the LinuxContainerExecutor's container account cannot run: a dir it cannot search, on the way."""
    import tempfile
    from pathlib import Path

    from tfyarn.gateway import task_python
    base = Path(tempfile.mkdtemp(prefix="tfyarn-task-python-"))   # in /tmp, opened to others (pytest's are 0700)
    try:
        base.chmod(0o755)
        closed = base / "home"
        (closed / "py" / "bin").mkdir(parents=True)
        exe = closed / "py" / "bin" / "python3"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        closed.chmod(0o700)
        link = base / "python"
        link.symlink_to(exe)
        where = task_python.blocker(link, "nobody")
        assert where is not None and where.startswith(f"{closed} (mode 0700, owner "), where
        closed.chmod(0o755)
        assert task_python.blocker(link, "nobody") is None
        exe.chmod(0o744)                              # readable, not executable by others
        assert task_python.blocker(link, "nobody").startswith(f"{exe} (mode 0744")
    finally:
        shutil.rmtree(base)


def test_task_python_checks_only_secure_clusters():
    from tfyarn.gateway import task_python
    from tfyarn.spec import load_spec_dict
    doc = {"name": "x", "model": "m:f", "mode": "allreduce",
           "data": {"train": ["hdfs:///d/*"], "features": {"x": {"dtype": "float32"}}, "batch_size": 8}}
    spec = load_spec_dict({**doc, "environment": {"python": "/nonexistent/python"}})
    assert task_python.check(spec, {}) == []
    assert task_python.check(spec, {"hadoop.security.authentication": "kerberos"}) == []   # not here: unknown
    spec = load_spec_dict({**doc, "environment": {"python": "/bin/sh"}})
    assert task_python.check(spec, {"hadoop.security.authentication": "kerberos"}) == []   # everyone runs it
