"""Headless Chromium (Debian's ``chromium`` package) from the command line, as a person's browser
would open a page: ``--dump-dom`` gives the document after its scripts ran, ``--screenshot`` a PNG.
No WebDriver needed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The browser's path; the test skips without one unless TFYARN_REQUIRE_CHROMIUM=1 (CI), where
    it fails."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("TFYARN_REQUIRE_CHROMIUM") == "1":
        pytest.fail("TFYARN_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)")
    pytest.skip("no chromium on PATH (apt-get install chromium)")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    base = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1200,900",
    ]
    try:
        return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"chromium did not finish within {timeout:g}s: {' '.join(args)}"
        ) from exc


def dom(url: str, budget_ms: int = 3000, timeout: float = 60) -> str:
    """The page's DOM after ``budget_ms`` of (virtual) time: its fetches done and rendered."""
    proc = _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout)
    assert proc.returncode == 0, (
        f"chromium --dump-dom {url} exited {proc.returncode}: {proc.stderr[-2000:]}"
    )
    return proc.stdout


def screenshot(url: str, path: Path, budget_ms: int = 3000, timeout: float = 60) -> Path:
    """A PNG of the page at ``path`` (its directory made: chromium does not make it)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    proc = _run([f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", url], timeout)
    assert proc.returncode == 0 and Path(path).stat().st_size > 0, (
        f"no screenshot of {url}: {proc.stderr[-2000:]}"
    )
    return Path(path)
