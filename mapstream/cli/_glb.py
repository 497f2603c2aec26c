"""The flags of the GLB scene's style (`mapstream export --glb-points spheres ...`), declared once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

import tyro

from ..export import GlbStyle
from ..export.glb_style import GlbAxes, PointMode

__all__ = ["GlbFlags", "GlbStyleFlags"]


@dataclass
class GlbStyleFlags:
    """How scene.glb draws the points, cameras and trajectory (defaults: points and lines as always)."""

    glb_points: PointMode = "points"
    """GLB: draw the points as points (1 pixel wide in many viewers) or as sphere meshes (true size everywhere)."""
    glb_sphere_radius: Optional[float] = None
    """GLB spheres: radius in world units (None: 0.002 of the scene extent)."""
    glb_max_spheres: int = 200_000
    """GLB spheres: most spheres (seeded uniform subsample beyond; about 0.6 KB of file each)."""
    glb_sphere_detail: int = 0
    """GLB spheres: 0 (icosahedron, 12 vertices, about 0.6 KB each) or 1 (42 vertices, rounder, about 2.1 KB each)."""
    glb_trajectory_radius: Optional[float] = None
    """GLB: draw the trajectory as a tube of this radius in world units (None: lines)."""
    glb_frustum_radius: Optional[float] = None
    """GLB: draw the camera frustums' edges as tubes of this radius in world units (None: lines)."""
    glb_opacity: float = 1.0
    """GLB: point colours blended toward white by 1 - this, in (0, 1] (the file stays opaque)."""
    glb_saturation: float = 1.0
    """GLB: point colours' saturation factor (0: grey, 1: as is, 2: twice as vivid)."""
    glb_brightness: float = 1.0
    """GLB: point colours multiplied by this (clipped to 255)."""
    glb_axes: GlbAxes = "gltf"
    """GLB: the scene's axes; gltf: the world as (x, -y, -z); reference: laid out as the reference's GLB export."""

    def style(self) -> GlbStyle:
        """These settings as the library's GlbStyle, which checks them; an error names the
        flag's field (``glb_opacity``), which the command turns into its flag."""
        try:
            return GlbStyle(
                points=self.glb_points, sphere_radius=self.glb_sphere_radius, max_spheres=self.glb_max_spheres,
                sphere_detail=self.glb_sphere_detail, trajectory_radius=self.glb_trajectory_radius,
                frustum_radius=self.glb_frustum_radius, opacity=self.glb_opacity,
                saturation=self.glb_saturation, brightness=self.glb_brightness, axes=self.glb_axes,
            )
        except ValueError as err:
            # GlbStyle's messages begin with its field's name: `opacity must be ...`.
            field, _, rest = str(err).partition(" ")
            raise ValueError(f"glb_{field} {rest}") from err


GlbFlags = Annotated[GlbStyleFlags, tyro.conf.arg(name="")]
"""A command's field of these flags, spelled without a group prefix (``--glb-opacity``)."""
