"""Small synthetic scenes and helpers shared by the renderer's tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mapstream.export import Reconstruction
from mapstream.render import look_at, pinhole

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def forward_camera() -> tuple[torch.Tensor, torch.Tensor]:
    """A 5 x 7 camera at the origin looking down +z (OpenCV), f = 2.5, centre (3, 2)."""
    return pinhole(5, 7, 90.0), look_at([0, 0, 0], [0, 0, 1], [0, -1, 0])


def straight_run(n: int = 9) -> np.ndarray:
    """Cameras at x = 0.5 i looking down +z, OpenCV axes (up = -y)."""
    poses = np.zeros((n, 3, 4))
    poses[:, :, :3] = np.eye(3)
    poses[:, 0, 3] = 0.5 * np.arange(n)
    return poses


def plane_run(n: int = 5, h: int = 24, w: int = 32) -> Reconstruction:
    """Cameras at x = 0.1 i facing a red/green striped plane at depth 2."""
    poses = straight_run(n).astype(np.float32) * [1, 1, 1, 0.2]
    image = np.zeros((h, w, 3), np.uint8)
    image[:, : w // 2] = RED
    image[:, w // 2 :] = GREEN
    K = np.array([[30.0, 0, w / 2], [0, 30.0, h / 2], [0, 0, 1]], np.float32)
    return Reconstruction(
        images=np.repeat(image[None], n, 0), depth=np.full((n, h, w), 2.0, np.float32),
        depth_conf=np.full((n, h, w), 3.0, np.float32), T_world_cam=poses, K=np.repeat(K[None], n, 0),
        pose_enc=np.zeros((n, 9), np.float32), names=[f"f{i}.png" for i in range(n)],
    )


def decode(path: Path) -> list[np.ndarray]:
    """The frames of the video at ``path``, RGB (needs PyAV)."""
    import av

    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
