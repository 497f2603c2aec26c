"""Procedural training clips: seeded scenes and camera paths, and a batched torch renderer.

The scenes are :class:`mapstream.synthetic.Scene` objects (rooms seen from inside, boxes,
spheres, value-noise textures, directional + ambient light), so the exact CPU caster of
:mod:`mapstream.synthetic` renders them too and serves as the oracle of :func:`render_clips`.
:func:`sample_clip` draws the variety from one seed: room size, object count/sizes/kinds,
texture palettes and scales, lighting, the camera path (forward walk, orbit, closed loop, pan),
its speed, shake and roll, and the field of view (45-90 degrees horizontal). A share of the
clips may instead come from :func:`mapstream.synthetic.render_sequence`'s own family (its
rooms and inward orbit, with seeds of :data:`mapstream.synthetic.FIRST_TRAINING_SEED` on).

Conventions are mapstream.synthetic's: ``T_room_cam`` is camera-to-room (OpenCV axes: x right,
y down, z forward), the room is z-up with its floor at z = 0, ``K`` has its principal point at
``(W/2, H/2)``, pixel ``(u, v)`` is the integer index, depth is camera-space z, 0 = no hit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from mapstream.synthetic.scene import Box, Scene, Sphere, Texture, make_scene
from mapstream.synthetic.sequence import FIRST_TRAINING_SEED, camera_path, pinhole_intrinsics, world_from_room

__all__ = [
    "PATH_KINDS", "SYNTHETIC_PATH", "ClipSpec", "check_path_kinds", "check_share", "sample_clip", "synthetic_clip",
    "render_clips",
]

PATH_KINDS: tuple[str, ...] = ("forward", "orbit", "loop", "pan")
_PATH_WEIGHTS = (0.3, 0.3, 0.2, 0.2)
_STREAM = 0x7472_6169  # the generators' own stream: seed k never replays mapstream.synthetic's seed k
_FAMILY_STREAM = 0x6661_6D69  # whether a clip is mapstream.synthetic's, and its arc, FoV and room
SYNTHETIC_PATH = "synthetic"  # ClipSpec.path of a clip of render_sequence's family
_ARC = (0.4, 2.0)  # radians a clip of render_sequence's family travels, up to _ARC_FRAMES frames long
_ARC_FRAMES = 24
_EPS = 1e-9  # the CPU caster's minimum hit distance
_NONE, _BOX, _ROOM, _SPHERE = 0, 1, 2, 3
_CLEARANCE = 0.3  # metres between every camera centre and every object
_MARGIN = 0.5  # metres between the cameras and the walls / ceiling / floor


@dataclass(frozen=True)
class ClipSpec:
    """One procedural clip, before rendering.

    Attributes:
        seed: what it was drawn from.
        scene: the room and its objects (room frame, z up, metres).
        T_room_cam: ``[S, 4, 4]`` float64 camera-to-room poses.
        K: ``[3, 3]`` float64 intrinsics (square pixels, principal point ``(W/2, H/2)``).
        T_world_room: ``[4, 4]`` the room's random rigid placement in the reported world frame.
        path: one of :data:`PATH_KINDS`.
        fov_x_deg: horizontal field of view.
    """

    seed: int
    scene: Scene
    T_room_cam: np.ndarray
    K: np.ndarray
    T_world_room: np.ndarray
    path: str
    fov_x_deg: float

    @property
    def T_world_cam(self) -> np.ndarray:
        """``[S, 4, 4]`` camera-to-world, the poses a clip reports."""
        return self.T_world_room @ self.T_room_cam


# ----------------------------------------------------------------------------- sampling
def _rotvec(w: np.ndarray) -> np.ndarray:
    """Rotation matrices ``[N, 3, 3]`` of rotation vectors ``[N, 3]`` (Rodrigues)."""
    theta = np.linalg.norm(w, axis=-1, keepdims=True)
    k = w / np.maximum(theta, 1e-12)
    Kx = np.zeros(w.shape[:-1] + (3, 3))
    Kx[..., 0, 1], Kx[..., 0, 2], Kx[..., 1, 2] = -k[..., 2], k[..., 1], -k[..., 0]
    Kx = Kx - np.swapaxes(Kx, -1, -2)
    s, c = np.sin(theta)[..., None], np.cos(theta)[..., None]
    return np.eye(3) + s * Kx + (1 - c) * Kx @ Kx


def _look(pos: np.ndarray, forward: np.ndarray) -> np.ndarray:
    """Camera-to-room ``[N, 4, 4]`` at ``pos`` looking along ``forward`` with the room's z up
    in the image (:func:`mapstream.geometry.look_at`'s construction, batched)."""
    z = forward / np.linalg.norm(forward, axis=-1, keepdims=True)
    x = np.cross(z, np.array([0.0, 0.0, 1.0]))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    y = np.cross(z, x)
    T = np.tile(np.eye(4), (len(pos), 1, 1))
    T[:, :3, :3] = np.stack((x, y, z), axis=-1)
    T[:, :3, 3] = pos
    return T


def _camera_path(rng: np.random.Generator, kind: str, n: int, half: np.ndarray) -> np.ndarray:
    """``T_room_cam`` ``[n, 4, 4]`` of one path kind inside the room of half sizes ``half``."""
    lo = np.array([-half[0] + _MARGIN, -half[1] + _MARGIN, _MARGIN])
    hi = np.array([half[0] - _MARGIN, half[1] - _MARGIN, 2 * half[2] - _MARGIN])
    k = np.arange(n, dtype=np.float64)
    height = rng.uniform(lo[2], hi[2]) + rng.uniform(0.0, 0.05) * np.sin(rng.uniform(0.3, 1.2) * k)
    pitch = rng.uniform(-0.4, 0.15) + rng.uniform(0.0, 0.08) * np.sin(rng.uniform(0.05, 0.3) * k)
    if kind in ("orbit", "loop"):
        centre = rng.uniform(-0.3, 0.3, 2) * hi[:2]
        radii = (hi[:2] - np.abs(centre)) * rng.uniform(0.45, 1.0, 2)
        direction = rng.choice([-1.0, 1.0])
        step = rng.uniform(0.01, 0.07) if kind == "orbit" else 2 * np.pi / max(n - 1, 1) * rng.uniform(1.0, 1.1)
        angle = rng.uniform(0, 2 * np.pi) + direction * step * k
        pos = np.stack((centre[0] + radii[0] * np.cos(angle), centre[1] + radii[1] * np.sin(angle), height), -1)
        if kind == "orbit":  # look at a point that wanders near the orbit's centre
            target = np.stack((centre[0] + 0.3 * np.sin(0.05 * k + rng.uniform(0, 6)),
                               centre[1] + 0.3 * np.cos(0.05 * k + rng.uniform(0, 6)),
                               np.full(n, rng.uniform(0.3, 1.5))), -1)
            forward = target - pos
        else:  # walk the loop looking ahead, turned outward by a fixed angle
            tangent = direction * np.stack((-radii[0] * np.sin(angle), radii[1] * np.cos(angle)), -1)
            tangent /= np.linalg.norm(tangent, axis=-1, keepdims=True)
            outward = np.stack((np.cos(angle), np.sin(angle)), -1)
            alpha = rng.uniform(0.0, np.pi / 2)
            flat = np.cos(alpha) * tangent + np.sin(alpha) * outward
            forward = np.concatenate((flat * np.cos(pitch)[:, None], np.sin(pitch)[:, None]), -1)
    else:
        start = rng.uniform(lo[:2], hi[:2]) * (0.6 if kind == "pan" else 1.0)
        if kind == "forward":  # walk from one side of the room toward the other, looking ahead
            goal = -np.sign(start) * rng.uniform(0.3, 1.0, 2) * hi[:2]
            yaw = np.arctan2(goal[1] - start[1], goal[0] - start[0]) + rng.uniform(-0.03, 0.03) * (k - k.mean())
            speed = min(rng.uniform(0.03, 0.15), 0.9 * float(np.linalg.norm(goal - start)) / max(n - 1, 1))
        else:  # pan: a nearly still camera turning on the spot
            yaw = rng.uniform(0, 2 * np.pi) + rng.choice([-1.0, 1.0]) * rng.uniform(0.02, 0.08) * k
            speed = rng.uniform(0.0, 0.01)
        heading = np.stack((np.cos(yaw), np.sin(yaw)), -1)
        xy = start + np.concatenate((np.zeros((1, 2)), np.cumsum(speed * heading[:-1], 0)))
        pos = np.concatenate((xy, height[:, None]), -1)
        look_yaw = yaw + rng.uniform(0.0, 0.15) * np.sin(rng.uniform(0.05, 0.3) * k)
        forward = np.stack((np.cos(look_yaw) * np.cos(pitch), np.sin(look_yaw) * np.cos(pitch), np.sin(pitch)), -1)
    pos = pos + rng.normal(size=(n, 3)) * rng.uniform(0.0, 0.01)  # positional jitter
    T = _look(np.clip(pos, lo, hi), forward)
    # Roll, smooth shake and per-frame jitter, about the camera's own axes.
    freq, phase = rng.uniform(0.2, 1.0, 3), rng.uniform(0, 2 * np.pi, 3)
    shake = np.radians(rng.uniform(0.0, 2.0)) * np.sin(freq * k[:, None] + phase)
    jitter = np.radians(rng.uniform(0.0, 0.5)) * rng.normal(size=(n, 3))
    roll = np.zeros((n, 3))
    roll[:, 2] = np.radians(rng.uniform(-8.0, 8.0)) if rng.random() < 0.5 else 0.0
    T[:, :3, :3] = T[:, :3, :3] @ _rotvec(roll) @ _rotvec(shake + jitter)
    return T


# (lightness low, high, saturation): vivid, muted, dark, bright, grey; drawn with _PALETTE_WEIGHTS.
_PALETTES = ((0.1, 0.9, 1.0), (0.25, 0.8, 0.5), (0.03, 0.35, 0.8), (0.55, 1.0, 0.6), (0.1, 0.9, 0.0))
_PALETTE_WEIGHTS = (0.3, 0.25, 0.15, 0.2, 0.1)


def _texture(rng: np.random.Generator, palette: tuple[float, float, float], scale: float) -> Texture:
    lo, hi, sat = palette

    def colour() -> np.ndarray:
        return np.clip(rng.uniform(lo, hi) + sat * (rng.uniform(0, 1, 3) - 0.5), 0, 1)

    a = colour()
    b = np.clip(a + rng.uniform(0.35, 1.0) * (colour() - a), 0, 1)  # low- to high-contrast pairs
    checker = 0.0 if rng.random() < 0.4 else scale * float(np.exp(rng.uniform(np.log(0.05), np.log(0.6))))
    noise = scale * float(np.exp(rng.uniform(np.log(0.02), np.log(0.4))))
    return Texture(tuple(map(float, a)), tuple(map(float, b)), checker=checker, noise=noise,
                   seed=int(rng.integers(1 << 20)))


def _box_distance(p: np.ndarray, centre: np.ndarray, half: np.ndarray, R: np.ndarray) -> np.ndarray:
    """Distance from points ``[N, 3]`` to a solid oriented box (0 inside)."""
    q = np.maximum(np.abs((p - centre) @ R) - half, 0.0)
    return np.linalg.norm(q, axis=-1)


# The range of a procedural room's object count unless a run asks for another.
SCENE_OBJECTS = (3, 12)

def _furnish(rng: np.random.Generator, half: np.ndarray, T_room_cam: np.ndarray,
             objects: tuple[int, int] = SCENE_OBJECTS) -> Scene:
    """The room, ``objects[0]``-``objects[1]`` objects (fewer where no place clear of every
    camera centre is found) and the light. Half the objects stand 0.8-3.5 m ahead of a camera
    so that the views hold geometry, not only walls."""
    cams, views = T_room_cam[:, :3, 3], T_room_cam[:, :3, 2]
    palette = _PALETTES[rng.choice(len(_PALETTES), p=_PALETTE_WEIGHTS)]
    room = Box(np.array([0.0, 0.0, half[2]]), half.copy(), _texture(rng, palette, 2.0), inside=True)
    prims: list[Box | Sphere] = [room]
    for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
        for _attempt in range(20):
            is_box = rng.random() < 0.6
            if is_box:
                hs = rng.uniform(0.08, 0.6, 3)
                if rng.random() < 0.1:
                    hs[2] = half[2]  # a pillar, floor to ceiling
                standing = rng.random() < 0.7
                z = hs[2] if standing else rng.uniform(hs[2], max(hs[2], 2 * half[2] - hs[2]))
                yaw = rng.uniform(0, np.pi)
                R = _rotvec(np.array([[0.0, 0.0, yaw]]))[0] if standing else _rotvec(rng.normal(size=(1, 3)))[0]
                reach = float(np.linalg.norm(hs[:2] if standing else hs))
            else:
                r = rng.uniform(0.08, 0.5)
                z = r if rng.random() < 0.4 else rng.uniform(r, 2 * half[2] - r)
                reach = r
            bound = np.maximum(half[:2] - reach, 0.05)
            if rng.random() < 0.5:
                c = int(rng.integers(len(cams)))
                flat = views[c, :2] / max(float(np.linalg.norm(views[c, :2])), 1e-9)
                xy = np.clip(cams[c, :2] + rng.uniform(0.8, 3.5) * flat, -bound, bound)
            else:
                xy = rng.uniform(-1, 1, 2) * bound
            centre = np.array([xy[0], xy[1], z])
            if is_box:
                prim: Box | Sphere = Box(centre, hs, _texture(rng, palette, 1.0), R=R)
                dist = _box_distance(cams, centre, hs, R)
            else:
                prim = Sphere(centre, float(r), _texture(rng, palette, 0.5))
                dist = np.linalg.norm(cams - centre, axis=-1) - r
            if dist.min() > _CLEARANCE:
                prims.append(prim)
                break
    lights = []
    for _ in range(1 if rng.random() < 0.6 else 2):
        d = np.array([*rng.normal(size=2), rng.uniform(0.2, 1.5)])
        lights.append(tuple(float(c) for c in d / np.linalg.norm(d)))
    return Scene(prims, lights=tuple(lights), ambient=float(rng.uniform(0.2, 0.7)))


def sample_clip(seed: int, num_frames: int, image_hw: tuple[int, int],
                path_kinds: Sequence[str] | None = None, objects: tuple[int, int] = SCENE_OBJECTS,
                frame_step: int = 1, synthetic_share: float = 0.0) -> ClipSpec:
    """Draw one clip's room, objects, textures, light, camera path and FoV from ``seed`` (>= 0).

    The path is drawn first, the objects then avoid its camera centres, so no camera is inside
    or within 0.3 m of a surface. ``path_kinds`` limits the paths to some of
    :data:`PATH_KINDS` (their weights renormalised; e.g. a curriculum's easy motions first).
    ``objects``: the range of the objects' number (inclusive); more objects give the views
    more landmarks to follow between frames (and the renderer more work). ``frame_step``: the
    clip takes every ``frame_step``-th camera of a path drawn that many times longer (the same
    path as a clip of that many frames, seen with larger motion between frames).
    ``synthetic_share``: the probability that the clip is :func:`synthetic_clip`'s instead
    (decided on a stream of its own, so the other seeds draw what they draw without it).
    """
    if seed < 0 or num_frames < 1:
        raise ValueError(f"need seed >= 0 and num_frames >= 1, got {seed}, {num_frames}")
    objects, frame_step = check_object_range(objects), check_frame_step(frame_step)
    kinds = check_path_kinds(path_kinds)
    if check_share(synthetic_share) and np.random.default_rng((_FAMILY_STREAM, int(seed))).random() < synthetic_share:
        return synthetic_clip(seed, num_frames, image_hw, frame_step)
    rng = np.random.default_rng((_STREAM, int(seed)))
    half = np.array([rng.uniform(1.8, 5.0), rng.uniform(1.8, 5.0), rng.uniform(1.2, 2.0)])
    weights = np.array([w if k in kinds else 0.0 for k, w in zip(PATH_KINDS, _PATH_WEIGHTS)])
    kind = PATH_KINDS[rng.choice(len(PATH_KINDS), p=weights / weights.sum())]
    T_room_cam = _camera_path(rng, kind, (num_frames - 1) * frame_step + 1, half)[::frame_step]
    scene = _furnish(rng, half, T_room_cam, objects)
    fov = float(rng.uniform(45.0, 90.0))
    K = pinhole_intrinsics(image_hw, fov)
    return ClipSpec(int(seed), scene, T_room_cam, K, world_from_room(int(seed)), kind, fov)


def synthetic_clip(seed: int, num_frames: int, image_hw: tuple[int, int], frame_step: int = 1) -> ClipSpec:
    """A clip of :func:`mapstream.synthetic.render_sequence`'s family, drawn from ``seed`` (>= 0).

    The room, its objects and the path are render_sequence's with the scene seed
    ``FIRST_TRAINING_SEED + seed`` (never a seed below it, which scoring uses); the arc
    travelled, the field of view (50-90 degrees) and the room's size (about the default's,
    large enough for the path) are drawn from ``seed``, so the family is seen at more than its
    default settings. The arc lies in 0.4-2 rad for clips of up to 24 frames; a longer clip's
    upper bound grows with its steps, so it is seen both at the 24-frame clips' fastest pace
    and as slowly as a 24-frame clip's whole arc spread over its length. Both are times
    ``frame_step``, as :func:`sample_clip`'s.
    """
    if seed < 0 or num_frames < 1:
        raise ValueError(f"need seed >= 0 and num_frames >= 1, got {seed}, {num_frames}")
    frame_step = check_frame_step(frame_step)
    rng = np.random.default_rng((_FAMILY_STREAM, int(seed), 1))
    longest = _ARC[1] * max(1.0, (num_frames - 1) / (_ARC_FRAMES - 1))
    arc, fov = float(rng.uniform(_ARC[0], longest)), float(rng.uniform(50.0, 90.0))
    half = (float(rng.uniform(2.5, 3.8)), float(rng.uniform(2.3, 3.4)), float(rng.uniform(1.2, 1.9)))
    scene_seed = FIRST_TRAINING_SEED + int(seed)
    cameras = (num_frames - 1) * frame_step + 1
    T_room_cam = camera_path(cameras, scene_seed, arc=arc * frame_step)[::frame_step]
    K = pinhole_intrinsics(image_hw, fov)
    return ClipSpec(int(seed), make_scene(scene_seed, room_half_size=half), T_room_cam, K,
                    world_from_room(scene_seed), SYNTHETIC_PATH, fov)


def check_share(share: float) -> float:
    """``share`` as a float; ValueError unless it lies in [0, 1]."""
    if not 0.0 <= float(share) <= 1.0:
        raise ValueError(f"synthetic_share must lie in [0, 1], got {share}")
    return float(share)


def check_object_range(objects: Sequence[int]) -> tuple[int, int]:
    """``objects`` as ``(least, most)``; ValueError unless ``0 <= least <= most``."""
    if len(objects) != 2 or not 0 <= int(objects[0]) <= int(objects[1]):
        raise ValueError(f"the objects' number must be a range (least, most) with 0 <= least <= most, got {tuple(objects)}")
    return int(objects[0]), int(objects[1])


def check_frame_step(frame_step: int) -> int:
    """``frame_step`` as an int; ValueError unless it is at least 1."""
    if int(frame_step) != frame_step or frame_step < 1:
        raise ValueError(f"frame_step must be an integer >= 1, got {frame_step}")
    return int(frame_step)


def check_path_kinds(path_kinds: Sequence[str] | None) -> tuple[str, ...]:
    """The path kinds to draw from (all of :data:`PATH_KINDS` for None or empty)."""
    if not path_kinds:
        return PATH_KINDS
    unknown = sorted(set(path_kinds) - set(PATH_KINDS))
    if unknown:
        raise ValueError(f"unknown camera path kinds {unknown}; the kinds are {list(PATH_KINDS)}")
    return tuple(path_kinds)


# ----------------------------------------------------------------------------- torch renderer
def _pack(scenes: Sequence[Scene], device, dtype) -> dict[str, Tensor]:
    """The scenes' primitives as ``[B, P, ...]`` tensors (padded with empty slots) and lights."""
    B, P = len(scenes), max(len(s.primitives) for s in scenes)
    L = max(len(s.lights) for s in scenes)
    kind = np.zeros((B, P), np.int64)
    centre, half = np.zeros((B, P, 3)), np.ones((B, P, 3))
    R = np.tile(np.eye(3), (B, P, 1, 1))
    col_a, col_b = np.zeros((B, P, 3)), np.zeros((B, P, 3))
    checker, noise, tex_seed = np.zeros((B, P)), np.ones((B, P)), np.zeros((B, P), np.int64)
    lights, light_w, ambient = np.zeros((B, L, 3)), np.zeros((B, L)), np.zeros(B)
    for b, scene in enumerate(scenes):
        for p, prim in enumerate(scene.primitives):
            centre[b, p] = prim.center
            if isinstance(prim, Sphere):
                kind[b, p], half[b, p] = _SPHERE, prim.radius
            else:
                kind[b, p], half[b, p], R[b, p] = (_ROOM if prim.inside else _BOX), prim.half_size, prim.R
            tex = prim.texture
            col_a[b, p], col_b[b, p] = tex.color_a, tex.color_b
            checker[b, p], noise[b, p], tex_seed[b, p] = tex.checker, tex.noise, tex.seed
        for i, light in enumerate(scene.lights):
            lights[b, i] = np.asarray(light) / np.linalg.norm(light)
            light_w[b, i] = (1 - scene.ambient) / len(scene.lights)
        ambient[b] = scene.ambient
    out = dict(centre=centre, half=half, R=R, col_a=col_a, col_b=col_b, checker=checker, noise=noise,
               lights=lights, light_w=light_w, ambient=ambient)
    packed = {k: torch.as_tensor(v, dtype=dtype, device=device) for k, v in out.items()}
    packed["kind"], packed["tex_seed"] = torch.as_tensor(kind), torch.as_tensor(tex_seed, device=device)
    return packed


def _hash01(ix: Tensor, iy: Tensor, seed: Tensor, dtype) -> Tensor:
    """mapstream.synthetic's lattice hash on int64 tensors (same wrap-around arithmetic)."""
    h = (ix * 73856093) ^ (iy * 19349663) ^ (seed * 83492791)
    h = (h ^ (h >> 13)) * 1274126177
    h = h ^ (h >> 16)
    return (h & 0xFFFFFF).to(dtype) / float(0x1000000)


def _value_noise(u: Tensor, v: Tensor, seed: Tensor, octaves: int = 3) -> Tensor:
    total, amp, norm = torch.zeros_like(u), 1.0, 0.0
    for o in range(octaves):
        x, y = u * 2**o, v * 2**o
        x0, y0 = torch.floor(x), torch.floor(y)
        fx, fy = x - x0, y - y0
        fx, fy = fx * fx * (3 - 2 * fx), fy * fy * (3 - 2 * fy)
        ix, iy, s = x0.to(torch.int64), y0.to(torch.int64), seed + 101 * o
        a, b = _hash01(ix, iy, s, u.dtype), _hash01(ix + 1, iy, s, u.dtype)
        c, d = _hash01(ix, iy + 1, s, u.dtype), _hash01(ix + 1, iy + 1, s, u.dtype)
        total = total + amp * ((a * (1 - fx) + b * fx) * (1 - fy) + (c * (1 - fx) + d * fx) * fy)
        norm += amp
        amp *= 0.5
    return total / norm


def _albedo(uv: Tensor, face: Tensor, tex: dict[str, Tensor]) -> Tensor:
    """:meth:`mapstream.synthetic.Texture.albedo` per ray, with per-ray texture parameters."""
    u, v = uv[..., 0], uv[..., 1]
    w = 0.45 * _value_noise(u / tex["noise"], v / tex["noise"], tex["tex_seed"] + 7 * face)
    has_checker = tex["checker"] > 0
    cell = torch.where(has_checker, tex["checker"], torch.ones_like(u))
    w = w + torch.where(has_checker, 0.4 * ((torch.floor(u / cell) + torch.floor(v / cell)) % 2), 0.0)
    f = face.to(u.dtype)
    w = w + 0.15 * (0.5 + 0.5 * torch.sin(0.9 * u + 1.7 * v + f))
    tint = 0.85 + 0.15 * torch.cos(f * 1.3)
    a, b = tex["col_a"], tex["col_b"]
    return (a + (b - a) * w[..., None]) * tint[..., None]


def _hit_box(o, d, centre, half, R, inside):
    """Ray/box hits as the CPU caster computes them: ``(t, world normal, uv, face)``."""
    ol, dl = (o - centre) @ R, d @ R
    dl = torch.where(dl.abs() < 1e-12, torch.full_like(dl, 1e-12), dl)
    t1, t2 = (-half - ol) / dl, (half - ol) / dl
    tnear, tfar = torch.minimum(t1, t2), torch.maximum(t1, t2)
    t_in, ax_in = tfar.min(-1)
    t_out, ax_out = tnear.max(-1)
    t_out = torch.where(t_out <= tfar.min(-1).values, t_out, torch.inf)
    t, axis = torch.where(inside, t_in, t_out), torch.where(inside, ax_in, ax_out)
    t = torch.where(t > _EPS, t, torch.inf)
    p = ol + torch.where(torch.isfinite(t), t, 0.0)[..., None] * dl
    on_axis = torch.where(axis == 0, p[..., 0], torch.where(axis == 1, p[..., 1], p[..., 2]))
    sign = torch.sign(on_axis)[..., None]
    n_local = (axis[..., None] == torch.arange(3, device=p.device)).to(p.dtype) * sign
    # uv: the two coordinates other than the hit axis, in order (selected, not gathered by an
    # index table: a gather over every ray and primitive costs more than the whole hit test).
    uv = torch.stack((torch.where(axis == 0, p[..., 1], p[..., 0]), torch.where(axis == 2, p[..., 1], p[..., 2])), -1)
    return t, n_local @ R.transpose(-1, -2), uv, 2 * axis + (sign[..., 0] > 0)


def _hit_sphere(o, d, centre, radius):
    oc = o - centre
    a, b = (d * d).sum(-1), 2 * (d * oc).sum(-1)
    c = (oc * oc).sum(-1) - radius**2
    disc = b * b - 4 * a * c
    t = (-b - torch.sqrt(disc.clamp(min=0))) / (2 * a)
    t = torch.where((disc >= 0) & (t > _EPS), t, torch.inf)
    n = (oc + torch.where(torch.isfinite(t), t, 0.0)[..., None] * d) / radius[..., None]
    uv = radius[..., None] * torch.stack((torch.atan2(n[..., 1], n[..., 0]), torch.arccos(n[..., 2].clamp(-1, 1))), -1)
    return t, n, uv, torch.zeros_like(t, dtype=torch.int64)


def _render(pk: dict[str, Tensor], T: Tensor, K: Tensor, hw: tuple[int, int], quantize: bool):
    H, W = hw
    B, S, dev, dt = T.shape[0], T.shape[1], T.device, T.dtype
    v, u = torch.meshgrid(torch.arange(H, device=dev, dtype=dt), torch.arange(W, device=dev, dtype=dt), indexing="ij")
    u, v = u.reshape(1, 1, -1), v.reshape(1, 1, -1)
    fx, fy, cx, cy = (K[..., i, j, None] for i, j in ((0, 0), (1, 1), (0, 2), (1, 2)))
    d_cam = torch.stack(((u - cx) / fx, (v - cy) / fy, torch.ones_like(u).expand_as(u - cx)), -1)
    d = d_cam @ T[..., :3, :3].transpose(-1, -2)  # [B, S, N, 3]; camera z = 1: t is the depth
    o = T[..., None, :3, 3]  # [B, S, 1, 3]
    best = torch.full(d.shape[:-1], torch.inf, device=dev, dtype=dt)
    normal, uv = torch.zeros_like(d), torch.zeros(d.shape[:-1] + (2,), device=dev, dtype=dt)
    face, winner = torch.zeros_like(best, dtype=torch.int64), torch.zeros_like(best, dtype=torch.int64)
    kinds = pk["kind"]
    for p in range(kinds.shape[1]):
        kind = kinds[:, p].to(dev).view(B, 1, 1)
        c, h, R = pk["centre"][:, p, None, None], pk["half"][:, p, None, None], pk["R"][:, p, None]
        t = torch.full_like(best, torch.inf)
        n, uvp, f = torch.zeros_like(d), torch.zeros_like(uv), torch.zeros_like(face)
        if bool(((kinds[:, p] == _BOX) | (kinds[:, p] == _ROOM)).any()):
            box = _hit_box(o, d, c, h, R, (kind == _ROOM))
            is_box = (kind == _BOX) | (kind == _ROOM)
            t = torch.where(is_box, box[0], t)
            n, uvp, f = (torch.where(is_box[..., None], box[1], n), torch.where(is_box[..., None], box[2], uvp),
                         torch.where(is_box, box[3], f))
        if bool((kinds[:, p] == _SPHERE).any()):
            sph = _hit_sphere(o, d, c, h[..., 0])
            is_sph = kind == _SPHERE
            t = torch.where(is_sph, sph[0], t)
            n, uvp, f = (torch.where(is_sph[..., None], sph[1], n), torch.where(is_sph[..., None], sph[2], uvp),
                         torch.where(is_sph, sph[3], f))
        closer = t < best
        best = torch.where(closer, t, best)
        normal, uv = torch.where(closer[..., None], n, normal), torch.where(closer[..., None], uvp, uv)
        face, winner = torch.where(closer, f, face), torch.where(closer, p, winner)
    hit = torch.isfinite(best)
    normal = torch.where(((normal * d).sum(-1) > 0)[..., None], -normal, normal)  # face the viewer
    shade = pk["ambient"].view(B, 1, 1).expand_as(best)
    for i in range(pk["lights"].shape[1]):
        lum = (normal * pk["lights"][:, i, None, None]).sum(-1).clamp(min=0)
        shade = shade + pk["light_w"][:, i, None, None] * lum
    flat = winner.reshape(B, -1)
    tex = {k: pk[k].gather(1, flat).view_as(best) for k in ("checker", "noise", "tex_seed")}
    for k in ("col_a", "col_b"):
        tex[k] = pk[k].gather(1, flat[..., None].expand(-1, -1, 3)).view(*best.shape, 3)
    uv = torch.where(hit[..., None], uv, 0.0)
    colour = (_albedo(uv, face, tex) * shade[..., None]).clamp(0, 1)
    colour = torch.where(hit[..., None], colour, 0.0)
    if quantize:
        colour = torch.round(colour * 255) / 255
    images = colour.view(B, S, H, W, 3).permute(0, 1, 4, 2, 3)
    return images, torch.where(hit, best, 0.0).view(B, S, H, W)


def render_clips(
    scenes: Sequence[Scene],
    cameras,
    K,
    hw: tuple[int, int],
    device: str | torch.device | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    quantize: bool = True,
    chunk_frames: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Render ``B`` clips of ``S`` frames at once, on any device, as :meth:`Scene.render` does.

    Args:
        scenes: ``B`` scenes (each clip its own).
        cameras: ``[B, S, 4, 4]`` camera-to-scene poses (OpenCV axes).
        K: ``[B, S, 3, 3]``, ``[B, 3, 3]`` or ``[3, 3]`` intrinsics in pixels.
        hw: ``(H, W)``.
        device: where to render (default: ``cameras``' device).
        dtype: float32 for training; float64 reproduces the CPU caster to rounding.
        quantize: round colours to ``k / 255`` like the caster's uint8 (and like photos).
        chunk_frames: render at most this many frames per clip at a time (bounds memory:
            about 0.3 KB per pixel in flight; the result agrees to rounding, not bit for bit,
            since the matrix products change shape).

    Returns:
        ``(images [B, S, 3, H, W] in [0, 1], depth [B, S, H, W])``: camera-space z, 0 = no hit.
    """
    T = torch.as_tensor(cameras)
    device = T.device if device is None else torch.device(device)
    T = T.to(device=device, dtype=dtype)
    if T.ndim != 4 or T.shape[0] != len(scenes) or T.shape[-2:] != (4, 4):
        raise ValueError(f"cameras must be [B={len(scenes)}, S, 4, 4], got {list(T.shape)}")
    K = torch.as_tensor(K).to(device=device, dtype=dtype)
    K = K.view(1, 1, 3, 3) if K.ndim == 2 else (K[:, None] if K.ndim == 3 else K)
    K = K.expand(T.shape[0], T.shape[1], 3, 3)
    pk = _pack(scenes, device, dtype)
    step = chunk_frames or T.shape[1]
    parts = [_render(pk, T[:, i:i + step], K[:, i:i + step], hw, quantize) for i in range(0, T.shape[1], step)]
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)
