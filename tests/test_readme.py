"""The README starts with the two set-up commands, and CI runs exactly the second one."""
from __future__ import annotations

import re

from conftest import REPO


def _blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", (REPO / "README.md").read_text(), flags=re.S)


def test_readme_starts_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    blocks = _blocks()
    assert len(blocks) >= 2
    assert text.index(blocks[0]) < text.index(blocks[1]) < text.index("mapstream is")
    assert "mapstream run --demo" in blocks[0]
    assert "pytest" in blocks[1]


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert _blocks()[1] in ci.splitlines()
