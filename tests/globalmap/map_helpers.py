"""Predictions as a stream hands them to the map, without running a network for them."""
import numpy as np
import torch

from mapstream.geometry import invert_se3
from mapstream.session import FramePrediction


def prediction(index: int, T_world_cam: np.ndarray, *, hw=(28, 28), depth: float = 2.0,
               scale_frame: bool = False) -> FramePrediction:
    T = torch.as_tensor(np.asarray(T_world_cam)[:3], dtype=torch.float32)
    K = torch.tensor([[20.0, 0, hw[1] / 2], [0, 20.0, hw[0] / 2], [0, 0, 1]])
    return FramePrediction(
        index=index, pose_enc=torch.zeros(9), T_world_cam=T, T_cam_world=invert_se3(T), K=K,
        depth=torch.full(hw, depth), depth_conf=torch.full(hw, 3.0), keyframe=True, scale_frame=scale_frame,
    )


def walk(n: int, step: float = 0.05) -> np.ndarray:
    """Camera-to-world poses [n, 4, 4] moving along x, looking along z."""
    T = np.tile(np.eye(4), (n, 1, 1))
    T[:, 0, 3] = step * np.arange(n)
    return T
