"""Write docs/spec-reference.md from the spec's JSON Schema (``tfyarn schema``): every key, its type, default and
description, section by section. ``python scripts/spec_reference.py`` rewrites the file; ``--check`` exits 1 when it is
stale (tests/unit/test_spec_reference.py runs that in CI), so the reference never drifts from tfyarn/spec.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "spec-reference.md"
HEADER = """# Job spec reference

Generated from the spec's JSON Schema (`tfyarn schema`) by `scripts/spec_reference.py`; do not edit by hand
(`tests/unit/test_spec_reference.py` fails when this file is stale). Relative local paths are made absolute against the
spec file's directory when the spec is loaded. The README shows a whole spec; `specs/` holds more examples.
"""


def _type(p: dict[str, Any]) -> str:
    """A short type text: ``string``, ``integer | null``, ``list of string``, ``Role``, ``one of ps, allreduce``."""
    if "$ref" in p:
        return p["$ref"].rsplit("/", 1)[1]
    if "enum" in p:
        return "one of " + ", ".join(map(str, p["enum"]))
    if "anyOf" in p:
        return " | ".join(_type(a) for a in p["anyOf"])
    if p.get("type") == "array":
        return "list of " + _type(p.get("items", {}))
    if p.get("type") == "object" and isinstance(p.get("additionalProperties"), dict):
        return "map of " + _type(p["additionalProperties"])
    return str(p.get("type", "any"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(schema: dict[str, Any], prefix: str) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, p in schema.get("properties", {}).items():
        default = "required" if key in required else json.dumps(p["default"]) if "default" in p else ""
        rows.append(f"| `{prefix}{key}` | {_cell(_type(p))} | {_cell(default)} | {_cell(p.get('description', ''))} |")
    return rows


def render(schema: dict[str, Any]) -> str:
    lines = [HEADER, "## The spec (top level)", "", *_table(schema, ""), ""]
    for name, sub in sorted(schema.get("$defs", {}).items()):
        if "properties" not in sub:       # an enum: its values are named where it is used
            continue
        lines += [f"## {name}", ""]
        if sub.get("description"):
            lines += [_cell(sub["description"]), ""]
        lines += [*_table(sub, ""), ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/spec-reference.md is stale")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tfyarn.spec import json_schema
    text = render(json_schema())
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python scripts/spec_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
