"""TFRecord framing: round trips over file:// and memory://, GZIP, ranges from sparse boundaries, block edges."""
from __future__ import annotations

import gzip

import fsspec
import numpy as np
import pytest

from tfyarn.data import tfrecord
from tfyarn.data.sources.tfrecords import index_file
from tfyarn.data.tfrecord import FrameOptions, TFRecordWriter, iter_chunks, masked_crc

from _datahelpers import write_ids

#: every test twice: with the C framing loops and with the Python/numpy ones (tfyarn.data.native)
pytestmark = pytest.mark.usefixtures("loops")


def read_all(url, n, **kw):
    out = []
    for c in iter_chunks(url, 0, n, opts=FrameOptions(**kw)):
        out.extend(c.payloads)
    return out


@pytest.mark.parametrize("root", ["mem", "local"])
def test_round_trip(root, request):
    url = f"{request.getfixturevalue(root)}/a.tfrecord"
    payloads = write_ids(url, 0, 500)
    assert read_all(url, 500) == payloads


def test_known_crc_value():
    # TFRecord's masked CRC of b"" and of a length header, as TensorFlow computes them (from TF's own files).
    assert masked_crc(b"") == 0xA282EAD8
    assert masked_crc((5).to_bytes(8, "little")) == tfrecord._U32.unpack(
        tfrecord.encode_record(b"hello")[8:12])[0]


def test_vectorised_header_crc_matches_c(mem):
    rows = np.random.default_rng(0).integers(0, 256, size=(300, 8), dtype=np.uint8)
    expected = [tfrecord._crc_value(r.tobytes()) for r in rows]
    assert tfrecord.crc32c_rows(rows).tolist() == expected


@pytest.mark.parametrize("block", [7, 64, 1000, 1 << 20])
def test_records_spanning_blocks(mem, block):
    url = f"{mem}/a.tfrecord"
    with TFRecordWriter(url) as w:
        payloads = [bytes([i % 251]) * (i * 37 % 3000) for i in range(120)]   # 0..3 kB, some empty
        for p in payloads:
            w.write(p)
    assert read_all(url, 120, block_bytes=block) == payloads


@pytest.mark.parametrize("how", ["extension", "option", "magic"])
def test_gzip(mem, how):
    name = "a.tfrecord.gz" if how == "extension" else "a.tfrecord"
    url = f"{mem}/{name}"
    payloads = write_ids(url, 0, 300, compression="gzip")
    with fsspec.open(url, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    fi = index_file(url, 0, "", compression="gzip" if how == "option" else "auto", stride=64)
    assert fi.gz and fi.records == 300
    assert fi.data_bytes == sum(len(p) + 16 for p in payloads)
    off, first = fi.boundary(200)
    assert first == 192
    got = [p for c in iter_chunks(url, 200, 300, offset=off, first_record=first, gz=True) for p in c.payloads]
    assert got == payloads[200:]


def test_range_from_sparse_boundary_reads_only_the_range(mem):
    url = f"{mem}/a.tfrecord"
    payloads = write_ids(url, 0, 1000)
    fi = index_file(url, 0, "", stride=100)
    assert len(fi.offsets) == 10 and fi.offsets[0] == 0
    off, first = fi.boundary(457)
    assert first == 400 and off == sum(len(p) + 16 for p in payloads[:400])
    chunks = list(iter_chunks(url, 457, 731, offset=off, first_record=first, opts=FrameOptions(max_records=100)))
    assert [p for c in chunks for p in c.payloads] == payloads[457:731]
    assert chunks[0].first == 457 and all(len(c.payloads) <= 100 for c in chunks)
    assert chunks[0].offsets[0] == sum(len(p) + 16 for p in payloads[:457])


def test_gzip_writer_output_is_plain_gzip(local):
    url = f"{local}/a.gz"
    write_ids(url, 0, 10, compression="gzip")
    raw = gzip.decompress(open(url.removeprefix("file://"), "rb").read())
    assert tfrecord._U64.unpack_from(raw, 0)[0] == len(raw[12:12 + tfrecord._U64.unpack_from(raw, 0)[0]])
