"""Removing skein's staging dir of an ended application (``/user/<user>/.skein/<app id>`` on HDFS).

Why: skein's ApplicationMaster removes it when the app ends normally; an AM that was killed (or lost
with its node) never does, so every such job attempt left its files (the packed spec, the scripts:
7.8 MB in issue 30's run) on HDFS for good. The follower removes what is left once an attempt has
ended; a failure here is logged and never changes the job's outcome."""

from __future__ import annotations

import logging
from typing import Any

from tfyarn.cluster import hdfs

log = logging.getLogger(__name__)


def remove_after(backend: Any, app_id: str) -> bool:
    """Remove ``app_id``'s skein staging dir (the YARN ``backend`` user's HDFS home's ``.skein/<app id>``) if an
    ended app left it; True when something was."""
    conf = backend.conf
    url = hdfs.qualify(f"/user/{backend.user}/.skein/{app_id}", conf)
    try:
        fs, path = hdfs.get_fs(url, conf)
        if not fs.exists(path):
            return False
        fs.rm(path, recursive=True)
    except Exception as exc:  # noqa: BLE001 - clean-up only: the job's outcome stands
        log.warning("could not remove skein's staging dir %s: %s", url, exc)
        return False
    log.info("removed %s (skein's staging dir, left by the ended application)", url)
    return True
