"""Offline rendering of a run: a flythrough video of the reconstruction growing frame by
frame (`mapstream render RUN_DIR`). Needs PyAV (`pip install 'mapstream[video]'`)."""
from mapstream.render.flythrough import RenderOptions, render_flythrough
from mapstream.render.path import PATH_MODES, PathStyle, camera_path, smooth
from mapstream.geometry import look_at
from mapstream.render.raster import pinhole, sample_segments, splat
from mapstream.render.video import VideoWriter, check_video_path, even_size

__all__ = [
    "PATH_MODES", "PathStyle", "RenderOptions", "VideoWriter", "camera_path", "check_video_path", "even_size",
    "look_at", "pinhole", "render_flythrough", "sample_segments", "smooth", "splat",
]
