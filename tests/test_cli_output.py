"""What the command line writes on stderr: progress bars only where someone watches them, and
each log record once."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mapstream.cli.main import main
from mapstream.export import Reconstruction


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    """A run folder of 3 frames of a grey plane seen by cameras moving along x."""
    pytest.importorskip("av")
    n, h, w = 3, 12, 16
    poses = np.zeros((n, 3, 4), np.float32)
    poses[:, :, :3] = np.eye(3)
    poses[:, 0, 3] = 0.1 * np.arange(n)
    K = np.array([[10.0, 0, w / 2], [0, 10.0, h / 2], [0, 0, 1]], np.float32)
    run = tmp_path / "run"
    Reconstruction(
        images=np.full((n, h, w, 3), 128, np.uint8), depth=np.full((n, h, w), 2.0, np.float32),
        depth_conf=np.full((n, h, w), 3.0, np.float32), T_world_cam=poses, K=np.repeat(K[None], n, 0),
        pose_enc=np.zeros((n, 9), np.float32), names=[f"f{i}.png" for i in range(n)],
    ).save_npz(run / "predictions.npz")
    return run


def render(run: Path, *flags: str) -> int:
    return main(["render", str(run), "--height", "32", "--device", "cpu", "--out", str(run / "fly.mp4"), *flags])


def test_progress_bars_stay_out_of_a_redirected_log(run_folder, capfd, monkeypatch) -> None:
    """stderr captured (a file, as `2> log` makes it): no bar unless --no-quiet asks for one;
    on a terminal the bar shows unless --quiet."""
    import mapstream.progress

    assert render(run_folder) == 0
    assert "render:" not in capfd.readouterr().err
    assert render(run_folder, "--no-quiet") == 0
    assert "render: 100%" in capfd.readouterr().err  # asked for: shown even in a log

    monkeypatch.setattr(mapstream.progress, "stderr_is_terminal", lambda: True)
    assert render(run_folder) == 0
    assert "render: 100%" in capfd.readouterr().err
    assert render(run_folder, "--quiet") == 0
    assert "render:" not in capfd.readouterr().err


WARN_FROM_THE_HUB = """
import logging, tyro
from mapstream.cli import main as cli

class Command:
    def main(self):
        logging.getLogger("huggingface_hub.utils._http").warning("hub warning")
        return 0

tyro.cli = lambda *args, **kwargs: Command()  # any command whose work makes the hub warn
raise SystemExit(cli.main(["info"]))
"""


def test_the_hubs_warnings_print_once() -> None:
    done = subprocess.run([sys.executable, "-c", WARN_FROM_THE_HUB], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("hub warning") == 1, done.stderr
    assert "WARNING huggingface_hub.utils._http: hub warning" in done.stderr  # in the CLI's own log format


@pytest.mark.parametrize("command, usage", [
    ("eval", "usage: mapstream eval [-h] [EVAL OPTIONS] RUN"),
    ("convert", "usage: mapstream convert [-h] CKPT [--dst PATH]"),
    ("run", "usage: mapstream run [-h] [RUN OPTIONS] [INPUT ...]"),
    ("stream", "usage: mapstream stream [-h] [STREAM OPTIONS] INPUT"),
])
def test_help_names_each_argument_by_what_it_is(command, usage, capsys) -> None:
    """The positional arguments' names say what to give, not the type tyro reads (STR); eval's
    and convert's options too."""
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(usage) and not re.search(r"\bSTR\b", text.splitlines()[0])
    if command in ("eval", "convert"):
        assert not re.search(r"\bSTR\b", text)
