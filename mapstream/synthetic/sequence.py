"""Posed synthetic RGB-D sequences: a camera gliding through a :func:`make_scene` room.

    seq = render_sequence(num_frames=16, image_hw=(112, 196), seed=0)   # ~0.2 s on a CPU
    write_sequence(seq, "scene/gt")         # traj.txt, intrinsics.txt, rgb/*.png, depth/*
    seq2 = load_sequence("scene/gt")        # the same arrays back (depth float32, poses to ~1e-12)

Poses are ``T_world_cam`` (camera-to-world, OpenCV axes: x right, y down, z forward) in metres,
in a world frame where the (z-up, axis-aligned) room is placed by a random rigid transform;
``K`` has its principal point at ``(W/2, H/2)`` like the model's; depth is the exact
camera-space z of the first surface along each pixel-centre ray.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mapstream.eval.datasets import canonical_timestamp, read_benchmark_scene, write_benchmark_scene
from mapstream.geometry import look_at as geometry_look_at
from mapstream.geometry import quat_to_mat
from mapstream.synthetic.scene import make_scene, make_twin_scene

__all__ = [
    "FIRST_TRAINING_SEED",
    "SyntheticSequence",
    "camera_path",
    "load_sequence",
    "look_at",
    "pinhole_intrinsics",
    "render_sequence",
    "world_from_room",
    "write_sequence",
]

log = logging.getLogger(__name__)

# Seeds from here on are training's (mapstream.train draws render_sequence's family with
# them); a sequence rendered with a smaller seed is never seen in training, so scores on it
# measure unseen scenes.
FIRST_TRAINING_SEED = 1 << 40


@dataclass
class SyntheticSequence:
    """A rendered sequence.

    Attributes:
        rgb: ``[N, H, W, 3]`` uint8.
        depth: ``[N, H, W]`` float32 camera-space z in metres (exact up to float32 rounding).
        T_world_cam: ``[N, 4, 4]`` float64 camera-to-world.
        K: ``[N, 3, 3]`` float64 intrinsics (pixels).
        timestamps: ``[N]`` float64 seconds.
        seed: the generator seed (``-1`` when loaded from disk).
    """

    rgb: np.ndarray
    depth: np.ndarray
    T_world_cam: np.ndarray
    K: np.ndarray
    timestamps: np.ndarray
    seed: int = -1

    def __len__(self) -> int:
        return len(self.T_world_cam)

    @property
    def image_hw(self) -> tuple[int, int]:
        return int(self.depth.shape[1]), int(self.depth.shape[2])

    @property
    def names(self) -> list[str]:
        """Frame names: canonical timestamps (the benchmark's file stems)."""
        return [canonical_timestamp(t) for t in self.timestamps]


def look_at(position: np.ndarray, target: np.ndarray, up: np.ndarray = np.array([0.0, 0.0, 1.0])) -> np.ndarray:
    """Camera-to-world ``[4, 4]`` of a camera at ``position`` looking at ``target`` (OpenCV
    axes; :func:`mapstream.geometry.look_at` as a homogeneous NumPy matrix, with the rooms'
    z-up by default). ``forward`` must not be parallel to ``up``."""
    T = np.eye(4)
    T[:3] = geometry_look_at(position, target, up).numpy()
    return T


def pinhole_intrinsics(image_hw: tuple[int, int], fov_x_deg: float) -> np.ndarray:
    """``K`` ``[3, 3]`` of a ``(H, W)`` image with horizontal field of view ``fov_x_deg``:
    square pixels (``fy = fx``) and the principal point at ``(W/2, H/2)``, as the scenes'
    renderings use."""
    H, W = image_hw
    fx = (W / 2) / np.tan(np.radians(fov_x_deg) / 2)
    return np.array([[fx, 0.0, W / 2], [0.0, fx, H / 2], [0.0, 0.0, 1.0]])


def world_from_room(seed: int) -> np.ndarray:
    """``T_world_room`` ``[4, 4]``: a random rigid placement of the room in the world (from ``seed``).

    Scenes are modelled in an axis-aligned room frame (walls at round coordinates); the poses
    are reported in a generic world frame so that nothing downstream (e.g. a voxel grid) can
    depend on that special alignment.
    """
    rng = np.random.default_rng(seed + 2_000_003)
    T = np.eye(4)
    T[:3, :3] = quat_to_mat(torch.from_numpy(rng.normal(size=4))).numpy()  # uniform random rotation
    T[:3, 3] = rng.uniform(-2.0, 2.0, 3)
    return T


def camera_path(num_frames: int, seed: int = 0, *, arc: float = 1.0) -> np.ndarray:
    """A smooth, non-collinear camera trajectory ``[N, 4, 4]`` (``T_room_cam``, camera-to-room).

    The camera moves along an arc of ``arc`` radians of the ellipse with radii (2.0, 1.8) m at
    about 1.4 m height (bobbing by 0.1 m), looking at a point that wanders near the room's
    centre. The start angle and the wander follow ``seed``.
    """
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    rng = np.random.default_rng(seed + 1_000_003)
    start = rng.uniform(0, 2 * np.pi)
    phase = rng.uniform(0, 2 * np.pi, 3)
    s = np.linspace(0.0, 1.0, num_frames)
    angle = start + arc * s
    poses = []
    for k in range(num_frames):
        height = 1.4 + 0.1 * np.sin(2 * np.pi * s[k] + phase[0])
        pos = np.array([2.0 * np.cos(angle[k]), 1.8 * np.sin(angle[k]), height])
        target = np.array([
            0.3 * np.sin(np.pi * s[k] + phase[1]),
            0.3 * np.cos(np.pi * s[k] + phase[2]),
            0.9 + 0.2 * s[k],
        ])
        poses.append(look_at(pos, target))
    return np.stack(poses)


def render_sequence(
    num_frames: int = 16,
    image_hw: tuple[int, int] = (112, 196),
    seed: int = 0,
    *,
    fov_x_deg: float = 70.0,
    fps: float = 10.0,
    arc: float = 1.0,
    twin: bool = False,
) -> SyntheticSequence:
    """Render a posed RGB-D sequence (deterministic given the arguments).

    Args:
        num_frames: frames ``N``.
        image_hw: ``(H, W)``; multiples of 14 suit the model's patch size.
        seed: scene layout, textures and path start.
        fov_x_deg: horizontal field of view (square pixels: ``fy = fx``).
        fps: timestamps are ``i / fps`` seconds.
        arc: angle (radians) travelled along the path over the sequence.
        twin: render :func:`make_twin_scene` (a room that looks the same after a half turn)
            instead of :func:`make_scene`: every view has a look-alike half a lap away.
    """
    H, W = image_hw
    K = pinhole_intrinsics(image_hw, fov_x_deg)
    scene = make_twin_scene(seed) if twin else make_scene(seed)
    T_room_cam = camera_path(num_frames, seed, arc=arc)
    rgb = np.zeros((num_frames, H, W, 3), np.uint8)
    depth = np.zeros((num_frames, H, W), np.float32)
    for i in range(num_frames):
        rgb[i], d = scene.render(K, T_room_cam[i], image_hw)
        depth[i] = d
    log.debug("rendered %d synthetic frames of %dx%d (seed %d)", num_frames, W, H, seed)
    T_world_cam = world_from_room(seed) @ T_room_cam
    K_all = np.repeat(K[None], num_frames, 0)
    return SyntheticSequence(rgb, depth, T_world_cam, K_all, np.arange(num_frames) / fps, seed)


def write_sequence(seq: SyntheticSequence, out_dir: str | Path, *, depth_format: str = "auto") -> Path:
    """Write ``seq`` in the benchmark layout (see :mod:`mapstream.eval.datasets`).

    ``depth_format``: ``"exr"``, ``"npy"``, ``"png"`` (mm, lossy) or ``"auto"`` (EXR when an EXR
    backend, OpenEXR or PyAV, is installed, else ``.npy``).
    """
    return write_benchmark_scene(
        out_dir, seq.timestamps, seq.T_world_cam, seq.K, seq.image_hw,
        rgb=seq.rgb, depth=seq.depth, depth_format=depth_format,
    )


def load_sequence(path: str | Path) -> SyntheticSequence:
    """Read a sequence written by :func:`write_sequence` (or any benchmark scene with RGB and depth)."""
    gt = read_benchmark_scene(path)
    rgb = np.stack([gt.load_rgb(i) for i in range(len(gt))])
    depth = np.stack([gt.load_depth(i) for i in range(len(gt))])
    return SyntheticSequence(rgb, depth, gt.T_world_cam, gt.K, gt.timestamps)
