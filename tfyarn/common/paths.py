"""Where tfyarn keeps its files on this machine, spelled once (every module asks here, none builds these paths).

``$TFYARN_HOME`` (default ``~/.tfyarn``): ``apps/<app id>/`` a local app's dir; ``yarn/<app id>.json`` what this machine
saved of a YARN app it submitted or followed, ``yarn/<app id>/`` its run report; ``driver/`` tfyarn's shared skein
driver's record, lock, leases and log (``$TFYARN_DRIVER_DIR`` instead when set: the test session shares one).
``$TFYARN_CACHE_DIR`` (default ``~/.cache/tfyarn``): ``envs/`` packed environments, ``ship/`` the other files a YARN
submit uploads, ``index/`` data indexes. Read at each call: tests and users switch them with the environment.
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("TFYARN_HOME") or "~/.tfyarn").expanduser()


def apps_dir() -> Path:
    return home() / "apps"


def yarn_state_file(app_id: str) -> Path:
    return home() / "yarn" / f"{app_id}.json"


def yarn_report_dir(app_id: str) -> Path:
    return home() / "yarn" / app_id


def driver_dir() -> Path:
    return Path(os.environ.get("TFYARN_DRIVER_DIR") or home() / "driver").expanduser()


def cache_dir() -> Path:
    return Path(os.environ.get("TFYARN_CACHE_DIR") or "~/.cache/tfyarn").expanduser()


def index_cache_dir() -> str:
    """This machine's data index cache, when a job names none (on YARN the staging dir's ``index/`` is used)."""
    return str(cache_dir() / "index")
