"""The viewer's "Export" actions, apart from the GUI: the shown scene as GLB, a render as PNG
(the "Video" folder's recording is :mod:`mapstream.viewer.recording`).

Both write atomically (a temp file in the destination folder, then a rename), so a failed
write leaves any earlier file at the path as it was. They raise on failure; the viewer turns
the error into a status line (:mod:`mapstream.viewer.app`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mapstream.export import GlbStyle, PointSet, Reconstruction
from mapstream.io.atomic import atomic_path
from mapstream.viewer.scene import PointPool

__all__ = ["RENDER_TIMEOUT_S", "canvas_size", "export_shown_glb", "first_client", "render_size", "save_render"]

RENDER_TIMEOUT_S = 30.0
"""Longest wait for a browser's render: a tab in the background may never draw a frame."""

FALLBACK_RENDER_HW = (720, 1280)
"""Render size when the browser has not reported its canvas size yet."""


def export_shown_glb(
    recon: Reconstruction,
    pool: PointPool,
    point_index: np.ndarray,
    cameras: np.ndarray,
    path: str | os.PathLike[str],
    *,
    trajectory: bool = True,
    style: GlbStyle = GlbStyle(),
    frustum_depth: float | None = None,
) -> Path:
    """Write the pool's points at ``point_index``, the frustums of the frames where ``cameras``
    ([N] bool) is True and (``trajectory``) the camera path as a GLB scene, drawn as ``style``
    says, the frustums ``frustum_depth`` deep (world units; None: the file's default size; see
    :func:`mapstream.export.glb.write_glb` for its axes and layout).

    Raises:
        ValueError: there is nothing to write (a GLB scene cannot be empty).
        OSError: the file cannot be written.
    """
    from mapstream.export.glb import write_glb

    if len(point_index) == 0 and not np.any(cameras) and not (trajectory and len(recon) > 1):
        raise ValueError("nothing is shown: no point, camera or trajectory to export")
    points = PointSet(pool.xyz[point_index], pool.rgb[point_index], pool.conf[point_index], pool.frame[point_index])
    return write_glb(
        recon, Path(path), points=points, cameras=np.flatnonzero(cameras), trajectory=trajectory, style=style,
        frustum_depth=frustum_depth,
    )


def first_client(server: Any) -> Any | None:
    """The connected browser that connected first (lowest id), or None."""
    clients = server.get_clients()
    return clients[min(clients)] if clients else None


def canvas_size(client: Any) -> tuple[int, int]:
    """(height, width) of ``client``'s canvas in pixels, or :data:`FALLBACK_RENDER_HW` while the
    browser has not reported it yet."""
    height, width = int(client.camera.image_height), int(client.camera.image_width)
    return (height, width) if height > 0 and width > 0 else FALLBACK_RENDER_HW


def render_size(client: Any, height: int | None) -> tuple[int, int]:
    """(height, width) of a render ``height`` pixels tall with the aspect of ``client``'s canvas;
    None: the canvas's own size (:func:`canvas_size`)."""
    canvas_h, canvas_w = canvas_size(client)
    if height is None:
        return canvas_h, canvas_w
    return height, max(1, round(height * canvas_w / canvas_h))


def save_render(
    client: Any, path: str | os.PathLike[str], *, height: int | None = None, timeout: float = RENDER_TIMEOUT_S
) -> Path:
    """Ask ``client`` (a viser ClientHandle) to render its current view, at its canvas size or
    ``height`` pixels tall with the canvas's aspect, and write it losslessly as an RGBA PNG (the
    page background is transparent).

    Raises:
        TimeoutError: the browser sent no frame within ``timeout`` seconds.
        OSError: the file cannot be written.
    """
    from PIL import Image

    height, width = render_size(client, height)
    image = np.asarray(client.get_render(height, width, transport_format="png", timeout=timeout))
    path = Path(path)
    with atomic_path(path) as tmp:
        Image.fromarray(image).save(tmp, format="PNG")
    return path

