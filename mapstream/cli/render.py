"""`mapstream render RUN_DIR`: a flythrough video of a run (see mapstream.render)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from ..export import DEFAULT_CONF_THRESHOLD
from ..viewer.scene import DEFAULT_MAX_POINTS
from ._flags import as_flags
from ._frames import frame_slice, select_frames
from .view import RunDir


@dataclass
class Render:
    """Render a run folder (the --out of `mapstream run`) as a video: the point cloud growing frame by frame, seen from a virtual camera."""

    run_dir: RunDir
    """Run folder holding predictions.npz (or the path of a predictions .npz file)."""
    out: Optional[Path] = None
    """Video file to write (default: RUN_DIR/flythrough.mp4)."""
    mode: Literal["follow", "birdeye", "static", "pivot"] = "follow"
    """follow: behind and above the camera; birdeye: high above it; static: the overview throughout; pivot: the overview turning about the scene centre (--turns)."""
    turns: float = 1.0
    """--mode pivot: turns about the scene centre over the run (negative: clockwise)."""
    path: Optional[Path] = None
    """Camera path file (.yaml, .yml or .json): segments of frames, each with its mode, blended into each other (replaces --mode; format in docs/RENDER.md)."""
    height: int = 720
    """Video height in pixels (the width keeps the frames' aspect)."""
    fps: float = 10.0
    """Video frames per second; one video frame per drawn frame."""
    frames: Optional[str] = None
    """Only these frames, as START:STOP[:STEP] (e.g. 0:100, 50:, ::2; numbered from 0)."""
    every: int = 1
    """Draw every k-th reconstructed frame (and the last): a shorter video of a long run."""
    conf_threshold: float = DEFAULT_CONF_THRESHOLD
    """Points with confidence above this are drawn (confidence is > 1)."""
    hide_sky: bool = True
    """Leave out sky points when the run has a sky mask."""
    max_points: int = DEFAULT_MAX_POINTS
    """Most points drawn; beyond, a seeded uniform subsample."""
    radius: int = 1
    """Each point covers (2 radius + 1)^2 pixels."""
    background: Literal["black", "white"] = "black"
    """Background colour."""
    inset: bool = True
    """Show the input frame in a corner."""
    edl_strength: float = 0.0
    """Eye-dome lighting: darken pixels behind depth edges, making the cloud's shape readable (0: off; try 1 to 10)."""
    edl_radius: int = 2
    """Eye-dome lighting: distance in pixels of the neighbours each pixel is compared with."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when there is a GPU)."""
    quiet: bool = False
    """No progress bar."""

    def main(self) -> int:
        from ..device import resolve_device
        from ..export.summary import weights_caption
        from ..render import RenderOptions, render_flythrough
        from ..render.flythrough import frames_drawn
        from ..render.path_file import load_path_file
        from ..render.video import check_video_path
        from ..viewer import load_run, predictions_path

        # Every option, and the path file, is checked before the run is read.
        segments = load_path_file(self.path) if self.path is not None else None
        try:
            options = RenderOptions(
                mode=self.mode, turns=self.turns, height=self.height, fps=self.fps, conf_threshold=self.conf_threshold,
                hide_sky=self.hide_sky, max_points=self.max_points, radius=self.radius, background=self.background,
                inset=self.inset, every=self.every, edl_strength=self.edl_strength, edl_radius=self.edl_radius,
                camera_segments=segments,
            )
        except ValueError as err:
            raise ValueError(as_flags(str(err), Render)) from err
        device = resolve_device(self.device)
        if self.frames is not None:
            frame_slice(self.frames)
        source = predictions_path(self.run_dir)
        out = check_video_path(self.out if self.out is not None else source.parent / "flythrough.mp4")
        # The run folder's records say which weights made the predictions; a copy of the .npz
        # under another name is not what they describe.
        caption = weights_caption(source.parent) if source.name == "predictions.npz" else None
        options = dataclasses.replace(options, caption=caption)
        recon = select_frames(load_run(self.run_dir), self.frames)
        path = render_flythrough(recon, out, options, device=device, progress=not self.quiet)
        note = f" with the caption {caption!r}" if caption else ""
        print(f"wrote {path} ({len(frames_drawn(len(recon), self.every))} frames at {self.fps:g} FPS){note}")
        return 0
