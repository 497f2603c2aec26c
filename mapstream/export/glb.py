"""GLB scene (binary glTF 2.0, via trimesh): the point cloud, camera frustums and the trajectory.

Axis convention: glTF is y-up with viewers looking down -z, while the reconstruction's world is
the first camera's OpenCV frame (y down, z forward). Every world point is therefore mapped by
:data:`OPENCV_TO_GLTF` ``= diag(1, -1, -1)`` (a 180 degree rotation about x; no recentring, no
scaling): ``p_gltf = (x, -y, -z)``. A scene taken with an upright first camera opens upright,
seen from the first camera's side. Geometry (all nodes are placed with identity transforms):

* ``points``: a POINTS primitive with per-vertex RGB colours;
* ``camera_000000`` ...: one LINES primitive per frame (per selected frame with ``cameras``),
  the 8 edges of its viewing frustum (apex = camera centre, far rectangle = the image corners
  at depth ``frustum_depth``), coloured along the trajectory with a matplotlib colormap (first
  frame = colormap start);
* ``trajectory``: a grey LINES primitive through the camera centres.

With ``GlbStyle(axes="reference")`` every coordinate is mapped instead as the reference's
``predictions_to_glb`` maps its scene: by ``T_world_cam[0] · diag(1, -1, -1) · Ry(180°)``
(:func:`scene_transform`; the first camera as reference, then its glTF flip and a half turn
about y), for files that must line up with the reference's.

A :class:`~mapstream.export.glb_style.GlbStyle` can instead draw the points as spheres and the
frustum edges and the trajectory as tubes (triangle meshes under the same node names), and
adjust the point colours (opacity toward white, saturation, brightness); the default style
draws the scene above.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

import numpy as np

from mapstream.export._optional import import_optional
from mapstream.export.glb_style import (
    SPHERE_RADIUS_FRACTION,
    GlbAxes,
    GlbStyle,
    adjust_colours,
    sphere_instances,
    tube_segments,
    vertex_coloured_mesh,
)
from mapstream.export.points import CloudOptions, PointSet, build_point_cloud, subsample
from mapstream.export.reconstruction import Reconstruction
from mapstream.io.atomic import atomic_open

logger = logging.getLogger(__name__)

__all__ = [
    "FRUSTUM_EDGES", "OPENCV_TO_GLTF", "GlbStyle", "frustum_corners", "scene_extent", "scene_transform",
    "write_glb",
]

OPENCV_TO_GLTF = np.diag([1.0, -1.0, -1.0])
"""World axes map from the reconstruction (OpenCV-style) to the GLB (glTF y-up)."""


def scene_transform(recon: Reconstruction, axes: str = "gltf") -> np.ndarray:
    """``[4, 4]`` float64 map of world coordinates into the GLB's scene for ``axes`` (see
    :class:`~mapstream.export.glb_style.GlbStyle`): "gltf" ``diag(1, -1, -1)``, or "reference"
    the reference's ``T_world_cam[0] · diag(1, -1, -1) · Ry(180°)`` (its
    ``inverse(extrinsic[0])``, extrinsics being world-to-camera)."""
    if axes not in get_args(GlbAxes):
        raise ValueError(f"axes must be one of {', '.join(get_args(GlbAxes))}, got {axes!r}")
    flip = np.eye(4)
    flip[:3, :3] = OPENCV_TO_GLTF
    if axes == "gltf":
        return flip
    first = np.eye(4)
    first[:3] = recon.T_world_cam[0].astype(np.float64)
    half_turn_y = np.diag([-1.0, 1.0, -1.0, 1.0])
    return first @ flip @ half_turn_y


def _mapped(xyz: np.ndarray, transform: np.ndarray) -> np.ndarray:
    """``[..., 3]`` points through a ``[4, 4]`` rigid transform, as float64."""
    return xyz.astype(np.float64) @ transform[:3, :3].T + transform[:3, 3]

FRUSTUM_EDGES = np.array([[0, 1], [0, 2], [0, 3], [0, 4], [1, 2], [2, 3], [3, 4], [4, 1]])
"""The 8 edges of a frustum, as pairs of indices into :func:`frustum_corners`' vertices
[apex, top-left, top-right, bottom-right, bottom-left]."""


def scene_extent(points: PointSet, camera_centres: np.ndarray) -> float:
    """Robust scene size: diagonal of the 5-95 percentile box of the points and camera centres."""
    xyz = np.concatenate([points.xyz.astype(np.float64), camera_centres.astype(np.float64)])
    lo, hi = np.percentile(xyz, [5, 95], axis=0)
    extent = float(np.linalg.norm(hi - lo))
    return extent if np.isfinite(extent) and extent > 0 else 1.0


def frustum_corners(recon: Reconstruction, depth: float) -> np.ndarray:
    """``[N, 5, 3]`` world (OpenCV-style, before the glTF axis map) frustum vertices.

    Vertex 0 is the camera centre; 1-4 are the image corners (pixel edges ``(0, 0)``,
    ``(W, 0)``, ``(W, H)``, ``(0, H)``) unprojected at camera depth ``depth``.
    """
    H, W = recon.image_hw
    fx, fy = recon.K[:, 0, 0, None].astype(np.float64), recon.K[:, 1, 1, None].astype(np.float64)
    cx, cy = recon.K[:, 0, 2, None].astype(np.float64), recon.K[:, 1, 2, None].astype(np.float64)
    # Pixel edges in the integer-centre convention are at -0.5 and W - 0.5.
    u = np.array([-0.5, W - 0.5, W - 0.5, -0.5])[None]
    v = np.array([-0.5, -0.5, H - 0.5, H - 0.5])[None]
    corners = np.stack([(u - cx) * depth / fx, (v - cy) * depth / fy, np.full((len(recon), 4), depth)], -1)
    cam = np.concatenate([np.zeros((len(recon), 1, 3)), corners], axis=1)
    R = recon.T_world_cam[:, :, :3].astype(np.float64)
    t = recon.T_world_cam[:, :, 3].astype(np.float64)
    return np.einsum("nij,nkj->nki", R, cam) + t[:, None]


def _line_set(trimesh, vertices: np.ndarray, edges: np.ndarray, rgba: np.ndarray):
    """A trimesh Path3D of straight segments (exported as a glTF LINES primitive)."""
    from trimesh.path.entities import Line

    entities = [Line(edge) for edge in edges]
    colors = np.tile(np.asarray(rgba, np.uint8), (len(entities), 1))
    return trimesh.path.Path3D(entities=entities, vertices=vertices, colors=colors, process=False)


def _edges(trimesh, vertices: np.ndarray, edges: np.ndarray, rgba: np.ndarray, radius: float | None):
    """Straight segments between ``vertices`` (the scene's axes): lines, or tubes of ``radius``."""
    if radius is None:
        return _line_set(trimesh, vertices, edges, rgba)
    return vertex_coloured_mesh(trimesh, tube_segments(vertices[edges[:, 0]], vertices[edges[:, 1]], rgba, radius))


def _point_geometry(trimesh, cloud: PointSet, style: GlbStyle, extent: float, transform: np.ndarray):
    """The ``points`` node's geometry (a point cloud or one merged sphere mesh, mapped into the
    scene by ``transform``) and a few words on it for the log."""
    if style.points == "spheres":
        cloud = subsample(cloud, style.max_spheres, seed=style.seed)
    rgb = cloud.rgb if style.keeps_colours else adjust_colours(
        cloud.rgb, opacity=style.opacity, saturation=style.saturation, brightness=style.brightness
    )
    xyz = _mapped(cloud.xyz, transform)
    if style.points == "points":
        rgba = np.concatenate([rgb, np.full((len(cloud), 1), 255, np.uint8)], axis=1)
        return trimesh.PointCloud(xyz, colors=rgba), f"{len(cloud)} points"
    radius = style.sphere_radius if style.sphere_radius is not None else SPHERE_RADIUS_FRACTION * extent
    unit = trimesh.creation.icosphere(subdivisions=style.sphere_detail)
    spheres = sphere_instances(xyz, rgb, radius, np.asarray(unit.vertices), np.asarray(unit.faces))
    return vertex_coloured_mesh(trimesh, spheres), f"{len(cloud)} spheres of radius {radius:.3g}"


def _frame_selection(cameras: Sequence[int] | np.ndarray) -> np.ndarray:
    """An index array usable on ``arange(N)``: a boolean mask stays a mask; anything else,
    including an empty list (which numpy reads as float), becomes int64 indices."""
    selection = np.asarray(cameras)
    return selection if selection.dtype == np.bool_ else selection.astype(np.int64)


def write_glb(
    recon: Reconstruction,
    path: str | os.PathLike[str],
    options: CloudOptions = CloudOptions(),
    *,
    points: PointSet | None = None,
    frustum_scale: float = 0.04,
    frustum_depth: float | None = None,
    colormap: str = "viridis",
    trajectory: bool = True,
    cameras: Sequence[int] | np.ndarray | None = None,
    style: GlbStyle = GlbStyle(),
) -> Path:
    """Write the scene as GLB, atomically (conventions in the module docstring).

    Args:
        recon: the reconstruction.
        path: output ``.glb`` file.
        options: point-cloud filters (ignored when ``points`` is given).
        points: a precomputed cloud (e.g. shared with the PLY writer).
        frustum_scale: frustum depth as a fraction of :func:`scene_extent`.
        frustum_depth: the frustum depth in world units instead (e.g. the size a viewer draws
            them at); > 0.
        colormap: matplotlib colormap over the frame index for the frustums.
        trajectory: also draw the polyline through the camera centres (all of them).
        cameras: the frames whose frustums are drawn (indices, or a boolean mask over the
            frames); None: every frame. Colours and node names keep the frame's own index.
        style: spheres instead of points, tubes instead of lines, the point colours' opacity,
            saturation and brightness (:class:`~mapstream.export.glb_style.GlbStyle`; the
            default draws points and lines with the cloud's colours, in the "gltf" axes).
    """
    trimesh = import_optional("trimesh", "writing GLB scenes")
    matplotlib = import_optional("matplotlib", "colouring camera frustums")
    transform = scene_transform(recon, style.axes)
    cloud = build_point_cloud(recon, options) if points is None else points
    centres = recon.T_world_cam[:, :, 3]
    extent = scene_extent(cloud, centres)
    if frustum_depth is not None and not 0 < frustum_depth < np.inf:
        raise ValueError(f"frustum_depth must be > 0 and finite (world units), or unset; got {frustum_depth}")
    depth = frustum_scale * extent if frustum_depth is None else frustum_depth
    frames = frustum_corners(recon, depth)

    scene = trimesh.Scene()
    drawn_points = "no points"
    if len(cloud):
        geometry, drawn_points = _point_geometry(trimesh, cloud, style, extent, transform)
        scene.add_geometry(geometry, geom_name="points")
    else:
        logger.warning("no point passed the filters; the GLB holds cameras only")
    cmap = matplotlib.colormaps[colormap]
    positions = np.linspace(0.0, 1.0, len(recon)) if len(recon) > 1 else np.zeros(1)
    colours = np.rint(np.asarray(cmap(positions)) * 255).astype(np.uint8)
    drawn = np.arange(len(recon)) if cameras is None else np.arange(len(recon))[_frame_selection(cameras)]
    for i in drawn:
        scene.add_geometry(
            _edges(trimesh, _mapped(frames[i], transform), FRUSTUM_EDGES, colours[i], style.frustum_radius),
            geom_name=f"camera_{i:06d}",
        )
    if trajectory and len(recon) > 1:
        steps = np.stack([np.arange(len(recon) - 1), np.arange(1, len(recon))], axis=1)
        scene.add_geometry(
            _edges(trimesh, _mapped(centres, transform), steps, np.array([128, 128, 128, 255]),
                   style.trajectory_radius),
            geom_name="trajectory",
        )
    data = scene.export(file_type="glb")
    with atomic_open(path, "wb") as handle:
        handle.write(data)
    logger.info("wrote %s (%s, %d cameras, frustum depth %.3g)", path, drawn_points, len(drawn), depth)
    return Path(path)
