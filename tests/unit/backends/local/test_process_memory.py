"""tree_rss: a process tree's resident memory in one table scan (what the launcher compares with roles.*.memory)."""
from __future__ import annotations

import subprocess
import sys

import psutil

from tfyarn.backends.local.process_memory import tree_rss

#: a child holding ~200 MiB resident, then a grandchild holding ~100 MiB, both waiting on stdin
_HOLD = "import sys; b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); " \
        "sys.stdin.read()"


def _start(code: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_tree_counts_its_descendants_and_each_root_only_its_own():
    inner = _HOLD.format(mib=100)
    outer = (f"import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', {inner!r}], stdin=sys.stdin, "
             f"stdout=subprocess.PIPE, text=True); assert c.stdout.readline().strip() == 'ready'; "
             + _HOLD.format(mib=200).replace("import sys; ", ""))
    parent = _start(outer)
    solo = _start(_HOLD.format(mib=50))
    try:
        own = {p.pid: p.memory_info().rss for p in [psutil.Process(parent.pid), *psutil.Process(parent.pid).children()]}
        got = tree_rss([parent.pid, solo.pid, 2 ** 22 + 12345])
        assert got[parent.pid] >= 300 << 20 and len(own) == 2
        assert abs(got[parent.pid] - sum(own.values())) < 16 << 20      # both processes, sampled a moment apart
        assert 50 << 20 <= got[solo.pid] < 150 << 20                    # not the other tree's memory
        assert got[2 ** 22 + 12345] == 0                                # a pid that is gone counts 0
    finally:
        for p in (parent, solo):
            p.stdin.close()
            p.wait(timeout=10)
