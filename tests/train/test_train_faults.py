"""`mapstream train`'s faults told in one line, and what a killed run leaves behind.

A --config file with an unknown key, an unknown `loss:` key, a YAML syntax error, or no file at
all is one `error:` line naming the file (and line or key) and what to do, with no traceback.
A run killed in the middle of a checkpoint write (kill -9: no cleanup runs) leaves its temp
file; the next start removes it, and resuming never takes it for a checkpoint."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mapstream.cli.main import main
from mapstream.train.checkpointing import latest_checkpoint, list_checkpoints
from mapstream.train.config import TrainConfig, load_config
from mapstream.train.trainer import train

SMALL = dict(model="tiny", frames=2, image_hw=(28, 28), num_scale_frames=1, batch_size=1, warmup_steps=1, log_every=1,
             tensorboard=False, device="cpu")

FAULTS = {
    "unknown_key": ("frames: 3\nframs: 4\n", ["'frams'", "did you mean 'frames'", "mapstream train --help"]),
    "unknown_loss_key": ("loss:\n  depth: 2.0\n  camra: 3.0\n", ["loss", "'camra'", "did you mean 'camera'"]),
    "loss_not_a_mapping": ("loss: 3.0\n", ["loss", "mapping", "camera"]),
    "syntax_error": ("frames: 3\nimage_hw: [28, 42\nlr: 0.1\n", ["line 3", "not valid YAML"]),
    "not_a_mapping": ("- frames\n- 3\n", ["a mapping of training options", "frames: 8"]),
    "wrong_type": ("lr: fast\n", ["lr must be a number, got 'fast'"]),
    "wrong_loss_type": ("loss:\n  camera: [1]\n", ["loss: camera must be a number, got [1]"]),
    "unusable_value": ("val_every: 3\n", ["val_every (3) must be a multiple of log_every (10)"]),
}


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_config_file_fault_is_one_line_naming_the_file_and_what_is_wrong(fault, tmp_path, capsys):
    text, words = FAULTS[fault]
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert main(["train", "--config", str(path), "--quiet"]) == 2
    line = _one_error_line(capsys)
    assert str(path) in line
    for word in words:
        assert word in line, (word, line)


def test_a_number_yaml_reads_as_a_string_is_taken_as_the_number(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-4\nloss:\n  depth: 2e-1\n")  # YAML 1.1 reads these as strings
    config = load_config(path)
    assert (config.lr, config.loss.depth) == (1e-4, 0.2)


def test_a_missing_config_file_is_one_line_saying_so(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    assert main(["train", f"--config={missing}"]) == 2
    line = _one_error_line(capsys)
    assert f"--config {missing}: no such file" in line and "recipes/" in line
    assert main(["train", "--config", str(tmp_path)]) == 2  # a folder
    assert f"--config {tmp_path}: a folder" in _one_error_line(capsys)


def _kill_during_write(target) -> None:
    """A process that dies by SIGKILL inside an atomic write of ``target``, as a run killed while
    saving a checkpoint does."""
    code = textwrap.dedent(f"""
        import os, signal
        from mapstream.io.atomic import atomic_path
        with atomic_path({str(target)!r}) as tmp:
            tmp.write_bytes(b"")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9


def test_a_checkpoint_write_killed_midway_is_cleaned_up_by_the_next_start(tmp_path):
    out = tmp_path / "run"
    first = train(TrainConfig(out=out, steps=2, **SMALL), progress=False, stop_at=1)
    _kill_during_write(out / "checkpoints" / "step-00000002.pt")
    _kill_during_write(out / "model.safetensors")
    (out / ".notes.txt.tmp-0123abcd.txt").write_text("not ours")
    stale = sorted(p.name for p in out.rglob(".*.tmp-*"))
    assert len(stale) == 3 and all((out / "checkpoints" / n).stat().st_size == 0 for n in stale if n.startswith(".step"))
    # Resuming never takes a temp file for a checkpoint, even one of a later step.
    assert latest_checkpoint(out) == first.checkpoint and [s for s, _ in list_checkpoints(out)] == [1]
    second = train(TrainConfig(out=out, steps=2, **SMALL), progress=False)
    assert (second.start_step, second.steps) == (1, 2)
    assert sorted(p.name for p in out.rglob(".*.tmp-*")) == [".notes.txt.tmp-0123abcd.txt"]
    # A fresh start (--no-resume) cleans up too.
    _kill_during_write(out / "checkpoints" / "step-00000003.pt")
    train(TrainConfig(out=out, steps=1, resume=False, **SMALL), progress=False)
    assert sorted(p.name for p in out.rglob(".*.tmp-*")) == [".notes.txt.tmp-0123abcd.txt"]
