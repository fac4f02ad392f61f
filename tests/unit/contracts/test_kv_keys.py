"""The KV protocol is one module (tfyarn/contracts/kv_keys.py): docs/ARCHITECTURE.md's table is its KEYS, every module
it names as a writer or reader exists, and no other tfyarn module spells a key of its own."""
import ast
import re
from pathlib import Path

from tfyarn.contracts import kv_keys

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "tfyarn"


def _doc_rows() -> list[list[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## KV key layout", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in rows]


def test_the_architecture_table_is_the_modules_table():
    rows = _doc_rows()
    assert [r[0].strip("`") for r in rows] == [k.pattern for k in kv_keys.KEYS]
    assert [(r[1], r[2], r[3]) for r in rows] == [(k.value, k.writers, k.readers) for k in kv_keys.KEYS]


def test_every_key_constant_has_a_row_and_every_row_a_constant():
    constants = {v for n, v in vars(kv_keys).items() if n.isupper() and isinstance(v, str)}
    patterns = [k.pattern for k in kv_keys.KEYS]
    for c in constants:    # a prefix ("exit/") is the start of its row's pattern, a key ("summary") is its pattern
        assert any(p == c or p.startswith(c) for p in patterns), f"{c!r} has no row in KEYS"
    for p in patterns:
        assert any(p == c or p.startswith(c) for c in constants), f"row {p!r} has no constant"


def test_the_modules_named_as_writers_and_readers_exist():
    named = set()
    for k in kv_keys.KEYS:
        named |= set(re.findall(r"\b((?:backends|task|tasklib|train|data|runner|contracts)(?:\.\w+)*)\b",
                                f"{k.writers} {k.readers}"))
    assert len(named) > 15
    for mod in named:
        path = PKG.joinpath(*mod.split("."))
        assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), mod


def _key_literals(tree: ast.AST) -> list[str]:
    prefixes = tuple(p for n, p in vars(kv_keys).items() if n.endswith("_PREFIX"))
    prefixes += tuple(v for n, v in vars(kv_keys).items() if n.endswith("_KEY") and "/" in v)
    out = []
    in_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in in_fstrings:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(prefixes):
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = node.values[0].value
            if isinstance(head, str) and head.startswith(prefixes):
                out.append(head)
    return out


def test_no_module_but_kv_keys_spells_a_key():
    offenders = {}
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "kv_keys.py":
            continue
        found = _key_literals(ast.parse(path.read_text()))
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


def test_the_literal_finder_finds_an_inline_key():
    assert _key_literals(ast.parse('kv.put(f"rejoin/{task}/1", x); kv.get("control/done")')) == \
        ["rejoin/", "control/done"]
