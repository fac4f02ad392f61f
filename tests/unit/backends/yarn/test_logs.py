"""Finding and reading YARN container logs: Hadoop 3.3 bucket layout on a file:// tree, the TFile record layout,
``yarn logs`` output, and the NodeManager web API's JSON (HTTP faked: no NodeManager runs here)."""
import json

import pytest

from tfyarn.backends.yarn import log_files
from tfyarn.backends.yarn.log_files import (aggregated_log_dirs, bucket, parse_tfile_logs,
                                       parse_yarn_logs_output, read_aggregated_logs)

APP = "application_1700000000000_0012"
AM = "container_e07_1700000000000_0012_01_000001"
W1 = "container_e07_1700000000000_0012_01_000003"


def utf(s: str) -> bytes:
    """java.io.DataOutput.writeUTF for ASCII: 2-byte big-endian length + bytes."""
    b = s.encode()
    return len(b).to_bytes(2, "big") + b


def entry(name: str, text: str) -> bytes:
    body = text.encode()
    return utf(name) + utf(str(len(body))) + body


def tfile(containers: dict[str, dict[str, str]]) -> bytes:
    """Bytes laid out like an uncompressed aggregated-log TFile: header junk, VERSION/ACL keys, then per container
    a key (vint length + writeUTF(id)) and its value (chunk length + records), and a trailing index repeating keys."""
    out = bytearray(b"\x00\x01\xfe\xedTFile\x00data:BCFile\x00")
    out += b"\x09" + utf("VERSION") + b"\x04" + b"\x00\x00\x00\x01"
    out += b"\x12" + utf("APPLICATION_ACL") + b"\x00\x00" + b"\x13" + utf("APPLICATION_OWNER") + utf("alice")
    for cid, files in containers.items():
        out += bytes([len(cid) + 2]) + utf(cid) + b"\x8f\x01"
        for name, text in files.items():
            out += entry(name, text)
    out += b"TFile.index\x00"
    for cid in containers:
        out += b"\x01" + utf(cid) + b"\x00\x00\x00\x10"
    return bytes(out) + b"\x00TFile.meta\xfe\xed"


WORKER_LOG = ("[tfyarn] container worker_1 yarn=%s host=n1\nstep 1 loss 0.9\n"
              "noise \x00*container_e07_1700000000000_0012_01_000099 \x00\x05fake!\x00\x013 in my log\n"
              "step 2 loss 0.5\n" % W1)   # \x00* = writeUTF length 42: a perfect lookalike key and record


def test_bucket_layout_paths():
    assert bucket(APP) == "0012"
    assert bucket("application_1_123456") == "3456"
    conf = {"fs.defaultFS": "hdfs://ns1"}
    dirs = aggregated_log_dirs(APP, "alice", conf)
    assert dirs[0] == f"hdfs://ns1/tmp/logs/alice/bucket-logs-tfile/0012/{APP}"
    assert f"hdfs://ns1/tmp/logs/alice/logs/{APP}" in dirs                      # pre-3.3 layout, as a fallback
    conf = {"fs.defaultFS": "hdfs://ns1", "yarn.nodemanager.remote-app-log-dir": "/app-logs",
            "yarn.nodemanager.remote-app-log-dir-suffix": "agg", "yarn.log-aggregation.file-formats": "IFile,TFile"}
    dirs = aggregated_log_dirs(APP, "bob", conf)
    assert dirs[0] == f"hdfs://ns1/app-logs/bob/bucket-agg-ifile/0012/{APP}"
    assert f"hdfs://ns1/app-logs/bob/bucket-agg-tfile/0012/{APP}" in dirs
    with pytest.raises(ValueError):
        bucket("job_1_1")


def test_parse_tfile_records():
    data = tfile({AM: {"application.master.log": "AM started\n", "prelaunch.out": "x"},
                  W1: {"worker.log": WORKER_LOG, "stderr": "", "stdout": "out line\n"}})
    got = parse_tfile_logs(data)
    assert set(got) == {AM, W1}
    assert got[W1]["worker.log"] == WORKER_LOG                  # lookalike text inside the content is not a record
    assert got[W1]["stdout"] == "out line\n" and got[W1]["stderr"] == ""
    assert got[AM]["application.master.log"] == "AM started\n"
    assert parse_tfile_logs(b"\x1f\x8b\x08 gzip-compressed blocks") is None


