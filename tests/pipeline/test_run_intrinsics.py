"""`mapstream run --intrinsics`: the known camera replaces the network's on every frame and in
every output, carried through the run's preprocessing; run.json says how far the network was."""
from __future__ import annotations

import json

import numpy as np
from PIL import Image

from run_helpers import photos, run_cli


def _expected_frame_K(fx, fy, cx, cy, width, height, size=140, patch=14):
    """The known K on a frame that `crop` preprocessing makes `size` wide, worked out by hand:
    the image is scaled to `size` x round(height * size / width / patch) * patch, then its rows
    centre-cropped to `size`; pixel centres sit at +0.5 in the scaled coordinates."""
    new_h = round(height * size / width / patch) * patch
    top = max(0, (new_h - size) // 2)
    sx, sy = size / width, new_h / height
    return np.array([[fx * sx, 0, (cx + 0.5) * sx - 0.5], [0, fy * sy, (cy + 0.5) * sy - 0.5 - top], [0, 0, 1]])


def test_known_intrinsics_replace_the_networks_in_every_output(tmp_path):
    frames = photos(tmp_path, n=4)
    width, height = Image.open(next(frames.iterdir())).size
    out = tmp_path / "out"
    assert run_cli(str(frames), "--out", str(out), "--intrinsics", "400,390,260.5,150",
                   "--formats", "npz", "colmap") == 0
    expected = _expected_frame_K(400, 390, 260.5, 150, width, height)
    with np.load(out / "predictions.npz") as data:
        np.testing.assert_allclose(data["K"], np.broadcast_to(expected, (4, 3, 3)), rtol=1e-5)
    record = json.loads((out / "run.json").read_text())["intrinsics"]
    assert record["source"] == "fx,fy,cx,cy 400,390,260.5,150"
    np.testing.assert_allclose(record["frame_fx_fy_cx_cy"], expected[[0, 1, 0, 1], [0, 1, 2, 2]], atol=1e-4)
    network_fx = record["network_median_fx_fy_cx_cy"][0]  # the untrained network's: any positive value
    assert network_fx > 0
    assert abs(record["network_focal_error"] - (network_fx / expected[0, 0] - 1)) < 1e-3
    camera = (out / "sparse" / "0" / "cameras.txt").read_text().split("\n")
    params = [float(v) for v in next(line for line in camera if line and not line.startswith("#")).split()[4:]]
    np.testing.assert_allclose(params, [expected[0, 0], expected[1, 1], expected[0, 2] + 0.5, expected[1, 2] + 0.5],
                               rtol=1e-5)

    # Other intrinsics in the same folder: the earlier frames are not resumed under them.
    assert run_cli(str(frames), "--out", str(out), "--intrinsics", "300,300,259,147", "--formats", "npz") == 0
    with np.load(out / "predictions.npz") as data:
        np.testing.assert_allclose(data["K"][:, 0, 0], 300 * 140 / width, rtol=1e-5)


