"""The README starts with the two set-up commands, and CI runs exactly the second one; the
README stays short and the user docs hold every command's options, links that resolve and
nothing a user does not have."""
from __future__ import annotations

import re

import shutil

import pytest

from conftest import DATA, REPO

COMMAND_DOCS = {
    "run": "RUN.md", "export": "EXPORT.md", "view": "VIEWER.md", "render": "RENDER.md", "eval": "EVALUATION.md",
    "convert": "CLI.md", "bench": "CLI.md", "info": "CLI.md", "train": "TRAINING.md", "serve": "SERVE.md",
    "stream": "SERVE.md",
}
"""The page that documents each command's options."""


def _user_docs() -> list:
    """The README and the docs a user reads (the benchmark log is the project's own record)."""
    return [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "BENCHMARKS.md")]


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


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


def test_the_readme_fits_on_two_screens():
    assert len((REPO / "README.md").read_text().splitlines()) <= 100


def test_every_command_has_a_row_in_the_readme_and_a_page():
    names = set(_command_classes())
    assert names == set(COMMAND_DOCS)
    readme = (REPO / "README.md").read_text()
    for name in names:
        assert f"| `mapstream {name}" in readme, name


def _command_classes() -> dict:
    """Command name -> the dataclass tyro builds its flags from."""
    import typing

    from mapstream.cli.main import _commands

    return {typing.get_args(option)[1].name: typing.get_args(option)[0] for option in typing.get_args(_commands())}


@pytest.mark.parametrize("command", sorted(COMMAND_DOCS))
def test_every_option_of_a_command_is_in_its_page(command):
    import warnings

    import tyro

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # get_parser: the parser tyro runs
        parser = tyro.extras.get_parser(_command_classes()[command])
    flags = {flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")}
    assert "--help" in flags
    page = (REPO / "docs" / COMMAND_DOCS[command]).read_text()
    mentioned = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)*", page))  # --map.capacity too
    # A switch counts as documented under either spelling (--view or --no-view).
    missing = sorted(f for f in flags - {"--help"} if not {f, f.replace("--no-", "--", 1), f"--no-{f[2:]}"} & mentioned)
    assert not missing, f"docs/{COMMAND_DOCS[command]} does not mention {missing}"


def test_user_docs_cite_no_file_a_user_does_not_have():
    """The reference's specification files are the project's, not the users': a doc states the
    fact itself instead of pointing at them."""
    for path in _user_docs():
        text = path.read_text()
        assert "shared/spec" not in text and "shared/bench" not in text, path.name
        assert not re.search(r"(?<![\w/])(APP|LIMITS|STREAMING|MODEL)\.md", text), path.name


def test_links_between_the_docs_resolve():
    for path in [*_user_docs(), REPO / "docs" / "BENCHMARKS.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if "://" in target:
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.exists(), f"{path.name} links to {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
                assert anchor in {_slug(h) for h in headings}, f"{path.name} links to {target}"