def test_read_aggregated_logs_from_bucket_tree(tmp_path):
    root = tmp_path / "tmp-logs"
    d = root / "alice" / "bucket-logs-tfile" / "0012" / APP
    d.mkdir(parents=True)
    (d / "node1_8041").write_bytes(tfile({AM: {"application.master.log": "AM\n"}}))
    (d / "node2_8041").write_bytes(tfile({W1: {"worker.log": WORKER_LOG}}))
    (root / "alice" / "logs").mkdir()                             # the old layout exists but is empty: not used
    conf = {"fs.defaultFS": "file:///", "yarn.nodemanager.remote-app-log-dir": str(root)}
    logs = read_aggregated_logs(APP, "alice", conf)
    assert [c.container_id for c in logs] == [AM, W1]
    assert logs[1].task == "worker:1" and logs[0].task == "master"
    lines = list(log_files.lines_of(logs[1]))
    assert lines[1] == "worker:1 | step 1 loss 0.9" and lines[-1] == "worker:1 | step 2 loss 0.5"
    assert read_aggregated_logs("application_1700000000000_0013", "alice", conf) is None


def test_parse_yarn_logs_cli_output():
    text = (f"Container: {W1} on node2_8041\nLogAggregationType: AGGREGATED\n=====\n"
            "LogType:worker.log\nLogLastModifiedTime:Mon\nLogLength:12\nLogContents:\n"
            "[tfyarn] container worker_1 yarn=x host=n\nhello\nEnd of LogType:worker.log\n*****\n\n"
            "LogType:stderr\nLogLength:0\nLogContents:\n\nEnd of LogType:stderr\n"
            f"Container: {AM} on node1_8041\n=====\nLogType:application.master.log\nLogContents:\nAM up\n"
            "End of LogType:application.master.log\n")
    logs = {c.container_id: c for c in parse_yarn_logs_output(text)}
    assert logs[W1].files["worker.log"] == "[tfyarn] container worker_1 yarn=x host=n\nhello\n"
    assert logs[W1].task == "worker:1"
    assert logs[AM].files["application.master.log"] == "AM up\n"


@pytest.mark.parametrize("shape", ["list", "object"])
def test_nodemanager_web_api(shape):
    files = [{"fileName": "worker.log", "fileSize": "10"}, {"fileName": "prelaunch.err", "fileSize": "0"}]
    listing = ([{"containerLogInfo": files, "logAggregationType": "LOCAL"}] if shape == "list"
               else {"containerLogsInfo": {"containerLogInfo": files}})
    seen = []

    def http_get(url, timeout, accept):
        seen.append(url)
        if url.endswith("/logs"):
            return json.dumps(listing).encode()
        return b"[tfyarn] container worker_0 yarn=c host=h\nline\n"

    cl = log_files.nm_container_log("nm1:8042", W1, http_get=http_get)
    assert seen[0] == f"http://nm1:8042/ws/v1/node/containers/{W1}/logs"
    assert seen[1] == f"http://nm1:8042/ws/v1/node/containerlogs/{W1}/worker.log"
    assert cl.task == "worker:0"
    assert log_files.select_files(cl) == ["worker.log"]                 # YARN housekeeping hidden by default
    assert log_files.select_files(cl, all_files=True) == ["worker.log", "prelaunch.err"]


# A live container log as a Hadoop 3.3.6 NodeManager serves it (captured from the test cluster's NodeManager):
# the file wrapped in a header and, while the container runs, a footer.
NM_REPLY = (b"Container: container_1795503544962_0005_01_000002 on 127.0.0.2:18041\nLogAggregationType: LOCAL\n"
            b"====================================================================\nLogType:svc.log\n"
            b"LogLastModifiedTime:Tue Nov 24 07:06:01 +0000 2026\nLogLength:65\nLogContents:\n"
            b"\nerr 4\nline 5\nerr 5\nEnd of LogType:svc.log.This log file belongs to a running container "
            b"(container_1795503544962_0005_01_000002) and so may not be complete.\n"
            b"************************************************************************\n\n")


def test_nodemanager_reply_header_and_footer_are_not_the_file():
    assert log_files.parse_nm_log_reply(NM_REPLY, "svc.log") == (b"\nerr 4\nline 5\nerr 5\n", 65)
    assert log_files.parse_nm_log_reply(b"bare file\n", "svc.log") == (b"bare file\n", None)   # Hadoop 2.x


