"""Shared fixtures: real files through fsspec (file:// under tmp_path, memory:// under a unique prefix)."""
from __future__ import annotations

import threading
import time
import uuid

import fsspec
import pytest

from _datahelpers import framer_children


@pytest.fixture
def mem():
    """A fresh memory:// directory, removed afterwards (the memory filesystem is process-global)."""
    root = f"memory://t-{uuid.uuid4().hex[:10]}"
    yield root
    fs = fsspec.filesystem("memory")
    try:
        fs.rm(root.removeprefix("memory://"), recursive=True)
    except FileNotFoundError:
        pass


@pytest.fixture
def local(tmp_path):
    return f"file://{tmp_path}"


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "index-cache")


@pytest.fixture
def no_thread_leak():
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("tfyarn")]
    assert not leaked, f"threads left running: {leaked}"
    deadline = time.monotonic() + 5.0     # a closed feeder's framing process exits within its 2 s grace
    while framer_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not framer_children(), f"framing processes left running: {framer_children()}"


@pytest.fixture(params=["memory", "file"])
def src(request, tmp_path, monkeypatch):
    """A data directory for feeder tests, once on each framing path: ``memory://`` files are framed in the feeder's
    reader thread (another process cannot see them), ``file://`` files in the framing process (``framer.py``; strict
    mode, so that every record goes through it even in an epoch shorter than the process's start-up)."""
    if request.param == "file":
        monkeypatch.setenv("TFYARN_FRAMING", "process")
        yield f"file://{tmp_path}/data"
        return
    root = f"memory://t-{uuid.uuid4().hex[:10]}"
    yield root
    try:
        fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)
    except FileNotFoundError:
        pass


@pytest.fixture(params=["c", "python"])
def loops(request, monkeypatch):
    """Run the test with the C loops (tfyarn.data._records) and again with the Python/numpy ones, in this process
    and in framing processes it starts (``TFYARN_NATIVE=0`` is inherited)."""
    from tfyarn.data import native
    if request.param == "python":
        monkeypatch.setattr(native, "records", None)
        monkeypatch.setenv("TFYARN_NATIVE", "0")
    elif native.records is None:
        pytest.skip("tfyarn.data._records is not built")
    return request.param
