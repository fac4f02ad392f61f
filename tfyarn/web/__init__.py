"""The job's page: one self-contained HTML page (inline JS and SVG, no build step) and its JSON,
served by a small stdlib HTTP server from whatever supervises the job (the local launcher, the
in-app supervisor on YARN) or from a run report after the end (``tfyarn report --serve``). It knows
nothing of backends: it is given callables."""

import os
from tfyarn.web.server import StatusPage

__all__ = ["StatusPage", "page_enabled"]


def page_enabled() -> bool:
    """``TFYARN_PAGE=0`` (or false/no/off) turns the job's page off, where it would be served."""

    return os.environ.get("TFYARN_PAGE", "1").strip().lower() not in ("0", "false", "no", "off")
