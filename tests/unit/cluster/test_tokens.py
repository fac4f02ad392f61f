"""A container's delegation tokens read without a JVM (tfyarn.cluster.tokens), from token storage files Hadoop's own
``hadoop dtutil import`` wrote (both formats, data/tokens-*.bin): an HDFS token and an RM token with a 200-byte
identifier (a two-byte length). The RM token's URL form is the string dtutil was given, which Hadoop decoded: the
Writable layout and the base64 are Hadoop's both ways."""

from pathlib import Path

import pytest

from tfyarn.cluster import tokens
from tfyarn.cluster.tokens import TokenFileError, container_token, read_tokens

DATA = Path(__file__).parent / "data"
#: what `hadoop dtutil import URL -format java|protobuf FILE` was given for the RM token (identifier bytes 0..199,
#: password "p" * 20, service 127.0.0.1:28032)
RM_URL = (
    "j8gAAQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4_QEFCQ0RFRkdISUpLTE1O"
    "T1BRUlNUVVZXWFlaW1xdXl9gYWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1-f4CBgoOEhYaHiImKi4yNjo-QkZKTlJWWl5iZmpucnZ6f"
    "oKGio6SlpqeoqaqrrK2ur7CxsrO0tba3uLm6u7y9vr_AwcLDxMXGxxRwcHBwcHBwcHBwcHBwcHBwcHBwcBNSTV9ERUxFR0FUSU9OX1RPS0VO"
    "DzEyNy4wLjAuMToyODAzMg"
)


@pytest.mark.parametrize("fmt", ["java", "protobuf"])
def test_tokens_written_by_hadoop_are_read_in_either_format(fmt):
    got = read_tokens((DATA / f"tokens-{fmt}.bin").read_bytes())
    assert sorted(got) == ["127.0.0.1:28032", "ha-hdfs:tfyarn"]
    rm = got["127.0.0.1:28032"]
    assert (rm.kind, rm.service, rm.identifier, rm.password) == (
        "RM_DELEGATION_TOKEN", "127.0.0.1:28032", bytes(range(200)), b"p" * 20)
    assert rm.url_string() == RM_URL
    hdfs = got["ha-hdfs:tfyarn"]
    assert (hdfs.kind, hdfs.identifier, hdfs.password) == (
        "HDFS_DELEGATION_TOKEN", b"hdfs-identifier", b"hdfs-password")
    assert "p" * 20 not in repr(rm) and "identifier" not in repr(rm)       # a token's secret never in a repr


def test_the_container_token_of_a_kind_from_the_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HADOOP_TOKEN_FILE_LOCATION", str(DATA / "tokens-java.bin"))
    t = container_token(tokens.RM_DELEGATION_TOKEN)
    assert t is not None and t.url_string() == RM_URL
    assert container_token("NO_SUCH_KIND") is None
    monkeypatch.delenv("HADOOP_TOKEN_FILE_LOCATION")
    assert container_token(tokens.RM_DELEGATION_TOKEN) is None                 # outside a secure container
    assert container_token(tokens.RM_DELEGATION_TOKEN, str(tmp_path / "absent")) is None
    bad = tmp_path / "bad"
    bad.write_bytes(b"not a token file")
    assert container_token(tokens.RM_DELEGATION_TOKEN, str(bad)) is None


def test_damaged_files_are_refused_in_words():
    data = (DATA / "tokens-java.bin").read_bytes()
    with pytest.raises(TokenFileError, match="no HDTS header"):
        read_tokens(b"XXXX" + data[4:])
    with pytest.raises(TokenFileError, match="cut short"):
        read_tokens(data[:40])
    with pytest.raises(TokenFileError, match="unknown token storage version 7"):
        read_tokens(b"HDTS\x07" + data[5:])


@pytest.mark.parametrize("n", [0, 1, 127, 128, 255, 256, 65535, 65536, 2**31 - 1])
def test_hadoop_vints_round_trip(n):
    import io
    raw = tokens._vint(n)
    assert tokens._read_vint(io.BytesIO(raw)) == n
    assert len(raw) == (1 if n <= 127 else 1 + (n.bit_length() + 7) // 8)
