"""Issue 29's habits, held between CI's mypy runs: mypy checks every module of tfyarn/ (pyproject
exempts none by name) and a ``# type: ignore`` stays only where a third-party package ships no
types, with its code and reason."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What an ignore may look like: ``# type: ignore[import-untyped]  # <why>`` (or import-not-found).
ALLOWED = re.compile(r"\[(import-untyped|import-not-found)\]\s+#\s*\S")
IGNORE = re.compile(r"#\s*type:\s*ignore(.*)$")


def bad_ignores(lines: list[str]) -> list[int]:
    """Line numbers (from 1) of the ignores that are not for a missing stub with its reason."""
    found = [(n, IGNORE.search(line)) for n, line in enumerate(lines, 1)]
    return [n for n, m in found if m and not ALLOWED.match(m.group(1))]


def test_bad_ignores_tells_a_reasoned_missing_stub_from_the_rest():
    lines = ["import x  # type: ignore[import-untyped]  # x ships no types, no stub package",
             "y = f()  # type: ignore[arg-type]  # duck-typed",
             "import z  # type: ignore[import-untyped]",
             "w = g()  # type: ignore",
             "v = 1  # a comment about type: ignore[...] habits is not one"]
    assert bad_ignores(lines) == [2, 3, 4]


def test_type_ignores_in_tfyarn_are_only_for_missing_stubs():
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "tfyarn").rglob("*.py"))
           for n in bad_ignores(p.read_text().splitlines())]
    assert bad == []


def test_mypy_exempts_no_module_of_tfyarn():
    mypy = (ROOT / "pyproject.toml").read_text().split("[tool.mypy]", 1)[1].split("\n[tool.", 1)[0]
    assert "warn_unused_ignores = true" in mypy and 'files = ["tfyarn"]' in mypy
    assert "ignore_errors" not in mypy and not re.search(r"""module = \[[^\]]*["']tfyarn""", mypy)
