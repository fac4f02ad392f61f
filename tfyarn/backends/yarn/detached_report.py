"""``python -m tfyarn.backends.yarn.detached_report APP_ID``: write the run report of an ended YARN app, then exit.

Why a process of its own: the CLI that followed the job exits as soon as the app's outcome is known; the report's
plot and its HDFS uploads (~3 s on a loaded gateway) are done here, detached from it
(:meth:`YarnBackend._report_at_end`), from what the follower saved in ``$TFYARN_HOME/yarn/<app>.json``.
"""

from __future__ import annotations

import logging
import sys

from tfyarn.backends.yarn.backend import YarnBackend


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with YarnBackend() as b:
        path = b.write_report(b.status(args[0]))
    print(f"report: {path}" if path else "no report (no progress recorded, no checkpoint dir)")
    return 0 if path else 1


if __name__ == "__main__":
    sys.exit(main())
