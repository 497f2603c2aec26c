"""Shared test fixtures.

Golden data and photo sequences are read in place from the ``shared/`` folder that lies
beside the repository (``../shared``); ``MAPSTREAM_SHARED`` overrides the location.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MAPSTREAM_SHARED", REPO.parent / "shared")).resolve()
GOLDEN = SHARED / "golden"
DATA = SHARED / "data"


def golden_case(name: str) -> tuple[dict[str, torch.Tensor], dict]:
    """Load ``<name>.safetensors`` and its ``<name>.json`` sidecar from the golden folder."""
    from safetensors.torch import load_file

    path = GOLDEN / f"{name}.safetensors"
    if not path.exists():
        pytest.skip(f"golden case {name} not found under {GOLDEN}")
    meta_path = GOLDEN / f"{name}.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return load_file(str(path)), meta


def trim_process_memory() -> None:
    """Collect garbage and hand the allocator's free heap back to the system (glibc's
    malloc_trim): what earlier tests freed stops counting in the resident size before a
    full-size model is built."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def golden_images(tensors: dict[str, torch.Tensor], key: str = "images_u8") -> torch.Tensor:
    """The model input of a golden case: ``uint8 / 255`` (lossless), shape [S, 3, H, W]."""
    return tensors[key].to(torch.float32) / 255


@pytest.fixture
def fake_gpu(monkeypatch):
    """``fake_gpu(gib)``: torch.cuda reports a GPU of that many GiB named "a fake GPU" (for
    memory plans; nothing runs on it)."""
    from types import SimpleNamespace

    def make(gib: float) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=int(gib * 2**30)))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "a fake GPU")

    return make


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # The golden data was produced with 2 threads; keep CPU runs comparable and repeatable.
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip_cuda)


def run_interpreted(script: Path) -> dict:
    """Run `script` in a fresh process under Triton's CPU interpreter (the variable must be
    set before Triton is imported) and return the JSON report on its last line of output."""
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


class ScriptedPowerReadings:
    """GPU power readings (`mapstream.gpu_power.Reader`) given in the order a PowerLog asks for
    them: each call takes the next of its list."""

    def __init__(self, energy_mj, mhz, reasons, limit_w: float = 700.0) -> None:
        self._energy, self._mhz, self._reasons, self._limit = list(energy_mj), list(mhz), list(reasons), limit_w

    def energy_mj(self):
        return self._energy.pop(0)

    def sm_mhz(self):
        return self._mhz.pop(0)

    def reasons(self):
        return self._reasons.pop(0)

    def power_limit_w(self):
        return self._limit


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_weights() -> dict[str, torch.Tensor]:
    """The golden tiny state dict (the weight rule applied to manifest_tiny.json)."""
    from safetensors.torch import load_file

    path = GOLDEN / "tiny_weights.safetensors"
    if not path.exists():
        pytest.skip("tiny golden weights not found")
    return load_file(str(path))


@pytest.fixture(scope="session")
def _synthetic_small_file(tmp_path_factory) -> Path:
    """The small preset with the weight rule's weights in float16 (the loaders read any preset and
    storage; the package's own file is checked in tests/pipeline/test_small_model.py)."""
    import mapstream
    from safetensors.torch import save_file

    model = mapstream.fill_synthetic_(mapstream.build_model("small"))
    path = tmp_path_factory.mktemp("weights") / "small.safetensors"
    save_file({k: v.to(torch.float16) if v.is_floating_point() else v for k, v in model.state_dict().items()},
              str(path))
    return path


@pytest.fixture
def shipped_small(monkeypatch, _synthetic_small_file) -> Path:
    """Stand-in shipped small weights (known values, whatever the package ships): the file
    `mapstream.weights.small_weights()` returns for the test's duration."""
    import mapstream.weights

    monkeypatch.setattr(mapstream.weights, "_SMALL_FILE", _synthetic_small_file)
    return _synthetic_small_file


@pytest.fixture
def no_shipped_small(monkeypatch, tmp_path) -> None:
    """An installation of mapstream without the shipped small weights."""
    import mapstream.weights

    monkeypatch.setattr(mapstream.weights, "_SMALL_FILE", tmp_path / "missing" / "small.safetensors")
