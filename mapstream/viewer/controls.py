"""The viewer's options and its control panel: :class:`ViewerOptions`, :class:`ViewerHandles`
and :func:`add_controls`, which lays out the GUI folders, and :func:`glb_style`, the "Export"
folder's GLB settings as a :class:`~mapstream.export.GlbStyle`. What the controls do is wired
up by :class:`mapstream.viewer.app.ViewerApp`; nothing here imports viser (``gui`` is its GUI API).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np

from mapstream.export.glb_style import SPHERE_RADIUS_FRACTION, GlbStyle
from mapstream.export.points import DEFAULT_CONF_THRESHOLD
from mapstream.viewer.scene import DEFAULT_MAX_POINTS, FrameMode

__all__ = [
    "DOWNSAMPLE_CHOICES",
    "FRUSTUM_TUBE_FRACTION",
    "GO_TO",
    "LOOK_AT_CENTRE",
    "LOOK_FROM",
    "MAX_CAMERA_EVERY",
    "MAX_VIDEO_FPS",
    "RECORD_LABEL",
    "STOP_RECORDING_LABEL",
    "TRAJECTORY_TUBE_FRACTION",
    "VIDEO_HEIGHTS",
    "ViewerHandles",
    "ViewerOptions",
    "add_controls",
    "glb_style",
    "notice_markdown",
]

DOWNSAMPLE_CHOICES: tuple[str, ...] = ("1", "2", "4", "8", "16", "32")
"""Values of the "keep 1 point in" control."""
LOOK_FROM: tuple[str, ...] = ("front", "back", "left", "right", "top")
LOOK_AT_CENTRE = "look at centre"
"""The "go to" button that turns each browser's camera, where it stands, to the scene centre."""
GO_TO: tuple[str, ...] = ("overview", LOOK_AT_CENTRE, "first camera", "current camera")
"""The "View" folder's two rows of buttons: :data:`mapstream.viewer.scene.VIEW_PRESETS` and
:data:`LOOK_AT_CENTRE`."""
MAX_CAMERA_EVERY = 50
"""Largest value of the "show 1 camera in" slider."""
VIDEO_HEIGHTS: dict[str, int] = {"720p": 720, "1080p": 1080, "4K": 2160}
"""The "resolution" choices of the "Video" folder: video heights in pixels (the width follows
the browser canvas's aspect)."""
SCREENSHOT_SIZES: dict[str, int | None] = {"canvas": None, **VIDEO_HEIGHTS}
"""The "screenshot size" choices: the browser canvas's own size, or a height in pixels with its
aspect (the reference viewer's resolution presets)."""
MAX_VIDEO_FPS = 60
"""Largest value of the "video fps" slider."""
VIEW_STEP_S = 0.03
"""Seconds between the steps of a camera's glide to a chosen view (`ViewerOptions.view_steps`)."""
RECORD_LABEL, STOP_RECORDING_LABEL = "record video", "stop recording"
"""The two labels of the "Video" folder's button: idle, and while a recording runs."""
TRAJECTORY_TUBE_FRACTION, FRUSTUM_TUBE_FRACTION = 0.001, 0.0005
"""Radii of the GLB's tubes ("tubes" checked) as fractions of the scene extent: the trajectory
as thick as the page draws it, the frustum edges half that (a frustum is 4 % of the extent deep)."""


@dataclass
class ViewerOptions:
    """Initial values of the viewer's controls and its fixed limits."""

    conf_threshold: float = DEFAULT_CONF_THRESHOLD
    """Show points whose confidence is strictly greater than this (confidence is > 1)."""
    max_points: int = DEFAULT_MAX_POINTS
    """Most points ever held and shown (seeded uniform subsample beyond)."""
    point_size: float | None = None
    """Point size in world units; None = the median pixel footprint (:class:`SceneFraming`)."""
    downsample: int = 1
    """Initially keep one point in this many (one of 1, 2, 4, ... 32)."""
    frame_mode: FrameMode = "up to t"
    """Initial scrubber mode: frames up to t, only frame t, or all frames."""
    hide_sky: bool = True
    """Initially hide points under the sky mask (when the run has one), as the reference's
    viewer does with sky masking on."""
    play_fps: float = 8.0
    """Frames per second of the "play" button."""
    thumbnail_size: int = 160
    """Longest side in pixels of the image shown in each camera frustum."""
    frame_image_size: int = 320
    """Longest side in pixels of frame t in the "Frame image" panel."""
    show_frame_image: bool = True
    """Initially show the "Frame image" panel."""
    seed: int = 0
    """Seed of the subsample and of the downsample order."""
    video_height: int = 1080
    """Initial height in pixels of a recorded video (one of :data:`VIDEO_HEIGHTS`)."""
    view_steps: int = 15
    """Steps of a camera's glide to a chosen view, 30 ms each (the reference's 15); 1 jumps there."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the option when a value has no control to match it."""
        if str(self.downsample) not in DOWNSAMPLE_CHOICES:
            raise ValueError(f"downsample must be one of {', '.join(DOWNSAMPLE_CHOICES)}, got {self.downsample}")
        if self.frame_mode not in get_args(FrameMode):
            raise ValueError(f"frame_mode must be one of {get_args(FrameMode)}, got {self.frame_mode!r}")
        if not math.isfinite(self.conf_threshold):
            raise ValueError(f"conf_threshold must be a number (confidence is > 1), got {self.conf_threshold}")
        size = self.point_size
        if size is not None and not 0 < size < math.inf:
            raise ValueError(f"point_size must be > 0 (world units), or unset for the pixel footprint; got {size}")
        if self.frame_image_size < 1:
            raise ValueError(f"frame_image_size must be >= 1 (pixels), got {self.frame_image_size}")
        if self.video_height not in VIDEO_HEIGHTS.values():
            heights = ", ".join(str(h) for h in VIDEO_HEIGHTS.values())
            raise ValueError(f"video_height must be one of {heights} (pixels), got {self.video_height}")
        if self.view_steps < 1:
            raise ValueError(f"view_steps must be >= 1 (1: jump to a chosen view), got {self.view_steps}")


