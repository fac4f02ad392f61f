"""docs/spec-reference.md is generated from the spec's JSON Schema and current (scripts/spec_reference.py --check)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_spec_reference_is_generated_and_current():
    r = subprocess.run([sys.executable, "scripts/spec_reference.py", "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = (ROOT / "docs" / "spec-reference.md").read_text()
    assert "| `checkpoint` | Checkpoint |" in text and "## Role" in text and "| `index_cache` |" in text
