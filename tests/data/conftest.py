"""Shared fixtures: real files through fsspec (file:// under tmp_path, memory:// under a unique prefix)."""
from __future__ import annotations

import threading
import uuid

import fsspec
import pytest


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
