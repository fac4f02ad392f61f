"""docs/ARCHITECTURE.md's module tree is the code's: every file and folder it names exists, and every module of the
packages it lists whole (tfyarn's root, contracts/, runner/, backends/, gateway/, cluster/, common/, task/, tasklib/) is
in it."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: folders whose every module the tree lists (recursively below)
COMPLETE = ("", "contracts", "runner", "backends", "gateway", "cluster", "common", "task", "tasklib")


def tree_entries() -> list[str]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("```\ntfyarn/\n", 1)[1].split("```", 1)[0]
    stack: list[tuple[int, str]] = []
    out = []
    for line in block.splitlines():
        m = re.match(r"^( *)([\w.]+(?:/|\.py))(?: |$)", line)
        if not m or len(m.group(1)) > 8:       # continuation lines are indented past the names
            continue
        indent, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([p for _, p in stack] + [name.rstrip("/")])
        out.append(path + ("/" if name.endswith("/") else ""))
        if name.endswith("/"):
            stack.append((indent, name.rstrip("/")))
    return out


def test_the_tree_is_read():
    entries = tree_entries()
    assert "backends/yarn/connection.py" in entries and "contracts/kv_keys.py" in entries and "api.py" in entries
    assert "runner/yarn_app/supervise.py" in entries


def test_every_entry_of_the_tree_exists():
    missing = [e for e in tree_entries() if not (ROOT / "tfyarn" / e).exists()]
    assert missing == []


def test_every_gateway_module_is_in_the_tree():
    listed = set(tree_entries())
    pkg = ROOT / "tfyarn"
    unlisted = []
    for folder in COMPLETE:
        files = (pkg / folder).glob("*.py") if folder == "" else (pkg / folder).rglob("*.py")
        for f in files:
            rel = str(f.relative_to(pkg))
            if f.name != "__init__.py" and rel not in listed:
                unlisted.append(rel)
    assert sorted(unlisted) == []
