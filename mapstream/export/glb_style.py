"""How the GLB scene looks: :class:`GlbStyle`, its colour adjustments and its meshes.

Many glTF viewers (the web ones especially) draw POINTS and LINES one pixel wide whatever the
scene's size, so a shared point cloud looks thin and its cameras almost vanish. A style can
therefore draw each point as a small sphere and the trajectory and frustum edges as tubes:
real triangle meshes with per-vertex colours, which every viewer shades at their true size.
The default style draws exactly what :func:`mapstream.export.glb.write_glb` always drew.

Meshes (all in the GLB's glTF axes, one merged mesh per node, built without a Python loop
over points or segments):

* spheres (:func:`sphere_instances`): a copy of a unit icosphere (``sphere_detail``
  subdivisions: 0 = icosahedron, 12 vertices and 20 triangles; 1 = 42 and 80) per point,
  scaled by the radius and moved to the point, coloured with the point's colour. With normals
  a GLB costs about 0.6 KB a sphere at detail 0 and 2.1 KB at detail 1 (115 MB for 200,000
  icosahedra), hence :attr:`GlbStyle.max_spheres`;
* tubes (:func:`tube_segments`): an open prism of :data:`TUBE_SIDES` sides around each segment.

The meshes carry a non-metallic material: a glTF primitive without one is fully metallic,
which viewers without an environment map draw nearly black.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import numpy as np

__all__ = [
    "SPHERE_RADIUS_FRACTION",
    "TUBE_SIDES",
    "GlbAxes",
    "GlbStyle",
    "MeshArrays",
    "PointMode",
    "adjust_colours",
    "sphere_instances",
    "tube_segments",
    "vertex_coloured_mesh",
]

PointMode = Literal["points", "spheres"]
GlbAxes = Literal["gltf", "reference"]

SPHERE_RADIUS_FRACTION = 0.002
"""Sphere radius when :attr:`GlbStyle.sphere_radius` is None, as a fraction of the scene extent
(:func:`mapstream.export.glb.scene_extent`): 200,000 spheres spread over a surface as large as
the extent squared stand about one diameter apart, so the surface reads as closed."""

TUBE_SIDES = 8
"""Sides of the prism drawn around each tube segment."""

GREY_WEIGHTS = np.array([0.299, 0.587, 0.114])
"""A colour's grey level for :func:`adjust_colours`' saturation: its Rec. 601 luma (as PIL's
``ImageEnhance.Color``), so saturation 0 gives the grey a black-and-white photo would show."""


@dataclass(frozen=True)
class GlbStyle:
    """How :func:`~mapstream.export.glb.write_glb` draws the scene; the defaults draw points
    and lines with the cloud's own colours, byte for byte as without a style.

    Attributes:
        points: ``"points"`` (a POINTS primitive) or ``"spheres"`` (a sphere mesh per point).
        sphere_radius: sphere radius in world units; None: :data:`SPHERE_RADIUS_FRACTION` of
            the scene extent.
        max_spheres: most spheres (a seeded uniform subsample of the points beyond, order
            kept); ``points="points"`` keeps every point.
        sphere_detail: icosphere subdivisions, 0 (12 vertices a sphere) or 1 (42).
        trajectory_radius: None: the trajectory as lines; a value: as a tube of that radius
            (world units).
        frustum_radius: the same for the edges of the camera frustums.
        opacity: in (0, 1]; the point colours are blended toward white by ``1 - opacity``, as
            the reference's export does (the GLB stays opaque: no real transparency, which
            viewers sort badly for millions of overlapping primitives).
        saturation: >= 0; scales each point colour's distance from its grey level (1: as is,
            0: grey, 2: twice as vivid, clipped to 0-255).
        brightness: >= 0; multiplies the point colours (clipped to 255).
        seed: random seed of the ``max_spheres`` subsample.
        axes: the scene's axes: "gltf", the world's ``(x, -y, -z)``, or "reference", as the
            reference's GLB export lays its scene out
            (:func:`mapstream.export.glb.scene_transform`).

    The colour settings change the points only; cameras keep their colormap colours and the
    trajectory its grey.
    """

    points: PointMode = "points"
    sphere_radius: float | None = None
    max_spheres: int = 200_000
    sphere_detail: int = 0
    trajectory_radius: float | None = None
    frustum_radius: float | None = None
    opacity: float = 1.0
    saturation: float = 1.0
    brightness: float = 1.0
    seed: int = 0
    axes: GlbAxes = "gltf"

    def __post_init__(self) -> None:
        # Every message starts with the field's name: the command line rewrites it as its flag.
        if self.points not in get_args(PointMode):
            raise ValueError(f"points must be 'points' or 'spheres', got {self.points!r}")
        if self.axes not in get_args(GlbAxes):
            raise ValueError(f"axes must be 'gltf' or 'reference', got {self.axes!r}")
        for name in ("sphere_radius", "trajectory_radius", "frustum_radius"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be > 0 and finite (world units), or unset; got {value}")
        if self.max_spheres < 1:
            raise ValueError(f"max_spheres must be >= 1, got {self.max_spheres}")
        if self.sphere_detail not in (0, 1):
            raise ValueError(f"sphere_detail must be 0 (12 vertices a sphere) or 1 (42), got {self.sphere_detail}")
        if not 0 < self.opacity <= 1:  # NaN fails too
            raise ValueError(f"opacity must be in (0, 1] (1: colours as they are), got {self.opacity}")
        for name in ("saturation", "brightness"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be >= 0 and finite (1: colours as they are), got {value}")

    @property
    def keeps_colours(self) -> bool:
        """Whether the colour settings leave every colour as it is."""
        return self.opacity == 1 and self.saturation == 1 and self.brightness == 1


def adjust_colours(rgb: np.ndarray, *, opacity: float = 1.0, saturation: float = 1.0,
                   brightness: float = 1.0) -> np.ndarray:
    """``[P, 3]`` uint8 colours with :class:`GlbStyle`'s adjustments, in this order:

    1. saturation: ``grey + saturation * (c - grey)``, grey = the colour's Rec. 601 luma
       (:data:`GREY_WEIGHTS`), clipped to [0, 255];
    2. brightness: ``c * brightness``, clipped to [0, 255];
    3. opacity: ``opacity * c + (1 - opacity) * 255`` (toward white).

    Computed in float64 and rounded once at the end, halves up (127.5 -> 128); the defaults
    return the colours unchanged.
    """
    colour = np.asarray(rgb, np.float64)
    grey = colour @ GREY_WEIGHTS
    colour = np.clip(grey[:, None] + saturation * (colour - grey[:, None]), 0.0, 255.0)
    colour = np.clip(colour * brightness, 0.0, 255.0)
    colour = opacity * colour + (1.0 - opacity) * 255.0
    return np.floor(colour + 0.5).astype(np.uint8)


class MeshArrays(NamedTuple):
    """A triangle mesh as arrays: ``vertices`` [V, 3] float64, ``faces`` [F, 3] int64,
    ``normals`` [V, 3] unit vertex normals, ``colours`` [V, 4] uint8 RGBA."""

    vertices: np.ndarray
    faces: np.ndarray
    normals: np.ndarray
    colours: np.ndarray


def _rgba(colours: np.ndarray, count: int) -> np.ndarray:
    """``[count, 4]`` uint8 RGBA from one colour or one per item (RGB gets alpha 255)."""
    colours = np.broadcast_to(np.asarray(colours, np.uint8), (count, np.shape(colours)[-1]))
    if colours.shape[1] == 3:
        colours = np.concatenate([colours, np.full((count, 1), 255, np.uint8)], axis=1)
    return colours


def sphere_instances(centres: np.ndarray, colours: np.ndarray, radius: float,
                     unit_vertices: np.ndarray, unit_faces: np.ndarray) -> MeshArrays:
    """One merged mesh of a sphere per centre: ``unit_vertices`` (on the unit sphere, e.g. a
    trimesh icosphere's) scaled by ``radius`` and moved to each of the ``[P, 3]`` centres;
    sphere ``i`` owns vertices ``i * k .. (i + 1) * k - 1`` (k = len(unit_vertices)), all
    with colour ``colours[i]`` (RGB or RGBA, or one colour for all)."""
    centres = np.asarray(centres, np.float64)
    unit = np.asarray(unit_vertices, np.float64)
    count, k = len(centres), len(unit)
    vertices = (centres[:, None, :] + radius * unit[None]).reshape(-1, 3)
    faces = (np.asarray(unit_faces, np.int64)[None] + k * np.arange(count)[:, None, None]).reshape(-1, 3)
    normals = np.broadcast_to(unit, (count, k, 3)).reshape(-1, 3)
    return MeshArrays(vertices, faces, normals, np.repeat(_rgba(colours, count), k, axis=0))


def _perpendicular_frames(directions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two unit vectors ``u, v`` per unit direction ``d`` with ``(u, v, d)`` right-handed."""
    # Crossing with the axis least aligned with d never gives a near-zero vector.
    helper = np.eye(3)[np.argmin(np.abs(directions), axis=1)]
    u = np.cross(directions, helper)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return u, np.cross(directions, u)


def tube_segments(starts: np.ndarray, ends: np.ndarray, colours: np.ndarray, radius: float,
                  sides: int = TUBE_SIDES) -> MeshArrays:
    """One merged mesh of an open prism (a tube without caps) of ``sides`` sides around each
    segment ``starts[i] -> ends[i]`` (``[S, 3]`` each): every vertex lies at ``radius`` from
    the segment's line, on a ring around one of its ends. Segment ``i`` owns vertices
    ``2 * sides * i ..``: its start ring, then its end ring; colours as :func:`sphere_instances`'.
    A zero-length segment becomes a flat ring (its triangles have no area)."""
    starts, ends = np.asarray(starts, np.float64), np.asarray(ends, np.float64)
    count = len(starts)
    axis = ends - starts
    length = np.linalg.norm(axis, axis=1, keepdims=True)
    directions = np.where(length > 0, axis / np.where(length > 0, length, 1.0), [1.0, 0.0, 0.0])
    u, v = _perpendicular_frames(directions)
    angles = 2 * np.pi * np.arange(sides) / sides
    radial = np.cos(angles)[None, :, None] * u[:, None] + np.sin(angles)[None, :, None] * v[:, None]  # [S, sides, 3]
    rings = np.stack([starts[:, None] + radius * radial, ends[:, None] + radius * radial], axis=1)  # [S, 2, sides, 3]
    # Side j joins start-ring vertices j, j+1 and end-ring vertices j, j+1; this winding puts
    # the triangles' front faces outward (u x v = d).
    j, following = np.arange(sides), (np.arange(sides) + 1) % sides
    ring_faces = np.concatenate([
        np.stack([j, following, sides + j], axis=1),
        np.stack([following, sides + following, sides + j], axis=1),
    ])
    faces = (ring_faces[None] + 2 * sides * np.arange(count)[:, None, None]).reshape(-1, 3)
    normals = np.broadcast_to(radial[:, None], (count, 2, sides, 3)).reshape(-1, 3)
    return MeshArrays(rings.reshape(-1, 3), faces, normals, np.repeat(_rgba(colours, count), 2 * sides, axis=0))


def vertex_coloured_mesh(trimesh, arrays: MeshArrays):
    """A ``trimesh.Trimesh`` of ``arrays`` that exports its vertex colours (COLOR_0), normals
    and a non-metallic, fully rough material (see the module docstring)."""
    from trimesh.visual.material import PBRMaterial

    material = PBRMaterial(name="vertex colours", metallicFactor=0.0, roughnessFactor=1.0)
    mesh = trimesh.Trimesh(
        vertices=arrays.vertices, faces=arrays.faces, vertex_normals=arrays.normals,
        visual=trimesh.visual.TextureVisuals(material=material), process=False, validate=False,
    )
    mesh.visual.vertex_attributes["color"] = arrays.colours
    return mesh
