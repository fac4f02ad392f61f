"""Hadoop config reading, URL qualification, token file systems, keytab hygiene."""
import pytest

from tfyarn.cluster import hdfs
from tfyarn.errors import PreflightError

CORE = """<?xml version="1.0"?><configuration>
<property><name>fs.defaultFS</name><value>hdfs://ns1</value></property></configuration>"""
HDFS = """<configuration><property><name>dfs.nameservices</name><value>ns1</value></property>
<property><name>dfs.ha.namenodes.ns1</name><value>nn1,nn2</value></property></configuration>"""


def test_conf_dir_and_qualify(tmp_path, monkeypatch):
    (tmp_path / "core-site.xml").write_text(CORE)
    (tmp_path / "hdfs-site.xml").write_text(HDFS)
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    conf = hdfs.load_hadoop_conf()
    assert conf["fs.defaultFS"] == "hdfs://ns1" and conf["dfs.ha.namenodes.ns1"] == "nn1,nn2"
    assert hdfs.qualify("hdfs:///user/a/x", conf) == "hdfs://ns1/user/a/x"
    assert hdfs.qualify("/user/a/x", conf) == "hdfs://ns1/user/a/x"
    assert hdfs.qualify("hdfs://other:8020/x", conf) == "hdfs://other:8020/x"
    assert hdfs.qualify("s3://b/x", conf) == "s3://b/x"
    assert hdfs.filesystems_for_tokens(["hdfs:///d/*", "hdfs://ns2/d", "viewfs://cl/x", "hdfs://ns2/e", None,
                                        "s3://b"], conf) == ["hdfs://ns2", "viewfs://cl"]
    assert hdfs.qualify("/tmp/x", {}) == "file:///tmp/x"
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path / "missing"))
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    assert hdfs.load_hadoop_conf() == {}


def test_keytab_checks(tmp_path):
    kt = tmp_path / "svc.keytab"
    with pytest.raises(PreflightError, match="cannot read"):
        hdfs.check_keytab(kt)
    kt.write_bytes(b"\x05\x02")
    kt.chmod(0o604)
    with pytest.raises(PreflightError, match="world-readable"):
        hdfs.check_keytab(kt)
    kt.chmod(0o600)
    hdfs.check_keytab(kt)
    from tfyarn.spec import Kerberos
    assert "svc.keytab" not in repr(Kerberos(principal="me@R", keytab=str(kt)))


def test_get_fs_for_local_and_memory(tmp_path):
    fs, path = hdfs.get_fs(f"file://{tmp_path}/a")
    assert path == f"{tmp_path}/a"
    fs, path = hdfs.get_fs("memory://bucket/x")
    assert path.endswith("bucket/x")
