"""Resident memory of process trees, as YARN's NodeManager measures a container: a local task with its children
(the framing processes its feeders start)."""

from __future__ import annotations

from typing import Iterable

import psutil


def tree_rss(roots: Iterable[int]) -> dict[int, int]:
    """``{root pid: resident bytes of it and all its descendants}`` for each of ``roots``, from one scan of the
    process table: ~6 ms with 64 processes (where a ``psutil.Process.children()`` scan per root cost ~8 ms for 5
    roots). A root that is gone counts 0."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for p in psutil.process_iter(["ppid", "memory_info"]):
        info = p.info
        if info.get("memory_info") is None:  # gone, or not ours to read
            continue
        rss[p.pid] = info["memory_info"].rss
        kids.setdefault(info["ppid"], []).append(p.pid)
    out = {}
    for root in roots:
        total, todo = 0, [root]
        while todo:
            pid = todo.pop()
            total += rss.get(pid, 0)
            todo.extend(kids.get(pid, ()))
        out[root] = total
    return out
