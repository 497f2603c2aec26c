"""`mapstream run` without network: it goes on at once with mapstream's shipped small model
and names the ways to the official weights (or, without shipped weights or for another
checkpoint, stops at once with them), uses a cached checkpoint without waiting, and downloads
for real when a hub answers (here a local one)."""
from __future__ import annotations

import hashlib
import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import mapstream
from mapstream import hub
from mapstream.cli.main import main
from mapstream.pipeline.model_source import DEFAULT_CHECKPOINT, DEFAULT_REPO, resolve_model
from mapstream.weights import SMALL_MODEL, SMALL_WARNING

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def closed_port() -> int:
    """A local port nothing listens on (taken and given back at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hub_at(monkeypatch, tmp_path):
    """Point the hub at an address (its URL), with an empty hub cache and no proxy."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))

    def point(url: str) -> Path:
        monkeypatch.setattr(hub.constants, "ENDPOINT", url)
        monkeypatch.setattr(hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
        return tmp_path / "hub-cache"

    return point


@pytest.fixture(scope="module")
def checkpoint_bytes() -> bytes:
    """The tiny preset's synthetic weights, as the official .pt file holds its weights."""
    buffer = io.BytesIO()
    torch.save({"model": mapstream.fill_synthetic_(mapstream.build_model("tiny")).state_dict()}, buffer)
    return buffer.getvalue()


def photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (42, 56, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


def go_offline(hub_at, monkeypatch, offline: str) -> Path:
    cache = hub_at(f"http://127.0.0.1:{closed_port()}" if offline != "no name resolution" else "https://hub.invalid")
    if offline == "HF_HUB_OFFLINE=1":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


OFFLINE = ["no hub answers", "HF_HUB_OFFLINE=1", "no name resolution"]


@pytest.mark.parametrize("offline", OFFLINE)
def test_an_offline_run_goes_on_with_the_small_model_naming_the_ways_to_the_official_one(
    tmp_path, hub_at, monkeypatch, capsys, offline, shipped_small
):
    cache = go_offline(hub_at, monkeypatch, offline)
    folder = photos(tmp_path)
    flags = ["--quiet", "--image-size", "56", "--num-scale-frames", "2", "--formats", "npz"]
    started = time.perf_counter()
    assert main(["run", str(folder), "--out", str(tmp_path / "out"), *flags]) == 0
    assert time.perf_counter() - started < 15.0  # huggingface_hub's own retries alone take about 30 s
    printed = capsys.readouterr().out
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["config"]["model"] == SMALL_MODEL and f"with {SMALL_MODEL}" in printed
    small_warning, why = info["warnings"]
    assert small_warning == SMALL_WARNING and f"WARNING: {SMALL_WARNING}" in printed
    assert why.startswith(f"The official weights are not at hand: cannot get the checkpoint {DEFAULT_CHECKPOINT} "
                          f"of {DEFAULT_REPO}")
    assert f"--model /path/to/{DEFAULT_CHECKPOINT}" in why and str(cache) in why and "HF_HUB_CACHE" in why
    # The same predictions as asking for the small model by name.
    assert main(["run", str(folder), "--out", str(tmp_path / "named"), "--model", "small", *flags]) == 0
    fallback, named = np.load(tmp_path / "out" / "predictions.npz"), np.load(tmp_path / "named" / "predictions.npz")
    for key in ("depth", "T_world_cam", "K"):
        np.testing.assert_array_equal(fallback[key], named[key])
    assert json.loads((tmp_path / "named" / "run.json").read_text())["warnings"] == [SMALL_WARNING]


def test_another_checkpoint_that_cannot_be_had_stops_the_run(tmp_path, hub_at, monkeypatch, capsys, shipped_small):
    go_offline(hub_at, monkeypatch, "no hub answers")
    assert main(["run", str(photos(tmp_path)), "--out", str(tmp_path / "out"), "--quiet",
                 "--model", "someone/fine-tuned-map"]) == 2
    err = capsys.readouterr().err
    assert "cannot get the checkpoint lingbot-map-long.pt of someone/fine-tuned-map" in err and "--model small" in err
    assert not (tmp_path / "out" / "run.json").exists()


@pytest.mark.parametrize("offline", OFFLINE)
def test_without_shipped_weights_an_offline_run_stops_at_once_naming_the_ways_forward(
    tmp_path, hub_at, monkeypatch, capsys, offline, no_shipped_small
):
    cache = go_offline(hub_at, monkeypatch, offline)
    folder = photos(tmp_path)
    started = time.perf_counter()
    assert main(["run", str(folder), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert time.perf_counter() - started < 4.0  # huggingface_hub's own retries take about 30 s
    err = capsys.readouterr().err
    assert f"cannot get the checkpoint {DEFAULT_CHECKPOINT} of {DEFAULT_REPO}" in err
    assert f"--model /path/to/{DEFAULT_CHECKPOINT}" in err  # a local copy
    assert str(cache) in err and "HF_HUB_CACHE" in err  # the hub cache
    assert "--model small" in err and "--model tiny" in err  # mapstream's own small model, the untrained preset


def test_a_cached_checkpoint_is_used_without_waiting_for_the_hub(tmp_path, hub_at, checkpoint_bytes):
    cache = hub_at(f"http://127.0.0.1:{closed_port()}")
    snapshot = cache / "models--robbyant--lingbot-map" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / DEFAULT_CHECKPOINT).write_bytes(checkpoint_bytes)
    (cache / "models--robbyant--lingbot-map" / "refs").mkdir()
    (cache / "models--robbyant--lingbot-map" / "refs" / "main").write_text(COMMIT)
    started = time.perf_counter()
    model, description, warnings = resolve_model(DEFAULT_REPO, filename=DEFAULT_CHECKPOINT, device=torch.device("cpu"))
    assert time.perf_counter() - started < 10.0  # loading included; no retries
    assert description == f"{DEFAULT_REPO} ({DEFAULT_CHECKPOINT})" and warnings == []
    expected = torch.load(io.BytesIO(checkpoint_bytes), weights_only=True)["model"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, expected[name]), name


class LocalHub(BaseHTTPRequestHandler):
    """Serves the server's ``files`` (URL path -> bytes) as the hub serves a repo's files."""

    def _headers(self) -> bytes | None:
        body = self.server.files.get(self.path)  # type: ignore[attr-defined]
        if body is None:
            self.send_error(404)
            return None
        self.server.requests.append((self.command, self.path))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return body

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._headers()

    def do_GET(self) -> None:  # noqa: N802
        body = self._headers()
        if body is not None:
            self.wfile.write(body)

    def log_message(self, *args) -> None:  # quiet
        pass


def test_the_checkpoint_is_downloaded_from_a_hub_that_answers(tmp_path, hub_at, checkpoint_bytes):
    """The real download path (huggingface_hub's), against a local server holding the file;
    then, the server gone, the copy it left in the cache serves the next run at once."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), LocalHub)
    server.files = {f"/{DEFAULT_REPO}/resolve/main/{DEFAULT_CHECKPOINT}": checkpoint_bytes}
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cache = hub_at(f"http://127.0.0.1:{server.server_address[1]}")
        path = hub.download_checkpoint(DEFAULT_REPO, DEFAULT_CHECKPOINT, probe_timeout=2.0)
    finally:
        server.shutdown()
        server.server_close()
    assert path.read_bytes() == checkpoint_bytes and cache in path.parents
    assert ("GET", f"/{DEFAULT_REPO}/resolve/main/{DEFAULT_CHECKPOINT}") in server.requests
    started = time.perf_counter()
    model, _, _ = resolve_model(DEFAULT_REPO, filename=DEFAULT_CHECKPOINT, device=torch.device("cpu"))
    assert time.perf_counter() - started < 10.0
    assert sum(p.numel() for p in model.parameters()) == sum(
        v.numel() for v in torch.load(io.BytesIO(checkpoint_bytes), weights_only=True)["model"].values())


def test_a_live_view_is_told_of_the_fallback_once_the_model_is_open(
    tmp_path, hub_at, monkeypatch, free_port, shipped_small
):
    """Without --demo the fallback is learned only on loading the model (the hub may answer):
    the live view gets the small model's notice then, above its status line."""
    pytest.importorskip("viser")
    from mapstream.viewer import live

    go_offline(hub_at, monkeypatch, "no hub answers")
    added = []
    start_server = live.start_server

    def recording_start(host, port, title, allowed_origins=()):
        server = start_server(host, port, title, allowed_origins)
        markdown = server.gui.add_markdown

        def add(content, *args, **kwargs):
            handle = markdown(content, *args, **kwargs)
            added.append((content, handle))
            return handle

        server.gui.add_markdown = add
        return server

    monkeypatch.setattr(live, "start_server", recording_start)
    assert main(["run", str(photos(tmp_path)), "--out", str(tmp_path / "out"), "--quiet", "--image-size", "56",
                 "--num-scale-frames", "2", "--formats", "npz", "--view", "--no-keep-view",
                 "--view-port", str(free_port)]) == 0
    contents = [content for content, _ in added]
    assert contents[0] == "waiting for the first frame"  # no notice known when the view started
    notices = [handle for content, handle in added if content == f"**{SMALL_WARNING}**"]
    assert len(notices) == 1 and notices[0].order < added[0][1].order  # above the status line
    # With --demo it is known before the view starts: shown first, and not repeated.
    added.clear()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert main(["run", "--demo", "--out", str(tmp_path / "demo"), "--quiet", "--formats", "npz", "--view",
                 "--no-keep-view", "--view-port", str(free_port)]) == 0
    contents = [content for content, _ in added]
    assert contents[0] == f"**{SMALL_WARNING}**" and contents.count(f"**{SMALL_WARNING}**") == 1


def test_an_offline_run_on_the_small_model_takes_the_width_its_weights_record(
    tmp_path, hub_at, monkeypatch, capsys, _synthetic_small_file
):
    """The fallback is only known once the hub has not answered, after the input is open: the
    run reads the input again at the small model's recorded width (no --image-size given)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    import mapstream.weights
    from mapstream.io.images import preprocessed_height

    with safe_open(str(_synthetic_small_file), "pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    recorded = tmp_path / "small.safetensors"
    save_file(tensors, str(recorded), metadata={"preset": "small", "image_size": "84"})
    monkeypatch.setattr(mapstream.weights, "_SMALL_FILE", recorded)
    go_offline(hub_at, monkeypatch, "no hub answers")
    flags = ["--quiet", "--num-scale-frames", "2", "--formats", "npz"]
    assert main(["run", str(photos(tmp_path)), "--out", str(tmp_path / "out"), *flags]) == 0
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["config"]["model"] == SMALL_MODEL and info["config"]["image_size"] == 84
    height = preprocessed_height(56, 42, "crop", 84, 14)  # the photos are 56x42
    assert np.load(tmp_path / "out" / "predictions.npz")["images"].shape[1:3] == (height, 84)
    capsys.readouterr()

