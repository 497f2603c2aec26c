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


def on_a_terminal(args: list[str], cwd: Path) -> str:
    """What `python -m mapstream ARGS` writes on a terminal 120 columns wide (a pseudo-terminal
    for its stdout and stderr), carriage returns as line ends."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-m", "mapstream", *args], stdin=subprocess.DEVNULL, stdout=child_fd,
                             stderr=child_fd, cwd=cwd, env=env)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    child.wait(timeout=600)
    os.close(main_fd)
    assert child.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace").replace("\r", "\n")


def test_a_job_over_many_inputs_keeps_its_bar_below_the_log_on_a_terminal(tmp_path: Path) -> None:
    """The job's bar over its inputs is redrawn under each log line, never written over by one:
    no log record starts on a bar's line."""
    from PIL import Image

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.fromarray(np.full((28, 42, 3), 40 * i + 20, np.uint8)).save(tmp_path / name / f"{i}.png")
    text = on_a_terminal(["run", "a", "b", "--out", "job", "--model", "tiny", "--image-size", "42",
                          "--num-scale-frames", "2", "--device", "cpu", "--formats", "npz"], tmp_path)
    bars = [line for line in text.splitlines() if line.startswith("inputs:")]
    assert bars and "2/2" in bars[-1]
    assert not re.search(r"input/s[^\n]*\](INFO|WARNING)", text), text
    assert "INFO mapstream.fleet.tracker: a: 3 frames" in text
