"""Evaluation maps ground-truth depth through the run's own preprocessing, and pairs denser runs.

The photos are made of flat-coloured blocks, each block one depth. They go through the run's
own frame source (`mapstream.io.sources.open_source`, as `mapstream run` reads a folder); each
pixel of the resulting frame whose colour is exactly a block's colour is predicted at exactly
that block's depth, pixels blended across a block edge are left unpredicted (NaN), and the
white padding of pad mode is predicted at a wrong depth (50) that evaluation must ignore.
Such a prediction is perfect: it must score abs_rel 0 with no depth alignment at all.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mapstream.cli.main import main
from mapstream.eval.datasets import canonical_timestamp, write_benchmark_scene
from mapstream.eval.predictions import write_predictions
from mapstream.eval.runner import evaluate
from mapstream.io.sources import open_source

BLOCK = 20  # photo pixels per block side
SIZE = 140  # the run's --image-size


def block_photos(width: int, height: int, count: int, seed: int = 0):
    """``count`` photos ``[H, W, 3]`` uint8 of flat blocks, their depth maps, and the colour -> depth table."""
    rng = np.random.default_rng(seed)
    rows, cols = -(-height // BLOCK), -(-width // BLOCK)
    photos, depths, table = [], [], {}
    for _ in range(count):
        colours = rng.integers(0, 230, size=(rows, cols, 3), dtype=np.uint8)  # never white
        values = rng.uniform(1.0, 5.0, size=(rows, cols)).astype(np.float32)
        for colour, value in zip(colours.reshape(-1, 3), values.reshape(-1)):
            table[tuple(int(c) for c in colour)] = float(value)
        expand = lambda a: np.repeat(np.repeat(a, BLOCK, 0), BLOCK, 1)[:height, :width]  # noqa: E731
        photos.append(expand(colours))
        depths.append(expand(values))
    return np.stack(photos), np.stack(depths), table


def predicted_depth(frame, table: dict) -> np.ndarray:
    """A frame ``[3, H, W]`` in [0, 1] read back as depth: a block's colour gives its depth,
    white (padding) a wrong 50, anything else (a blend of blocks) NaN."""
    pixels = np.rint(frame.permute(1, 2, 0).numpy() * 255).astype(np.int64)
    depth = np.full(pixels.shape[:2], np.nan, np.float32)
    for r, c in np.ndindex(*pixels.shape[:2]):
        key = tuple(int(v) for v in pixels[r, c])
        depth[r, c] = 50.0 if key == (255, 255, 255) else table.get(key, np.nan)
    return depth


def make_run_and_ground_truth(tmp_path: Path, width: int, height: int, mode: str, rotate: int = 0):
    """(run folder, ground-truth scene): photos written as files, read by the run's frame source."""
    n = 3
    photos, depths, table = block_photos(width, height, n)
    stamps = np.arange(n) * 0.1
    T = np.repeat(np.eye(4)[None], n, 0)
    T[:, 0, 3] = np.arange(n) * 0.2 + np.array([0.0, 0.1, 0.05])
    T[:, 1, 3] = np.array([0.0, 0.05, 0.3])
    K = np.array([[100.0, 0, width / 2], [0, 100.0, height / 2], [0, 0, 1]])
    gt = write_benchmark_scene(tmp_path / "scene" / "gt", stamps, T, K, (height, width), depth=depths, depth_format="npy")
    folder = tmp_path / "photos"
    folder.mkdir()
    for stamp, photo in zip(stamps, photos):
        Image.fromarray(photo).save(folder / f"{canonical_timestamp(stamp)}.png")
    source = open_source(str(folder), mode=mode, image_size=SIZE, rotate=rotate)
    names, frames = zip(*source)
    pred = np.stack([predicted_depth(f, table) for f in frames])
    assert np.isfinite(pred).mean() > 0.5  # most pixels are a block's inside
    run = tmp_path / "run"
    write_predictions(run, names=list(names), T_world_cam=T, K=np.repeat(K[None], n, 0), depth=pred)
    (run / "run.json").write_text(json.dumps({"config": {"preprocess": mode, "image_size": SIZE, "rotate": rotate}}))
    return run, gt.parent


@pytest.mark.parametrize("width, height, mode, rotate", [
    (200, 127, "crop", 0),   # the height rounds to whole patches: a stretch, not a scale
    (100, 150, "crop", 0),   # taller than square after resizing: rows cut off, centred
    (100, 150, "crop", 90),  # turned first
    (160, 120, "pad", 0),    # letterboxed: white rows above and below
    (120, 160, "pad", 0),    # pillarboxed: white columns left and right
])
def test_a_perfect_prediction_through_the_runs_preprocessing_scores_zero(tmp_path, width, height, mode, rotate):
    run, scene = make_run_and_ground_truth(tmp_path, width, height, mode, rotate)
    report = evaluate(run, scene, depth_align="none", points=False)
    depth = report.scenes[0].metrics["depth"]
    assert depth["abs_rel"] < 1e-6 and depth["rmse"] < 1e-5 and depth["delta_1"] == 1.0
    assert f"{mode} preprocessing at {SIZE}" in depth["gt_resize"]


def test_a_prediction_that_does_not_fit_its_run_json_is_told(tmp_path):
    run, scene = make_run_and_ground_truth(tmp_path, 200, 127, "crop")
    (run / "run.json").write_text(json.dumps({"config": {"preprocess": "pad", "image_size": SIZE, "rotate": 0}}))
    s = evaluate(run, scene, points=False).scenes[0]
    assert "run.json does not describe this prediction" in s.errors["depth"]
    assert "trajectory" in s.metrics  # the other groups still run


def test_a_run_denser_than_its_ground_truth_is_evaluated_by_timestamp(tmp_path, caplog):
    """A run of 3 frames per ground-truth frame: `mapstream eval` pairs only by
    `--match timestamp`, each ground-truth frame with its nearest run frame."""
    run, scene = make_run_and_ground_truth(tmp_path, 160, 120, "pad")
    sparse = np.load(run / "predictions.npz")
    n = len(sparse["names"])
    pick = np.repeat(np.arange(n), 3)  # frames at t, t + 0.03, t + 0.06: only t is within 0.02 s
    names = [f"{canonical_timestamp(0.1 * i + 0.03 * (k % 3))}.png" for k, i in enumerate(pick)]
    depth = sparse["depth"][pick].copy()
    depth[np.arange(len(pick)) % 3 != 0] *= 3.0  # the frames in between are wrong: they must not be paired
    T = np.concatenate([sparse["T_world_cam"], np.tile([[[0, 0, 0, 1.0]]], (n, 1, 1))], axis=1)[pick]
    dense = tmp_path / "dense"
    write_predictions(dense, names=names, T_world_cam=T, K=sparse["K"][pick], depth=depth)
    (dense / "run.json").write_text((run / "run.json").read_text())

    with caplog.at_level(logging.ERROR, logger="mapstream.eval.runner"):
        assert main(["eval", str(dense), "--gt", str(scene), "--out", str(tmp_path / "auto.json")]) == 2
    assert "--match timestamp" in caplog.text
    out = tmp_path / "ts.json"
    assert main(["eval", str(dense), "--gt", str(scene), "--match", "timestamp", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["scenes"]["scene"]
    assert result["match"] == "timestamp" and result["num_frames"] == n
    assert result["metrics"]["depth"]["abs_rel"] < 1e-6 and result["metrics"]["trajectory"]["ate"] < 1e-6
