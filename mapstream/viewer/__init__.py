"""`mapstream view`: a browser viewer (viser) of a run's ``predictions.npz``.

    from mapstream.viewer import ViewerApp, load_run
    app = ViewerApp(load_run("out/")).start()     # serves http://127.0.0.1:8080

:class:`LiveView` (:mod:`mapstream.viewer.live`) shows a stream while it is reconstructed
(``mapstream run --view``). The scene logic (:mod:`mapstream.viewer.scene`) is plain numpy/torch
and importable without viser; :class:`ViewerApp` and :class:`ViewerOptions` (:mod:`mapstream.viewer.app`) import viser
when first used (``pip install 'mapstream[viewer]'``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mapstream.viewer.loading import load_run, predictions_path
from mapstream.viewer.scene import (
    DEFAULT_MAX_POINTS,
    VIEW_PRESETS,
    PointPool,
    SceneFraming,
    build_point_pool,
    scene_framing,
    select_points,
    view_preset,
    visible_cameras,
    visible_frames,
)

if TYPE_CHECKING:
    from mapstream.viewer.app import ViewerApp, ViewerOptions
    from mapstream.viewer.live import LiveOptions, LiveView

__all__ = [
    "DEFAULT_MAX_POINTS",
    "VIEW_PRESETS",
    "LiveOptions",
    "LiveView",
    "PointPool",
    "SceneFraming",
    "ViewerApp",
    "ViewerOptions",
    "build_point_pool",
    "load_run",
    "predictions_path",
    "scene_framing",
    "select_points",
    "view_preset",
    "visible_cameras",
    "visible_frames",
]


def __getattr__(name: str) -> Any:
    if name in ("ViewerApp", "ViewerOptions"):
        from mapstream.viewer import app

        return getattr(app, name)
    if name in ("LiveOptions", "LiveView"):
        from mapstream.viewer import live

        return getattr(live, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
