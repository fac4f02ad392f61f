"""The delegation tokens YARN gives a container (``$HADOOP_TOKEN_FILE_LOCATION``), read without a JVM.

Why: a container has no Kerberos login (the keytab stays on the gateway); its credentials are the tokens skein's
driver obtained at submit: the HDFS ones and an RM delegation token (``RM_DELEGATION_TOKEN``, renewer the RM), which
the ApplicationMaster hands every container it starts. The ResourceManager's web API takes that token in the
``X-Hadoop-Delegation-Token`` header (its RMAuthenticationFilter), so a container reads the RM's REST API on a
cluster whose web UIs want SPNEGO. Hadoop's token storage file (``HDTS``, version 0: Writable, 1: protobuf) is
parsed here; a token is sent in Hadoop's own form (``Token.encodeToUrlString``). Never logged.
"""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass, field

MAGIC = b"HDTS"
RM_DELEGATION_TOKEN = "RM_DELEGATION_TOKEN"
#: The header the RM's web API reads a delegation token from (Hadoop's DelegationTokenAuthenticator)
HEADER = "X-Hadoop-Delegation-Token"


class TokenFileError(ValueError):
    """Not a Hadoop token storage file, or one cut short."""


@dataclass(frozen=True)
class Token:
    """One Hadoop delegation token (``org.apache.hadoop.security.token.Token``)."""

    identifier: bytes = field(repr=False)
    password: bytes = field(repr=False)
    kind: str
    service: str

    def url_string(self) -> str:
        """Hadoop's ``Token.encodeToUrlString``: the Writable form, URL-safe base64 without padding."""
        raw = b"".join(
            (
                _vint(len(self.identifier)),
                self.identifier,
                _vint(len(self.password)),
                self.password,
                _text(self.kind),
                _text(self.service),
            )
        )
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def read_tokens(data: bytes) -> dict[str, Token]:
    """The tokens of a token storage file's bytes, by alias."""
    if data[:4] != MAGIC or len(data) < 5:
        raise TokenFileError("not a Hadoop token storage file (no HDTS header)")
    body = io.BytesIO(data[5:])
    try:
        if data[4] == 0:
            return _read_writable(body)
        if data[4] == 1:
            return _read_protobuf(body)
    except (EOFError, UnicodeDecodeError, IndexError) as exc:
        raise TokenFileError(f"a token storage file cut short or damaged: {exc}") from None
    raise TokenFileError(f"unknown token storage version {data[4]}")


def container_token(kind: str, path: str | None = None) -> Token | None:
    """The first token of ``kind`` in this container's token file (``$HADOOP_TOKEN_FILE_LOCATION``); None when
    there is no such file (not in a YARN container, or a cluster without security) or no such token in it."""
    path = path or os.environ.get("HADOOP_TOKEN_FILE_LOCATION")
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            tokens = read_tokens(f.read())
    except (OSError, TokenFileError):
        return None
    return next((t for t in tokens.values() if t.kind == kind), None)


def _read_exact(f: io.BytesIO, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise EOFError(f"{n} bytes wanted, {len(b)} left")
    return b


def _read_vint(f: io.BytesIO) -> int:
    """Hadoop's ``WritableUtils.readVLong``."""
    first = int.from_bytes(_read_exact(f, 1), "big", signed=True)
    if first >= -112:
        return first
    n = (-119 - first) if first < -120 else (-111 - first)
    value = int.from_bytes(_read_exact(f, n - 1), "big")
    return ~value if first < -120 else value


def _vint(i: int) -> bytes:
    """Hadoop's ``WritableUtils.writeVLong`` of a non-negative length."""
    if i <= 127:
        return bytes([i])
    raw = i.to_bytes((i.bit_length() + 7) // 8, "big")
    return (-112 - len(raw)).to_bytes(1, "big", signed=True) + raw


def _read_bytes(f: io.BytesIO) -> bytes:
    n = _read_vint(f)
    if n < 0:
        raise EOFError(f"a negative length {n}")
    return _read_exact(f, n)


def _text(s: str) -> bytes:
    b = s.encode()
    return _vint(len(b)) + b


def _read_writable(f: io.BytesIO) -> dict[str, Token]:
    tokens = {}
    for _ in range(_read_vint(f)):
        alias = _read_bytes(f).decode()
        ident, password = _read_bytes(f), _read_bytes(f)
        kind, service = _read_bytes(f).decode(), _read_bytes(f).decode()
        tokens[alias] = Token(ident, password, kind, service)
    return tokens  # the secret keys that follow are not tokens


def _pb_varint(f: io.BytesIO) -> int:
    shift = value = 0
    while True:
        b = _read_exact(f, 1)[0]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
        shift += 7


def _pb_fields(data: bytes) -> list[tuple[int, bytes | int]]:
    """A protobuf message's fields (number, value): varints and length-delimited ones (all Hadoop's need)."""
    f = io.BytesIO(data)
    out: list[tuple[int, bytes | int]] = []
    while f.tell() < len(data):
        key = _pb_varint(f)
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, _pb_varint(f)))
        elif wire == 2:
            out.append((number, _read_exact(f, _pb_varint(f))))
        else:
            raise EOFError(f"unexpected protobuf wire type {wire}")
    return out


def _read_protobuf(f: io.BytesIO) -> dict[str, Token]:
    """``CredentialsProto.parseDelimitedFrom``: tokens = 1 (CredentialsKVProto: alias = 1, token = 2 (TokenProto:
    identifier = 1, password = 2, kind = 3, service = 4))."""
    message = _read_exact(f, _pb_varint(f))
    tokens = {}
    for number, kv in _pb_fields(message):
        if number != 1 or not isinstance(kv, bytes):
            continue
        entry = dict(_pb_fields(kv))
        alias, raw = entry.get(1, b""), entry.get(2)
        if not isinstance(raw, bytes) or not isinstance(alias, bytes):
            continue
        t = {n: v for n, v in _pb_fields(raw) if isinstance(v, bytes)}
        tokens[alias.decode()] = Token(t.get(1, b""), t.get(2, b""), t.get(3, b"").decode(), t.get(4, b"").decode())
    return tokens
