"""Analytic scenes and an exact CPU ray caster (numpy, float64).

A :class:`Scene` is a list of primitives: oriented boxes seen from outside (objects) or from
inside (the room), and spheres. Each has a procedural texture (checker + value noise +
gradient, evaluated in metres on the surface so that images have features at every scale).
:meth:`Scene.render` casts one ray per pixel centre ``(u, v)`` (integer pixel coordinates,
OpenCV axes) and returns the shaded colour and the exact camera-space depth ``z`` of the first
hit; rays that hit nothing get depth 0 (cannot happen inside a closed room).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Texture", "Box", "Sphere", "Scene", "make_scene", "make_twin_scene"]

_EPS = 1e-9


def _hash01(ix: np.ndarray, iy: np.ndarray, seed: int) -> np.ndarray:
    """Deterministic pseudo-random values in [0, 1) for integer lattice points."""
    h = (ix.astype(np.int64) * 73856093) ^ (iy.astype(np.int64) * 19349663) ^ (seed * 83492791)
    h = (h ^ (h >> 13)) * 1274126177
    h = h ^ (h >> 16)
    return (h & 0xFFFFFF).astype(np.float64) / float(0x1000000)


def value_noise(u: np.ndarray, v: np.ndarray, seed: int, octaves: int = 3) -> np.ndarray:
    """Smooth value noise in [0, 1] at surface coordinates (cell size 1 at the first octave)."""
    total, amp, norm = np.zeros_like(u), 1.0, 0.0
    for o in range(octaves):
        x, y = u * 2**o, v * 2**o
        x0, y0 = np.floor(x), np.floor(y)
        fx, fy = x - x0, y - y0
        fx, fy = fx * fx * (3 - 2 * fx), fy * fy * (3 - 2 * fy)
        s = seed + 101 * o
        a, b = _hash01(x0, y0, s), _hash01(x0 + 1, y0, s)
        c, d = _hash01(x0, y0 + 1, s), _hash01(x0 + 1, y0 + 1, s)
        total += amp * ((a * (1 - fx) + b * fx) * (1 - fy) + (c * (1 - fx) + d * fx) * fy)
        norm += amp
        amp *= 0.5
    return total / norm


@dataclass(frozen=True)
class Texture:
    """Procedural albedo: ``lerp(color_a, color_b, w)`` with ``w`` mixing a checker, noise and a gradient.

    Attributes:
        color_a, color_b: RGB in [0, 1].
        checker: checker cell size in metres (0: no checker).
        noise: noise cell size in metres.
        seed: noise seed.
        half_turn: the texture of a room box centred on the z axis that looks the same after a
            half turn about that axis (its +x / -x and +y / -y walls alike, the floor and
            ceiling point-symmetric); for look-alike scenes (`make_twin_scene`).
    """

    color_a: tuple[float, float, float]
    color_b: tuple[float, float, float]
    checker: float = 0.25
    noise: float = 0.15
    seed: int = 0
    half_turn: bool = False

    def albedo(self, uv: np.ndarray, face: np.ndarray) -> np.ndarray:
        """Colours ``[M, 3]`` at surface coordinates ``uv`` ``[M, 2]`` (metres) on faces ``[M]``."""
        if self.half_turn:
            uv, face = _half_turn_canonical(uv, face)
        u, v = uv[:, 0], uv[:, 1]
        w = 0.45 * value_noise(u / self.noise, v / self.noise, self.seed + 7 * face)
        if self.checker > 0:
            w += 0.4 * ((np.floor(u / self.checker) + np.floor(v / self.checker)) % 2)
        w += 0.15 * (0.5 + 0.5 * np.sin(0.9 * u + 1.7 * v + face))  # slow gradient
        a, b = np.asarray(self.color_a), np.asarray(self.color_b)
        tint = 0.85 + 0.15 * np.cos(face * 1.3)[:, None]  # faces differ slightly
        return (a + (b - a) * w[:, None]) * tint


def _half_turn_canonical(uv: np.ndarray, face: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Box-face coordinates mapped so that (x, y, z) and (-x, -y, z) get the same colour: the
    +x wall (face 1) reads as the -x wall (face 0) with its first coordinate (y) negated, the
    +y wall (3) as the -y wall (2) with x negated; on the floor and ceiling (4, 5) a point and
    its half-turned twin are mapped to the one with u >= 0."""
    uv = uv.copy()
    face = face.copy()
    odd_wall = (face == 1) | (face == 3)
    uv[odd_wall, 0] *= -1
    face[odd_wall] -= 1
    flat = (face >= 4) & (uv[:, 0] < 0)
    uv[flat] *= -1
    return uv, face


