"""Shared by the Keras/entrypoint tests (tests/train) and their cluster half (tests/yarn): docs/models.md's example
scripts, and the tf_keras requirement (installed with --no-deps by .ci/run)."""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def doc_examples() -> dict[str, str]:
    """docs/models.md's scripts, by the file name in the ``<!-- example: NAME -->`` line above each."""
    text = (ROOT / "docs" / "models.md").read_text()
    return dict(re.findall(r"<!-- example: (\S+) -->\n```python\n(.*?)```", text, re.DOTALL))


def require_tf_keras() -> None:
    """Skipped outside CI when tf_keras is missing; a failure in CI (TFYARN_REQUIRE_TF_KERAS=1, set by .ci/run)."""
    if os.environ.get("TFYARN_REQUIRE_TF_KERAS") == "1":
        import tf_keras  # noqa: F401
    else:
        pytest.importorskip("tf_keras")
