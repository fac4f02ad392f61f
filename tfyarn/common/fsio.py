"""Small fsspec helpers shared by everything that commits files to a job's directories (checkpoints, summaries,
event files): the same rules on a local disk and on HDFS."""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: protocols whose ``mv`` is hdfs-native's: a rename that refuses an existing destination unless ``overwrite=True``
#: (then HDFS's own rename with OVERWRITE: atomic, the old file is never missing)
_OVERWRITE_RENAME = {"hdfs", "viewfs"}


def _protocols(fs: Any) -> set[str]:
    p = getattr(fs, "protocol", ())
    return set(p) if isinstance(p, (tuple, list)) else {p}


def replace(fs: Any, src: str, dst: str) -> None:
    """Rename ``src`` over ``dst``. On HDFS this is one atomic rename (readers of ``dst`` see the old file or the
    new one, never none: the checkpoint index is read by the evaluator and by a resuming attempt). A filesystem
    whose rename refuses an existing destination gets remove-then-rename; a rename error that is not about the
    destination is raised, leaving ``dst`` as it was."""
    if _OVERWRITE_RENAME & _protocols(fs):
        fs.mv(src, dst, overwrite=True)
        return
    try:
        fs.mv(src, dst)
    except OSError:
        if not fs.exists(dst):
            raise
        fs.rm(dst)
        fs.mv(src, dst)


def retry_vanished(read: Callable[[], T], attempts: int = 5, pause_s: float = 0.2) -> T:
    """``read()``, again after a pause when the file it opens vanished meanwhile (a writer on a filesystem without
    an overwriting rename replaces it by remove-then-rename); the last FileNotFoundError is raised."""
    for _ in range(attempts - 1):
        try:
            return read()
        except FileNotFoundError:
            time.sleep(pause_s)
    return read()
