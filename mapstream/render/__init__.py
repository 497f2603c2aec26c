"""Offline rendering of a run: a flythrough video of the reconstruction growing frame by
frame (`mapstream render RUN_DIR`). Needs PyAV (`pip install 'mapstream[video]'`)."""
from mapstream.render.flythrough import RenderOptions, render_flythrough
from mapstream.render.edl import eye_dome_lighting, eye_dome_obscurance, eye_dome_shade
from mapstream.render.path import (
    PATH_MODES, PathSegment, PathStyle, SegmentedPath, camera_path, pivot_eyes, segmented_camera_path, smooth,
    transition_weights,
)
from mapstream.render.path_file import load_path_file, parse_segmented_path
from mapstream.geometry import look_at
from mapstream.render.raster import pinhole, sample_segments, splat
from mapstream.render.video import VideoWriter, check_video_path, even_size

__all__ = [
    "PATH_MODES", "PathSegment", "PathStyle", "RenderOptions", "SegmentedPath", "VideoWriter", "camera_path",
    "check_video_path", "even_size", "eye_dome_lighting", "eye_dome_obscurance", "eye_dome_shade", "load_path_file",
    "look_at", "parse_segmented_path", "pinhole", "pivot_eyes", "render_flythrough", "sample_segments",
    "segmented_camera_path", "smooth", "splat", "transition_weights",
]