@dataclass(frozen=True)
class Box:
    """Oriented box ``{c + R p : |p_k| <= h_k}``; ``inside=True`` renders it from inside (a room).

    Attributes:
        center: ``[3]`` world position (metres).
        half_size: ``[3]`` half extents along the box axes.
        R: ``[3, 3]`` box-to-world rotation (columns: box axes in the world).
        texture: surface texture.
        inside: the camera is inside (hit the far side of the slabs).
    """

    center: np.ndarray
    half_size: np.ndarray
    texture: Texture
    R: np.ndarray = field(default_factory=lambda: np.eye(3))
    inside: bool = False

    def intersect(self, o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Ray hits: ``(t [M] (inf = miss), world normal [M, 3], uv [M, 2], face [M])``."""
        ol = (o - self.center) @ self.R
        dl = d @ self.R
        dl = np.where(np.abs(dl) < 1e-12, 1e-12, dl)
        t1, t2 = (-self.half_size - ol) / dl, (self.half_size - ol) / dl
        tnear, tfar = np.minimum(t1, t2), np.maximum(t1, t2)
        if self.inside:
            axis = np.argmin(tfar, axis=1)
            t = np.take_along_axis(tfar, axis[:, None], 1)[:, 0]
        else:
            axis = np.argmax(tnear, axis=1)
            t = np.take_along_axis(tnear, axis[:, None], 1)[:, 0]
            t = np.where(t <= tfar.min(axis=1), t, np.inf)
        t = np.where(t > _EPS, t, np.inf)
        p = ol + t[:, None] * dl
        rows = np.arange(len(o))
        sign = np.sign(p[rows, axis])
        n_local = np.zeros_like(p)
        n_local[rows, axis] = sign
        others = np.array([[1, 2], [0, 2], [0, 1]])[axis]
        uv = np.stack((p[rows, others[:, 0]], p[rows, others[:, 1]]), axis=1)
        face = (2 * axis + (sign > 0)).astype(np.int64)
        return t, n_local @ self.R.T, uv, face


@dataclass(frozen=True)
class Sphere:
    """Sphere of ``radius`` (metres) around ``center`` ``[3]``."""

    center: np.ndarray
    radius: float
    texture: Texture

    def intersect(self, o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        oc = o - self.center
        a = (d * d).sum(1)
        b = 2 * (d * oc).sum(1)
        c = (oc * oc).sum(1) - self.radius**2
        disc = b * b - 4 * a * c
        sq = np.sqrt(np.maximum(disc, 0))
        t = (-b - sq) / (2 * a)
        t = np.where((disc >= 0) & (t > _EPS), t, np.inf)
        n = (oc + np.where(np.isfinite(t), t, 0)[:, None] * d) / self.radius
        uv = self.radius * np.stack((np.arctan2(n[:, 1], n[:, 0]), np.arccos(np.clip(n[:, 2], -1, 1))), 1)
        return t, n, uv, np.zeros(len(o), dtype=np.int64)


@dataclass
class Scene:
    """Primitives plus lighting (two directional lights and an ambient term)."""

    primitives: list[Box | Sphere]
    lights: tuple[tuple[float, float, float], ...] = ((0.3, 0.5, 0.8), (-0.6, -0.2, 0.4))
    ambient: float = 0.45

    def cast(self, o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First hit along rays ``o + t d`` (``[M, 3]`` each): ``(t [M], colour [M, 3] in [0, 1])``."""
        best_t = np.full(len(o), np.inf)
        colour = np.zeros((len(o), 3))
        for prim in self.primitives:
            t, n, uv, face = prim.intersect(o, d)
            closer = t < best_t
            if not closer.any():
                continue
            best_t = np.where(closer, t, best_t)
            n, uv, face = n[closer], uv[closer], face[closer]
            n = np.where(((n * d[closer]).sum(1) > 0)[:, None], -n, n)  # face the viewer
            shade = np.full(len(n), self.ambient)
            for light in self.lights:
                l_dir = np.asarray(light) / np.linalg.norm(light)
                shade += (1 - self.ambient) / len(self.lights) * np.clip(n @ l_dir, 0, None)
            colour[closer] = prim.texture.albedo(uv, face) * shade[:, None]
        return best_t, np.clip(colour, 0, 1)

    def render(
        self, K: np.ndarray, T_world_cam: np.ndarray, image_hw: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Render one view.

        Args:
            K: ``[3, 3]`` pinhole intrinsics (pixels).
            T_world_cam: ``[4, 4]`` (or ``[3, 4]``) camera-to-world, OpenCV axes.
            image_hw: ``(H, W)``.

        Returns:
            ``(rgb [H, W, 3] uint8, depth [H, W] float64 camera-space z in metres, 0 = no hit)``.
        """
        H, W = image_hw
        v, u = np.meshgrid(np.arange(H, dtype=np.float64), np.arange(W, dtype=np.float64), indexing="ij")
        d_cam = np.stack(((u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], np.ones_like(u)), -1).reshape(-1, 3)
        R, t = np.asarray(T_world_cam)[:3, :3], np.asarray(T_world_cam)[:3, 3]
        d = d_cam @ R.T  # z component 1 in the camera: the ray parameter is the depth
        o = np.broadcast_to(t, d.shape)
        depth, colour = self.cast(o, d)
        depth = np.where(np.isfinite(depth), depth, 0.0).reshape(H, W)
        rgb = np.round(colour.reshape(H, W, 3) * 255).astype(np.uint8)
        return rgb, depth


def _yaw(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _colour(rng: np.random.Generator) -> tuple[float, float, float]:
    return tuple(float(c) for c in rng.uniform(0.2, 1.0, 3))


def _room(rng: np.random.Generator, half_size: tuple[float, float, float], *, half_turn: bool = False) -> Box:
    """The room box (seen from inside, floor at z = 0) with a texture drawn from `rng`."""
    texture = Texture(_colour(rng), _colour(rng), checker=0.5, noise=0.3, seed=int(rng.integers(1 << 20)),
                      half_turn=half_turn)
    return Box(center=np.array([0.0, 0.0, half_size[2]]), half_size=np.array(half_size), texture=texture, inside=True)


def make_scene(seed: int = 0, *, room_half_size: tuple[float, float, float] = (3.0, 2.6, 1.5)) -> Scene:
    """A random furnished room (deterministic given ``seed``).

    The room is the box ``|x| <= hx, |y| <= hy, 0 <= z <= 2 hz`` (z up, metres). Three boxes
    stand on the floor and two spheres float, all within 0.9 m (plus their extent) of the
    vertical axis through the room centre, clear of :func:`~mapstream.synthetic.sequence.camera_path`.
    """
    rng = np.random.default_rng(seed)

    def colour() -> tuple[float, float, float]:
        return _colour(rng)

    prims: list[Box | Sphere] = [_room(rng, room_half_size)]
    for k in range(3):
        angle = 2 * np.pi * (k / 3) + rng.uniform(-0.4, 0.4)
        r = rng.uniform(0.2, 0.9)
        half = rng.uniform(0.15, 0.4, 3)
        prims.append(
            Box(
                center=np.array([r * np.cos(angle), r * np.sin(angle), half[2]]),
                half_size=half,
                R=_yaw(rng.uniform(0, np.pi)),
                texture=Texture(colour(), colour(), checker=rng.uniform(0.06, 0.15), noise=0.08,
                                seed=int(rng.integers(1 << 20))),
            )
        )
    for k in range(2):
        angle = rng.uniform(0, 2 * np.pi)
        radius = rng.uniform(0.2, 0.35)
        r = rng.uniform(0.0, 0.9)
        prims.append(
            Sphere(
                center=np.array([r * np.cos(angle), r * np.sin(angle), rng.uniform(1.2, 2.0)]),
                radius=float(radius),
                texture=Texture(colour(), colour(), checker=0.1, noise=0.05, seed=int(rng.integers(1 << 20))),
            )
        )
    return Scene(prims)


def make_twin_scene(seed: int = 0, *, room_half_size: tuple[float, float, float] = (3.0, 2.6, 1.5)) -> Scene:
    """A room that looks the same after a half turn about its vertical axis: a planted
    look-alike. Its walls, floor and ceiling are textured half-turn symmetric and each of its
    three boxes has a twin at the opposite point (turned by half a turn), so a camera at
    ``(x, y)`` looking one way sees what a camera at ``(-x, -y)`` sees looking the other way,
    though the two stand metres apart. No spheres (their texture would tell the twins apart),
    and the two lights are a half-turned pair.
    Deterministic given ``seed``."""
    rng = np.random.default_rng(seed + 7_000_003)

    def colour() -> tuple[float, float, float]:
        return _colour(rng)

    prims: list[Box | Sphere] = [_room(rng, room_half_size, half_turn=True)]
    for k in range(3):
        angle = np.pi * (k / 3) + rng.uniform(-0.3, 0.3)
        r = rng.uniform(0.4, 0.9)
        half = rng.uniform(0.15, 0.35, 3)
        yaw = rng.uniform(0, np.pi)
        texture = Texture(colour(), colour(), checker=rng.uniform(0.06, 0.15), noise=0.08,
                          seed=int(rng.integers(1 << 20)))
        for turn in (0.0, np.pi):
            c, s_ = np.cos(angle + turn), np.sin(angle + turn)
            prims.append(Box(center=np.array([r * c, r * s_, half[2]]), half_size=half, R=_yaw(yaw + turn),
                             texture=texture))
    # Lights in a half-turn pair too, or the shading would tell the twins apart.
    return Scene(prims, lights=((0.3, 0.5, 0.8), (-0.3, -0.5, 0.8)))
