"""Finding and reading YARN container logs: Hadoop 3.3 bucket layout on a file:// tree, the TFile record layout,
``yarn logs`` output, and the NodeManager web API's JSON (HTTP faked: no NodeManager runs here)."""
import json

import pytest

from tfyarn.backends import yarn_logs
from tfyarn.backends.yarn_logs import (ContainerLog, aggregated_log_dirs, bucket, parse_tfile_logs,
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
    out = bytearray(b"\x00\x01\xfe\xedTFile\x00data:BCFile\x00" + b"\x09" + utf("VERSION") + b"\x04" + b"\x00\x00\x00\x01")
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
    assert logs[1].host == "node2_8041" and logs[1].task == "worker:1" and logs[0].task == "master"
    lines = list(yarn_logs.lines_of(logs[1]))
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
    assert logs[W1].task == "worker:1" and logs[W1].host == "node2_8041"
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

    cl = yarn_logs.nm_container_log("nm1:8042", W1, http_get=http_get)
    assert seen[0] == f"http://nm1:8042/ws/v1/node/containers/{W1}/logs"
    assert seen[1] == f"http://nm1:8042/ws/v1/node/containerlogs/{W1}/worker.log"
    assert cl.task == "worker:0"
    assert yarn_logs.select_files(cl) == ["worker.log"]                 # YARN housekeeping hidden by default
    assert yarn_logs.select_files(cl, all_files=True) == ["worker.log", "prelaunch.err"]


def test_task_matching():
    cl = ContainerLog(W1, {"w.log": "[tfyarn] container worker_1 yarn=x host=h\n"})
    assert yarn_logs.matches_task(cl, None) and yarn_logs.matches_task(cl, "worker:1")
    assert yarn_logs.matches_task(cl, "worker") and yarn_logs.matches_task(cl, W1)
    assert not yarn_logs.matches_task(cl, "worker:0") and not yarn_logs.matches_task(cl, "ps")
