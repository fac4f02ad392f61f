"""Environment hash stability/change detection, venv-pack on a real venv, and the staging cache (memory://)."""
import subprocess
import tarfile

import fsspec
import pytest

from yarnutil import add_dist, make_spec, site_packages
from tfyarn.gateway import packaging
from tfyarn.gateway.packaging import PackagingError, ensure_env, env_fingerprint


def test_hash_is_stable_and_detects_changes(small_venv, tmp_path):
    h0 = env_fingerprint(small_venv).env_hash
    assert env_fingerprint(small_venv).env_hash == h0
    add_dist(small_venv, "numpy", "2.0.0")
    h1 = env_fingerprint(small_venv).env_hash
    assert h1 != h0
    add_dist(small_venv, "numpy", "2.0.1")                     # version change
    h2 = env_fingerprint(small_venv).env_hash
    assert h2 not in (h0, h1)
    add_dist(small_venv, "tfyarn", "9.9.9")                    # tfyarn is shipped separately: not in the hash
    assert env_fingerprint(small_venv).env_hash == h2
    src = tmp_path / "mylib"
    (src / "mylib").mkdir(parents=True)
    (src / "mylib" / "__init__.py").write_text("A = 1\n")
    add_dist(small_venv, "mylib", "0.1", editable=str(src))
    h3 = env_fingerprint(small_venv).env_hash
    (src / "mylib" / "__pycache__").mkdir()
    (src / "mylib" / "__pycache__" / "x.pyc").write_bytes(b"junk")   # caches do not count
    assert env_fingerprint(small_venv).env_hash == h3
    (src / "mylib" / "__init__.py").write_text("A = 2\n")           # editable code change does
    h4 = env_fingerprint(small_venv).env_hash
    assert h4 != h3
    fp = env_fingerprint(small_venv)
    assert fp.kind == "venv" and ["numpy", "2.0.1"] in fp.document["distributions"]
    assert set(fp.document["editable"]) == {"mylib"}
    for d in ("numpy", "tfyarn", "mylib"):
        for p in site_packages(small_venv).glob(f"{d}-*.dist-info"):
            import shutil
            shutil.rmtree(p)
    assert env_fingerprint(small_venv).env_hash == h0


def test_detect_kind(tmp_path, small_venv):
    assert packaging.detect_env_kind(small_venv) == "venv"
    (tmp_path / "c" / "conda-meta").mkdir(parents=True)
    assert packaging.detect_env_kind(tmp_path / "c") == "conda"
    with pytest.raises(PackagingError, match="neither a conda environment nor a virtualenv"):
        packaging.detect_env_kind(tmp_path)


def _extract_all(tf: tarfile.TarFile, dest) -> None:
    """As YARN unpacks an archive (links kept); ``filter=`` exists from Python 3.11.4 on (3.11.2 is Debian 12's)."""
    if hasattr(tarfile, "fully_trusted_filter"):
        tf.extractall(dest, filter="fully_trusted")
    else:
        tf.extractall(dest)


