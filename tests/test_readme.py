"""The README starts with the two set-up commands, and CI runs exactly the second one."""
from __future__ import annotations

import re

import shutil

import pytest

from conftest import DATA, REPO


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


def test_every_test_the_limits_document_cites_exists():
    """docs/REFERENCE_LIMITS.md names the tests that prove each behaviour (`file::name`, or
    `::name` for another test of the file before it): none may be renamed away unnoticed."""
    text = (REPO / "docs" / "REFERENCE_LIMITS.md").read_text()
    cited, last = [], None
    for path, name in re.findall(r"`(\w+/test_\w+\.py)?(?:::(\w+))?`", text):
        last = path or last
        if path or name:
            cited.append((last, name))
    assert len(cited) > 30
    for path, name in cited:
        source = (REPO / "tests" / path).read_text()
        assert not name or f"def {name}(" in source, f"{path}::{name}"


def test_the_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """The README's first Python example, unchanged, on ten photos in my_frames/; only the
    checkpoint is the tiny preset's (nothing can be downloaded here)."""
    import mapstream

    photos = sorted((DATA / "courthouse").glob("*.png"))[:10]
    if len(photos) < 10:
        pytest.skip("the courthouse photos are not there")
    (tmp_path / "my_frames").mkdir()
    for photo in photos:
        shutil.copy(photo, tmp_path / "my_frames" / photo.name)
    monkeypatch.chdir(tmp_path)
    tiny = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    monkeypatch.setattr(mapstream, "load_model", lambda *args, **kwargs: tiny)
    code = re.findall(r"```python\n(.*?)\n```", (REPO / "README.md").read_text(), flags=re.S)[0]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == [str(i) for i in range(10)]
    frames = namespace["frames"]
    out = namespace["out"]
    assert out["pose_enc"].shape == (1, 10, 9)
    assert out["depth"].shape == (1, 10, *frames.shape[-2:], 1)
