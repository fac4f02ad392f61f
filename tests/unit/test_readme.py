"""The README is a landing page: short, every guide it links exists (but the two written on other branches), and every
`tfyarn` command of its shell blocks is a real command with real options (the quickstart block itself is run by
.ci/run, its spec example loaded by tests/unit/test_spec.py)."""
import re
import shlex
from pathlib import Path

import click

from tfyarn import cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
ELSEWHERE = {"docs/models.md", "docs/data.md"}     # written on the issue-27 and issue-28 branches


def test_the_readme_is_a_landing_page_whose_links_resolve():
    assert README.count("\n") <= 200
    links = set(re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)", README))
    assert {"docs/spec-reference.md", "docs/yarn.md", "docs/kerberos.md", "docs/troubleshooting.md"} <= links
    assert [link for link in links - ELSEWHERE if not (ROOT / link).exists()] == []


def test_every_tfyarn_command_in_the_readme_exists_with_its_options():
    lines = [line.split("#", 1)[0].strip() for block in re.findall(r"```bash\n(.*?)```", README, re.S)
             for line in block.splitlines()]
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("tfyarn ")]
    assert len(commands) >= 4
    group = cli.cli
    assert isinstance(group, click.Group)
    for words in commands:
        cmd = group.commands[words[0]]
        known = {o for p in cmd.params for o in getattr(p, "opts", [])}
        unknown = [w for w in words[1:] if w.startswith("-") and w not in known]
        assert unknown == [], (words, unknown)
