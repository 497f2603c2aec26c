"""Eye-dome lighting: the depth buffer of `splat` and the shading computed from it."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mapstream.render import (
    RenderOptions, eye_dome_lighting, eye_dome_obscurance, eye_dome_shade, look_at, pinhole, render_flythrough, splat,
)

from render_synthetic import forward_camera, plane_run

GREY = (7, 7, 7)


def surface(columns: range, depth: float, rows: range = range(5)) -> torch.Tensor:
    """Points that land exactly on pixels (row, column) of `forward_camera` at camera depth
    ``depth`` (f = 2.5, centre (3, 2))."""
    return torch.tensor([[(c - 3) / 2.5 * depth, (r - 2) / 2.5 * depth, depth] for r in rows for c in columns],
                        dtype=torch.float64)


def white(points: torch.Tensor) -> torch.Tensor:
    return torch.full((len(points), 3), 255, dtype=torch.uint8)


def test_splat_returns_its_depth_buffer_and_the_same_image() -> None:
    K, T = forward_camera()
    points = torch.cat((surface(range(0, 3), 1.0), surface(range(3, 6), 2.0)))
    image, depth = splat(points, white(points), K, T, (5, 7), background=GREY, return_depth=True)
    assert torch.equal(image, splat(points, white(points), K, T, (5, 7), background=GREY))
    expected = np.full((5, 7), np.inf)
    expected[:, 0:3], expected[:, 3:6] = 1.0, 2.0
    np.testing.assert_array_equal(depth.numpy(), expected)  # inf: no point
    _, empty = splat(torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.uint8), K, T, (5, 7), return_depth=True)
    assert empty.shape == (5, 7) and torch.isinf(empty).all()


def test_a_plane_facing_the_camera_is_not_darkened() -> None:
    K, T = forward_camera()
    plane = surface(range(1, 6), 2.0, rows=range(1, 4))  # background all around it
    image, depth = splat(plane, white(plane), K, T, (5, 7), background=GREY, return_depth=True)
    for radius in (1, 2, 3):
        shade = eye_dome_shade(depth, strength=5.0, radius=radius)
        assert torch.equal(shade, torch.ones(5, 7, dtype=torch.float64))  # exactly 1
        assert torch.equal(eye_dome_lighting(image, depth, strength=5.0, radius=radius), image)


def test_the_far_side_of_a_depth_edge_is_darkened_by_the_hand_computed_amount() -> None:
    """Depth 1 in columns 0-1, e in columns 2-4 (log depths 0 and 1), no point in column 5."""
    depth = torch.full((4, 6), math.inf, dtype=torch.float64)
    depth[:, 0:2], depth[:, 2:5] = 1.0, math.e
    obscurance = eye_dome_obscurance(depth, radius=1)
    expected = np.zeros((4, 6))
    expected[1:3, 2] = 3.0  # up-left, left, down-left are nearer by 1 in log depth
    expected[[0, 3], 2] = 2.0  # one of those three is off the image: no point, adds nothing
    np.testing.assert_array_equal(obscurance.numpy(), expected)
    # radius 2: columns 2 and 3 see columns 0 and 1 (near) on rows r - 2, r, r + 2, two of
    # which are inside the 4-row image for every r; column 4 sees column 2 (as far) and beyond the image.
    expected2 = np.zeros((4, 6))
    expected2[:, 2:4] = 2.0
    np.testing.assert_array_equal(eye_dome_obscurance(depth, radius=2).numpy(), expected2)
    shade = eye_dome_shade(depth, strength=0.5, radius=1)
    assert shade[1, 2].item() == pytest.approx(math.exp(-1.5), rel=1e-15)
    assert shade[0, 2].item() == pytest.approx(math.exp(-1.0), rel=1e-15)
    assert (shade[:, [0, 1, 3, 4, 5]] == 1).all()  # nearer side, interior of the far side, no point
    image = torch.full((4, 6, 3), 200, dtype=torch.uint8)
    lit = eye_dome_lighting(image, depth, strength=0.5, radius=1)
    assert (lit[1:3, 2] == round(200 * math.exp(-1.5))).all() and (lit[[0, 3], 2] == round(200 * math.exp(-1.0))).all()
    lit[:, 2] = 200
    assert torch.equal(lit, image)  # everything else as it was


def test_edl_on_a_splat_darkens_the_far_pixels_at_the_edge_only() -> None:
    """A near surface (depth 1, columns 0-2) in front of a far one (depth 2, columns 3-5),
    background in column 6: with radius 1 and strength 1, far pixels in column 3 have 3 (2 on
    the top and bottom rows) nearer neighbours at log 2 each, so shade 2^-3 (2^-2)."""
    K, T = forward_camera()
    points = torch.cat((surface(range(0, 3), 1.0), surface(range(3, 6), 2.0)))
    image, depth = splat(points, white(points), K, T, (5, 7), background=GREY, return_depth=True)
    shade = eye_dome_shade(depth, strength=1.0, radius=1)
    np.testing.assert_allclose(shade[1:4, 3].numpy(), math.exp(-3 * math.log(2)), rtol=1e-15)
    lit = eye_dome_lighting(image, depth, strength=1.0, radius=1).numpy()
    expected = image.numpy().copy()
    expected[1:4, 3] = 32  # round(255 / 8 = 31.875)
    expected[[0, 4], 3] = 64  # round(255 / 4 = 63.75)
    np.testing.assert_array_equal(lit, expected)  # the near side, the far interior, the background: unchanged
    assert (lit[:, 6] == GREY).all()


def test_strength_zero_is_bit_identical_to_no_edl(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    pytest.importorskip("av")
    from mapstream.render.video import VideoWriter

    K, T = forward_camera()
    points = torch.cat((surface(range(0, 3), 1.0), surface(range(3, 6), 2.0)))
    image, depth = splat(points, white(points), K, T, (5, 7), return_depth=True)
    assert torch.equal(eye_dome_lighting(image, depth, strength=0.0, radius=2), image)

    written: list[np.ndarray] = []
    original = VideoWriter.write
    monkeypatch.setattr(VideoWriter, "write", lambda self, frame: (written.append(frame.copy()), original(self, frame)))

    def frames(**edl) -> list[np.ndarray]:
        written.clear()
        options = RenderOptions(mode="static", height=60, inset=False, **edl)
        render_flythrough(plane_run(), tmp_path / "fly.mp4", options, device="cpu", progress=False)
        return list(written)

    plain, zero, shaded = frames(), frames(edl_strength=0.0, edl_radius=3), frames(edl_strength=3.0, edl_radius=1)
    assert all(np.array_equal(a, b) for a, b in zip(plain, zero, strict=True))
    assert all((s <= p).all() for s, p in zip(shaded, plain, strict=True))  # EDL only darkens
    assert any((s < p).any() for s, p in zip(shaded, plain, strict=True))  # the frustum lines before the plane


def test_edl_refuses_settings_it_cannot_use() -> None:
    depth = torch.ones(3, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="radius must be >= 1"):
        eye_dome_shade(depth, strength=1.0, radius=0)
    for strength in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="strength must be a finite number >= 0"):
            eye_dome_shade(depth, strength=strength, radius=1)
    with pytest.raises(ValueError, match=r"depth must be \[H, W\]"):
        eye_dome_obscurance(depth[None], radius=1)
    with pytest.raises(ValueError, match="image"):
        eye_dome_lighting(torch.zeros(3, 4, 3, dtype=torch.uint8), depth, strength=1.0, radius=1)
    with pytest.raises(ValueError, match="edl_strength"):
        RenderOptions(edl_strength=-0.5)
    with pytest.raises(ValueError, match="edl_radius"):
        RenderOptions(edl_radius=0)


@pytest.mark.cuda
def test_edl_on_cuda_matches_the_cpu() -> None:
    generator = torch.Generator().manual_seed(0)
    points = torch.rand(2000, 3, generator=generator, dtype=torch.float64) * torch.tensor([4.0, 3.0, 3.0]) + \
        torch.tensor([-2.0, -1.5, 0.5])
    colors = torch.randint(0, 256, (2000, 3), generator=generator, dtype=torch.uint8)
    K, T = pinhole(48, 64, 70.0), look_at([0, 0, 0], [0, 0, 1], [0, -1, 0])
    cpu = splat(points, colors, K, T, (48, 64), radius=1, return_depth=True)
    gpu = splat(points.cuda(), colors.cuda(), K, T, (48, 64), radius=1, return_depth=True)
    assert torch.equal(cpu[1], gpu[1].cpu())
    lit_cpu = eye_dome_lighting(*cpu, strength=2.0, radius=2)
    lit_gpu = eye_dome_lighting(*gpu, strength=2.0, radius=2)
    assert lit_gpu.is_cuda
    assert (lit_cpu.int() - lit_gpu.cpu().int()).abs().max() <= 1  # exp/log may differ in the last bit