class FakeNodeManager:
    """A NodeManager web server on 127.0.0.1 serving growing container logs the way Hadoop 3.3 does: the listing
    with sizes, each file wrapped in its header and the running-container footer, ``size=-N`` for the last N bytes."""

    def __init__(self):
        import http.server
        import threading
        self.files: dict[tuple[str, str], bytes] = {}
        self.requests: list[str] = []
        nm = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                import urllib.parse as up
                u = up.urlparse(self.path)
                nm.requests.append(self.path)
                parts = u.path.split("/")
                if u.path.endswith("/logs"):
                    cid = parts[-2]
                    info = [{"fileName": n, "fileSize": str(len(b))} for (c, n), b in nm.files.items() if c == cid]
                    body = json.dumps({"containerLogsInfo": {"containerLogInfo": info}}).encode()
                else:
                    cid, name = parts[-2], up.unquote(parts[-1])
                    data = nm.files[(cid, name)]
                    size = int(up.parse_qs(u.query).get("size", ["0"])[0])
                    part = data[size:] if size < 0 else (data[:size] if size else data)
                    body = (f"Container: {cid} on 127.0.0.1:8041\nLogAggregationType: LOCAL\n{'=' * 68}\n"
                            f"LogType:{name}\nLogLastModifiedTime:now\nLogLength:{len(data)}\nLogContents:\n"
                            ).encode() + part + (f"End of LogType:{name}.This log file belongs to a running "
                                                 f"container ({cid}) and so may not be complete.\n{'*' * 72}\n\n"
                                                 ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_follow_prints_every_line_once_without_the_nodemanagers_footer(tmp_path, monkeypatch):
    """``logs APP --task worker:1 -f``: the file grows between polls (a line even cut in two), the app ends with
    lines the last poll did not see; every line comes once, in order, and the follow returns at the end."""
    import skein
    from skein.model import ApplicationReport, Container, ResourceUsageReport
    from fake_am import FakeAM
    from tfyarn.backends.yarn.backend import YarnBackend

    monkeypatch.setenv("TFYARN_HOME", str(tmp_path / "home"))
    nm = FakeNodeManager()
    cid = W1
    lines = [f"step {i} loss {1 / (i + 1):.4f}\n".encode() for i in range(40)]
    header = b"[tfyarn] container worker_3 yarn=%s host=n1\n" % cid.encode()
    nm.files[(cid, "worker.log")] = header
    nm.files[(cid, "launch_container.sh")] = b"#!/bin/bash\n"
    am = FakeAM()
    am.kv.put("taskmap/worker_3", b"worker:1")      # a replacement container: skein's worker_3 is worker:1
    containers = [Container("worker", 3, "RUNNING", cid, nm.address, None, None, "")]
    state = {"polls": 0}

    class App:
        kv = am.kv

        def get_containers(self, states=None):
            # every poll the task writes a few lines, the last one in two halves across polls
            state["polls"] += 1
            n = state["polls"]
            nm.files[(cid, "worker.log")] = header + b"".join(lines[:n * 5 - 1]) + lines[n * 5 - 1][:6]
            return containers

        def close(self):
            pass

    def report(app_id):
        res = skein.Resources(memory=0, vcores=0)
        running = state["polls"] < 6
        return ApplicationReport(app_id, "j", "alice", "q", {"tfyarn"}, "h", 1, "", "RUNNING" if running else
                                 "FINISHED", "UNDEFINED" if running else "SUCCEEDED", 0.5,
                                 ResourceUsageReport(0, 0, 0, res, res, res), "", None, None)

    class RM:
        application_report = staticmethod(report)

        def connect(self, app_id, wait=False):
            return App()

    # after the end: the aggregated log holds the whole file (the task wrote 40 lines in all)
    root = tmp_path / "tmp-logs"
    d = root / "alice" / "bucket-logs-tfile" / "0012" / APP
    d.mkdir(parents=True)
    (d / "node1_8041").write_bytes(tfile({cid: {"worker.log": (header + b"".join(lines)).decode()}}))
    (d / "node2_8041.tmp").write_bytes(b"partial upload")       # still being uploaded: not read
    b = YarnBackend(client=RM(), preflight=False, log_poll_s=0.01, aggregation_wait_s=5)
    b.conn.conf = {"fs.defaultFS": "file:///", "yarn.nodemanager.remote-app-log-dir": str(root)}
    try:
        got = list(b.log_reader.logs(APP, task="worker:1", follow=True, follow_timeout=60))
    finally:
        nm.close()
    want = ["worker:1 | " + x.decode().rstrip("\n") for x in [header, *lines]]
    assert got == want
    assert any("size=-" in r for r in nm.requests)        # after the first read only the new tail is asked for
    assert not any("launch_container" in line for line in got)
