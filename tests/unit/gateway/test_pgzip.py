"""The packed env's parallel gzip: many members written in order read back as one stream by Python's gzip, by the
``gzip``/``tar`` tools a NodeManager untars archives with, and by ``tarfile``."""
import gzip
import io
import os
import shutil
import subprocess
import tarfile

import pytest

from tfyarn.gateway.pgzip import ParallelGzipWriter


def test_members_in_order_read_back_as_one_stream():
    data = os.urandom(50_000) + b"tfyarn " * 300_000 + os.urandom(7)
    out = io.BytesIO()
    with ParallelGzipWriter(out, level=1, threads=3, chunk=64 << 10) as gz:
        for i in range(0, len(data), 10_000):            # writes smaller than a chunk, chunks split across writes
            assert gz.write(data[i:i + 10_000]) == len(data[i:i + 10_000])
        assert gz.tell() == len(data)
    raw = out.getvalue()
    assert raw.count(b"\x1f\x8b\x08") >= len(data) // (64 << 10)   # several members
    assert gzip.decompress(raw) == data and gz.compressed == len(raw)


def test_an_empty_stream_is_a_valid_gzip():
    out = io.BytesIO()
    ParallelGzipWriter(out).close()
    assert gzip.decompress(out.getvalue()) == b""


@pytest.mark.skipif(not (shutil.which("tar") and shutil.which("gzip")), reason="needs tar and gzip")
def test_a_tar_written_through_it_untars_with_the_tools_yarn_uses(tmp_path):
    src = tmp_path / "src"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "python").write_bytes(os.urandom(300_000))
    (src / "lib.txt").write_text("x" * 200_000)
    os.symlink("python", src / "bin" / "python3")
    arc = tmp_path / "env.tar.gz"
    with open(arc, "wb") as raw, ParallelGzipWriter(raw, level=1, threads=2, chunk=32 << 10) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            for p in sorted(src.rglob("*")):
                tar.add(p, p.relative_to(src).as_posix(), recursive=False)
    dest = tmp_path / "dest"
    dest.mkdir()
    # what Hadoop's FileUtil.unTar runs on Linux: gzip -dc archive | tar -xf -
    subprocess.run(f"gzip -dc '{arc}' | (cd '{dest}' && tar -xf -)", shell=True, check=True)
    assert (dest / "bin" / "python").read_bytes() == (src / "bin" / "python").read_bytes()
    assert os.readlink(dest / "bin" / "python3") == "python" and (dest / "lib.txt").read_text() == "x" * 200_000
    with tarfile.open(arc, "r:gz") as t:
        assert sorted(t.getnames()) == ["bin", "bin/python", "bin/python3", "lib.txt"]


def test_a_venv_packed_through_it_is_the_venv(tmp_path):
    """packaging.pack_env on a real (small) virtualenv: the archive holds its python and its pyvenv.cfg."""
    import subprocess
    import sys
    from tfyarn.gateway.packaging import pack_env
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    out = pack_env(venv, "venv", tmp_path / "env.tar.gz")
    with tarfile.open(out, "r:gz") as t:
        names = set(t.getnames())
    assert {"bin/python", "pyvenv.cfg"} <= names and any(n.startswith("bin/activate") for n in names)
    assert not list(tmp_path.glob(".env.tar.gz.*"))        # no partial file left
