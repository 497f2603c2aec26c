"""What the run tests share: real photos copied to a temp folder, and `mapstream run` on the
tiny preset at a small size."""
from __future__ import annotations

import shutil

import pytest

from conftest import DATA
from mapstream.cli.main import main


def photos(tmp_path, n=10):
    src = DATA / "courthouse"
    if not src.exists():
        pytest.skip(f"{src} not found")
    folder = tmp_path / "frames"
    folder.mkdir()
    for p in sorted(src.glob("*.png"))[:n]:
        shutil.copy(p, folder / p.name)
    return folder


def run_cli(*args) -> int:
    return main(["run", *args, "--model", "tiny", "--image-size", "140", "--num-scale-frames", "2", "--quiet"])