def test_pack_real_venv_and_run_python_from_unpacked_archive(small_venv, tmp_path):
    calls = []
    out = packaging.pack_env(small_venv, "venv", tmp_path / "env.tar.gz", lambda *a: calls.append(a))
    assert out.is_file() and calls[0][0] == "pack" and calls[-1][1] == out.stat().st_size
    dest = tmp_path / "container" / "env"          # where YARN unpacks the archive
    dest.mkdir(parents=True)
    with tarfile.open(out) as tf:
        _extract_all(tf, dest)
    res = subprocess.run([str(dest / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(dest)


def test_pack_level_0_is_a_plain_tar_named_so_yarn_unpacks_it_without_gzip(small_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("TFYARN_PACK_LEVEL", "0")
    monkeypatch.setenv("TFYARN_CACHE_DIR", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    ref = ensure_env(make_spec(), "memory://staging0/tfyarn", prefix=str(small_venv), fs=fs)
    assert ref.archive_url.endswith(f"env-venv-{ref.env_hash[:24]}.tar"), ref.archive_url
    local = tmp_path / "cache" / "envs" / ref.archive_url.rsplit("/", 1)[-1]
    assert local.read_bytes()[:2] != b"\x1f\x8b"                 # no gzip header: a plain tar
    with tarfile.open(local, "r:") as tf:                     # "r:" refuses anything compressed
        dest = tmp_path / "container" / "env"
        _extract_all(tf, dest)
    res = subprocess.run([str(dest / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == str(dest), res.stderr
    monkeypatch.setenv("TFYARN_PACK_LEVEL", "1")              # another level: another archive, not this one reused
    assert ensure_env(make_spec(), "memory://staging0/tfyarn", prefix=str(small_venv), fs=fs,
                      dry_run=True).archive_url == ref.archive_url + ".gz"


def test_ensure_env_uploads_once_then_hits_the_cache(small_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("TFYARN_CACHE_DIR", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    staging = "memory://staging/tfyarn"
    spec = make_spec()
    stages = []
    first = ensure_env(spec, staging, lambda s, d, t: stages.append(s), prefix=str(small_venv), fs=fs)
    assert first.source == "pack" and not first.cached and first.uploaded_bytes > 0
    assert first.archive_url == f"{staging}/envs/env-venv-{first.env_hash[:24]}.tar.gz"
    assert fs.exists(fs._strip_protocol(first.archive_url))
    assert fs.size(fs._strip_protocol(first.archive_url)) == first.uploaded_bytes
    assert "upload" in stages and not [p for p in fs.find("/staging") if ".partial" in p]
    again = ensure_env(spec, staging, prefix=str(small_venv), fs=fs)
    assert again.cached and again.uploaded_bytes == 0 and again.archive_url == first.archive_url
    add_dist(small_venv, "somelib", "1.0")               # env changed → new archive name, uploaded again
    changed = ensure_env(spec, staging, prefix=str(small_venv), fs=fs)
    assert changed.archive_url != first.archive_url and changed.uploaded_bytes > 0
    dry = ensure_env(spec, "memory://elsewhere", prefix=str(small_venv), fs=fs, dry_run=True)
    assert not fs.exists("/elsewhere") and dry.archive_url.startswith("memory://elsewhere/envs/")
    for p in site_packages(small_venv).glob("somelib-*.dist-info"):
        import shutil
        shutil.rmtree(p)


def test_other_sources_ship_nothing():
    fs = fsspec.filesystem("memory")
    a = ensure_env(make_spec(environment={"archive": "hdfs:///envs/prebuilt.tar.gz"}), "memory://s", fs=fs)
    assert (a.source, a.archive_url, a.python, a.uploaded_bytes) == \
        ("archive", "hdfs:///envs/prebuilt.tar.gz", "./env/bin/python", 0)
    p = ensure_env(make_spec(environment={"python": "/opt/py/bin/python"}), "memory://s", fs=fs)
    assert (p.source, p.archive_url, p.python) == ("python", None, "/opt/py/bin/python")
    n = ensure_env(make_spec(environment={"pack": "none"}), "memory://s", fs=fs)
    assert (n.source, n.python) == ("none", "python3")
    assert not fs.exists("/s")


def test_an_archive_staged_meanwhile_by_another_submit_is_kept_not_replaced(tmp_path):
    """Two submits of a new env at once both upload; the second must not replace the first's file, which YARN
    localizes by the timestamp recorded when the first job was submitted."""
    import fsspec
    from tfyarn.gateway.packaging import upload
    fs = fsspec.filesystem("file")
    local = tmp_path / "env.tar.gz"
    local.write_bytes(b"x" * 1000)
    dest = tmp_path / "staging" / "envs" / "venv-abc.tar.gz"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"x" * 1000)                  # the other submit's upload landed first
    before = dest.stat().st_mtime_ns, dest.stat().st_ino
    assert upload(local, fs, str(dest)) == 1000
    assert (dest.stat().st_mtime_ns, dest.stat().st_ino) == before
    assert sorted(p.name for p in dest.parent.iterdir()) == ["venv-abc.tar.gz"]   # its own copy removed
    dest.unlink()
    assert upload(local, fs, str(dest)) == 1000 and dest.read_bytes() == b"x" * 1000


def test_editable_installs_are_refused_before_packing(small_venv, tmp_path, monkeypatch):
    """Their code would stay on the gateway (conda-pack drops them, venv-pack ships a path): say so at submit."""
    monkeypatch.setenv("TFYARN_CACHE_DIR", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    add_dist(small_venv, "tfyarn", "9.9.9", editable=str(tmp_path))      # tfyarn ships apart: fine editable
    src = tmp_path / "mylib"
    src.mkdir()
    add_dist(small_venv, "mylib", "0.1", editable=str(src))
    try:
        for dry in (True, False):
            with pytest.raises(PackagingError, match=r"editable installs whose code would not be shipped: "
                                                     rf"mylib \({src}\)\. Install them normally"):
                ensure_env(make_spec(), "memory://staging-e", prefix=str(small_venv), fs=fs, dry_run=dry)
        assert not fs.exists("/staging-e") and not (tmp_path / "cache").exists()   # nothing packed or uploaded
    finally:
        for d in ("tfyarn", "mylib"):
            for p in site_packages(small_venv).glob(f"{d}-*.dist-info"):
                import shutil
                shutil.rmtree(p)
    assert ensure_env(make_spec(), "memory://staging-e", prefix=str(small_venv), fs=fs, dry_run=True).source == "pack"
