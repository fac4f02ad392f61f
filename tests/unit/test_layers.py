"""The import layers of docs/ARCHITECTURE.md, enforced: pyproject's import-linter contracts (layers; the CLI
imports only api and display of tfyarn's parts; gateway modules never import TensorFlow themselves) and no import
cycle anywhere in tfyarn. (That gateway commands load no TensorFlow at run time is tests/unit/test_cli.py's
test_gateway_commands_import_no_tensorflow.)"""
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_of_pyproject_are_kept():
    """``lint-imports`` over this checkout (a deliberately added ``task -> backends`` import breaks it, as does an
    ``import tensorflow`` in api.py, or a ``backends -> runner`` one: each tried when its contract was written)."""
    pytest.importorskip("importlinter")
    r = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "9 kept, 0 broken" in r.stdout, r.stdout[-2000:]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_tfyarn_takes_part_in_an_import_cycle():
    g = grimp.build_graph("tfyarn", include_external_packages=False)
    edges = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    assert len(edges) > 50 and sum(map(len, edges.values())) > 200      # the graph was read, not empty
    assert _cycles(edges) == []