@dataclass
class ViewerHandles:
    """viser handles owned by a running :class:`~mapstream.viewer.app.ViewerApp` (GUI controls
    and scene nodes)."""

    frame: Any
    frame_mode: Any
    play: Any
    fps: Any
    conf_threshold: Any
    point_size: Any
    downsample: Any
    hide_sky: Any | None
    show_cameras: Any
    reset_view: Any
    status: Any
    step: Any
    camera_size: Any
    camera_every: Any
    look_from: Any
    go_to: Any
    show_frame_image: Any
    frame_image: Any
    glb_path: Any
    glb_points: Any
    glb_sphere_radius: Any
    glb_tubes: Any
    glb_opacity: Any
    glb_saturation: Any
    glb_brightness: Any
    glb_axes: Any
    export_glb: Any
    png_path: Any
    screenshot_size: Any
    screenshot: Any
    video_path: Any
    video_height: Any
    video_fps: Any
    video_originals: Any
    record_video: Any
    notice: Any | None = None
    point_clouds: list[Any] = field(default_factory=list)
    frustums: list[Any] = field(default_factory=list)
    trajectory: Any | None = None


def add_controls(
    gui: Any,
    options: ViewerOptions,
    *,
    num_frames: int,
    conf_max: float,
    point_size: float,
    has_sky_mask: bool,
    frame_image: np.ndarray,
    glb_path: str,
    png_path: str,
    video_path: str,
    notices: Sequence[str] = (),
) -> ViewerHandles:
    """Add the notices (if any), the status line and the folders Frames, Frame image, Points,
    Cameras, View, Export and Video to ``gui`` (a viser GUI API) with their initial values;
    returns their handles (no scene node yet). ``conf_max`` and ``point_size`` set the ranges
    of the threshold and size sliders, ``frame_image`` is the panel's first image, the paths
    the Export and Video folders' initial fields."""
    n = num_frames
    notice = gui.add_markdown(notice_markdown(notices)) if notices else None
    status = gui.add_markdown("")
    with gui.add_folder("Frames"):
        frame = gui.add_slider("frame", min=0, max=max(n - 1, 1), step=1, initial_value=n - 1, disabled=n == 1)
        frame_mode = gui.add_dropdown("show", get_args(FrameMode), initial_value=options.frame_mode)
        step = gui.add_button_group("step", ("prev", "next"), disabled=n == 1)
        play = gui.add_checkbox("play", False, disabled=n == 1)
        fps = gui.add_slider("fps", min=1, max=30, step=1, initial_value=int(round(options.play_fps)))
    with gui.add_folder("Frame image"):
        show_frame_image = gui.add_checkbox("show", options.show_frame_image)
        image = gui.add_image(frame_image, visible=options.show_frame_image)
    with gui.add_folder("Points"):
        conf_threshold = gui.add_slider(
            "confidence >", min=1.0, max=conf_max, step=(conf_max - 1.0) / 200,
            initial_value=max(options.conf_threshold, 1.0),
        )
        size = gui.add_slider(
            "point size", min=point_size / 10, max=point_size * 10, step=point_size / 20, initial_value=point_size
        )
        downsample = gui.add_dropdown("keep 1 in", DOWNSAMPLE_CHOICES, initial_value=str(options.downsample))
        hide_sky = gui.add_checkbox("hide sky", options.hide_sky) if has_sky_mask else None
    with gui.add_folder("Cameras"):
        show_cameras = gui.add_checkbox("show cameras", True)
        camera_size = gui.add_slider("camera size", min=0.1, max=10.0, step=0.1, initial_value=1.0)
        camera_every = gui.add_slider("show 1 camera in", min=1, max=MAX_CAMERA_EVERY, step=1, initial_value=1)
    with gui.add_folder("View"):
        look_from = gui.add_button_group("look from", LOOK_FROM)
        go_to = gui.add_button_group("go to", GO_TO)
        reset_view = gui.add_button("reset view")
    with gui.add_folder("Export"):
        glb = gui.add_text("GLB path", glb_path)
        glb_points = gui.add_dropdown(
            "GLB points", ("points", "spheres"), initial_value="points",
            hint="spheres: meshes seen at their true size in any glTF viewer (at most 200,000, sampled)",
        )
        glb_sphere_radius = gui.add_slider(
            "sphere radius %", min=0.01, max=2.0, step=0.01, initial_value=100 * SPHERE_RADIUS_FRACTION,
            hint="of the scene extent",
        )
        glb_tubes = gui.add_checkbox("tubes", False, hint="the trajectory and the frustum edges as tubes, not lines")
        glb_opacity = gui.add_slider("opacity", min=0.05, max=1.0, step=0.05, initial_value=1.0,
                                     hint="point colours blended toward white (the file stays opaque)")
        glb_saturation = gui.add_slider("saturation", min=0.0, max=3.0, step=0.05, initial_value=1.0)
        glb_brightness = gui.add_slider("brightness", min=0.0, max=3.0, step=0.05, initial_value=1.0)
        glb_axes = gui.add_dropdown(
            "GLB axes", ("gltf", "reference"), initial_value="gltf",
            hint="gltf: the world as (x, -y, -z); reference: laid out as the reference viewer's export",
        )
        export_glb = gui.add_button("export GLB", hint="the points, cameras and trajectory shown now")
        png = gui.add_text("PNG path", png_path)
        screenshot_size = gui.add_dropdown("screenshot size", tuple(SCREENSHOT_SIZES), initial_value="canvas")
        screenshot = gui.add_button("screenshot", hint="the view of the first browser that connected")
    with gui.add_folder("Video"):
        video = gui.add_text("video path", video_path)
        resolution = next(name for name, height in VIDEO_HEIGHTS.items() if height == options.video_height)
        video_height = gui.add_dropdown("resolution", tuple(VIDEO_HEIGHTS), initial_value=resolution)
        video_fps = gui.add_slider(
            "video fps", min=1, max=MAX_VIDEO_FPS, step=1,
            initial_value=min(max(int(round(options.play_fps)), 1), MAX_VIDEO_FPS),
        )
        video_originals = gui.add_checkbox(
            "also the input frames", False, hint="a second video, NAME_original.mp4, of the frames as they went in"
        )
        record_video = gui.add_button(
            RECORD_LABEL, hint='frames 0 to last as "show" draws them, in the view of the first browser that connected'
        )
    return ViewerHandles(
        frame=frame, frame_mode=frame_mode, play=play, fps=fps, conf_threshold=conf_threshold,
        point_size=size, downsample=downsample, hide_sky=hide_sky, show_cameras=show_cameras,
        reset_view=reset_view, status=status, step=step, camera_size=camera_size,
        camera_every=camera_every, look_from=look_from, go_to=go_to, show_frame_image=show_frame_image,
        frame_image=image, glb_path=glb, glb_points=glb_points, glb_sphere_radius=glb_sphere_radius,
        glb_tubes=glb_tubes, glb_opacity=glb_opacity, glb_saturation=glb_saturation,
        glb_brightness=glb_brightness, glb_axes=glb_axes, export_glb=export_glb, png_path=png,
        screenshot_size=screenshot_size,
        screenshot=screenshot,
        video_path=video, video_height=video_height, video_fps=video_fps, video_originals=video_originals,
        record_video=record_video, notice=notice,
    )


def notice_markdown(notices: Sequence[str]) -> str:
    """``notices`` as the panel's first lines: each a bold warning of its own, above everything
    else, as they change what the scene below means."""
    return "\n\n".join(f"**⚠ {text}**" for text in notices)


def glb_style(handles: ViewerHandles, extent: float) -> GlbStyle:
    """The "Export" folder's GLB settings as a style; ``extent`` (world units) turns the
    relative sphere and tube sizes into radii.

    Raises:
        ValueError: a control holds a value the style refuses (a slider edited out of range).
    """
    tubes = bool(handles.glb_tubes.value)
    return GlbStyle(
        points=handles.glb_points.value,
        sphere_radius=float(handles.glb_sphere_radius.value) / 100 * extent,
        trajectory_radius=TRAJECTORY_TUBE_FRACTION * extent if tubes else None,
        frustum_radius=FRUSTUM_TUBE_FRACTION * extent if tubes else None,
        opacity=float(handles.glb_opacity.value),
        saturation=float(handles.glb_saturation.value),
        brightness=float(handles.glb_brightness.value),
        axes=handles.glb_axes.value,
    )
