"""Known intrinsics: read from each form users have them in, and carried onto the model's
frames exactly as the preprocessing moves the image's pixels."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from mapstream.io.intrinsics import frame_intrinsics, read_intrinsics
from mapstream.io.sources import FrameSource


def _source(image: Image.Image, **kwargs) -> FrameSource:
    def frames():
        yield "frame", image
    return FrameSource(frames, length=1, description="test", **kwargs)


def _red_centroid(frame) -> np.ndarray:
    """The red block's centre in the frame's continuous pixel coordinates (black picture,
    white padding: only the block is red)."""
    weight = (frame[0] - frame[1]).numpy()
    weight = np.where(weight > 0.2, weight, 0.0)
    assert weight.sum() > 0, "the block left the frame"
    ys, xs = np.nonzero(weight)
    w = weight[ys, xs]
    return np.array([(xs * w).sum() / w.sum() + 0.5, (ys * w).sum() / w.sum() + 0.5])


@pytest.mark.parametrize("rotate", [0, 90, 180, 270])
@pytest.mark.parametrize("mode", ["crop", "pad"])
def test_the_pixel_map_follows_a_point_through_turn_resize_crop_and_pad(rotate, mode):
    width, height, x0, y0 = 300, 200, 130, 90  # the block stays inside every frame
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[y0 : y0 + 6, x0 : x0 + 6, 0] = 255
    source = _source(Image.fromarray(pixels), mode=mode, image_size=112, rotate=rotate)
    _, frame = next(iter(source))
    assert source.last_picture_size == (width, height)
    expected = (source.last_pixel_map @ np.array([x0 + 3.0, y0 + 3.0, 1.0]))[:2]
    np.testing.assert_allclose(_red_centroid(frame), expected, atol=0.25)


@pytest.mark.parametrize("rotate", [0, 90, 180, 270])
def test_a_known_camera_projects_onto_the_frame_where_the_pixels_went(rotate):
    """A 3D point's projection by the frame's K, in the turned camera, is the image projection
    carried by the pixel map: so unprojecting the frame's depth with that K is exact."""
    K = np.array([[410.0, 0, 151.3], [0, 395.0, 97.8], [0, 0, 1]])
    source = _source(Image.new("RGB", (300, 200)), mode="crop", image_size=112, rotate=rotate)
    next(iter(source))
    K_frame = frame_intrinsics(K, source.last_pixel_map)
    assert K_frame[0, 1] == K_frame[1, 0] == 0 and K_frame[2].tolist() == [0, 0, 1]
    turn = {0: np.eye(3), 90: np.array([[0, -1, 0], [1, 0, 0], [0, 0, 1.0]]),
            180: np.diag([-1.0, -1.0, 1.0]), 270: np.array([[0, 1, 0], [-1, 0, 0], [0, 0, 1.0]])}[rotate]
    rng = np.random.default_rng(rotate)
    for X in rng.uniform([-1, -1, 2], [1, 1, 5], size=(5, 3)):
        u = K @ X
        u = u[:2] / u[2] + 0.5  # continuous image coordinates
        carried = (source.last_pixel_map @ np.append(u, 1.0))[:2] - 0.5
        v = K_frame @ (turn @ X)
        np.testing.assert_allclose(v[:2] / v[2], carried, atol=1e-9)


def test_intrinsics_given_as_numbers_are_opencv_pixels():
    known = read_intrinsics("500, 510, 320.5, 240")
    np.testing.assert_array_equal(known.K, [[500, 0, 320.5], [0, 510, 240], [0, 0, 1]])
    assert known.image_size is None
    np.testing.assert_array_equal(known.for_size(1280, 960), known.K)  # no size given: the images' own


def test_a_colmap_camera_is_read_in_our_pixel_convention_and_scaled_to_the_images(tmp_path):
    model = tmp_path / "sparse" / "0"
    model.mkdir(parents=True)
    (model / "cameras.txt").write_text("# comment\n1 PINHOLE 640 480 500 510 320 240\n")
    known = read_intrinsics(str(tmp_path))  # the model folder is found
    np.testing.assert_array_equal(known.K, [[500, 0, 319.5], [0, 510, 239.5], [0, 0, 1]])
    assert known.image_size == (640, 480)
    # The same camera's images at half resolution: focal lengths halve, pixel centres move with them.
    np.testing.assert_allclose(known.for_size(320, 240), [[250, 0, 159.5], [0, 255, 119.5], [0, 0, 1]])
    with pytest.raises(ValueError, match="another aspect ratio"):
        known.for_size(640, 360)
    (model / "cameras.txt").write_text("1 SIMPLE_RADIAL 640 480 500 320 240 0.1\n")
    with pytest.raises(ValueError, match="distorted camera; undistort the images first"):
        read_intrinsics(str(model / "cameras.txt"))
    (model / "cameras.txt").write_text("1 PINHOLE 640 480 500 510 320 240\n2 PINHOLE 640 480 600 600 320 240\n")
    with pytest.raises(ValueError, match="2 different cameras"):
        read_intrinsics(str(model / "cameras.txt"))


def test_a_transforms_json_camera_is_read_from_the_top_or_its_frames(tmp_path):
    path = tmp_path / "transforms.json"
    path.write_text(json.dumps({"w": 200, "h": 100, "fl_x": 150.0, "fl_y": 140.0, "cx": 100.0, "cy": 50.0,
                                "frames": [{"file_path": "a.png"}, {"file_path": "b.png"}]}))
    known = read_intrinsics(str(path))
    np.testing.assert_array_equal(known.K, [[150, 0, 99.5], [0, 140, 49.5], [0, 0, 1]])
    assert known.image_size == (200, 100)
    path.write_text(json.dumps({"frames": [{"w": 200, "h": 100, "fl_x": 150.0}, {"w": 200, "h": 100, "fl_x": 90.0}]}))
    with pytest.raises(ValueError, match="2 different cameras"):
        read_intrinsics(str(path))


@pytest.mark.parametrize("spec, message", [
    ("500,510,320", "no such file, and not fx,fy,cx,cy"),
    ("a,b,c,d", "expected fx,fy,cx,cy in pixels"),
    ("-5,5,1,1", "focal lengths must be positive"),
])
def test_unreadable_intrinsics_say_what_is_expected(spec, message):
    with pytest.raises(ValueError, match=message):
        read_intrinsics(spec)


def test_the_pixel_map_follows_the_padding_to_the_inputs_common_height():
    """A folder's shorter pictures are padded (white, centred) to its tallest frame's height."""
    pixels = np.zeros((200, 300, 3), np.uint8)
    pixels[90:96, 130:136, 0] = 255
    source = _source(Image.fromarray(pixels), mode="crop", image_size=112, pad_height=84)
    _, frame = next(iter(source))
    assert frame.shape[1] == 84  # 70 rows of picture, 7 of padding above
    expected = (source.last_pixel_map @ np.array([133.0, 93.0, 1.0]))[:2]
    assert source.last_pixel_map[1, 2] == 7
    np.testing.assert_allclose(_red_centroid(frame), expected, atol=0.25)
