"""`mapstream run`: reconstruct a folder, video, webcam or the built-in demo."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import tyro

from ..export import ALL_FORMATS


@dataclass
class Run:
    """Turn frames into camera poses, depth and a point cloud, written in common formats.

    INPUT is an image folder, a video file, a glob ("frames/*.jpg"), a webcam index (0) or a
    stream URL. Without INPUT, --demo renders a short synthetic sequence and uses the official
    weights if they are cached, else the tiny untrained preset (with a warning).
    """

    input: tyro.conf.Positional[Optional[str]] = None
    out: Path = Path("runs/latest")
    """Output folder (created; an interrupted run there is resumed)."""
    demo: bool = False
    """Run on a built-in synthetic sequence (works offline)."""
    model: str = "robbyant/lingbot-map"
    """Checkpoint path, folder, Hugging Face repo id, or "tiny" (untrained, for tests)."""
    checkpoint_file: str = "lingbot-map-long.pt"
    """File inside the repo/folder given by --model."""
    mode: Literal["streaming", "windowed"] = "streaming"
    image_size: int = 518
    """Target width (crop mode); sides become multiples of 14."""
    preprocess: Literal["crop", "pad"] = "crop"
    fps: Optional[float] = 10.0
    """Video sampling rate (frames per second kept; None keeps every frame)."""
    stride: int = 1
    first_k: Optional[int] = None
    num_scale_frames: int = 8
    keyframe_interval: Optional[str] = None
    """Integer k (every k-th frame stored), "auto" (by image motion), or unset: ceil(N/320)
    for inputs of known length N, "auto" for live inputs."""
    window_size: int = 64
    overlap: int = 16
    device: str = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    backend: Literal["auto", "sdpa", "flashinfer", "triton"] = "auto"
    compile: bool = False
    """torch.compile the per-frame static parts (slow start, faster frames on GPUs)."""
    low_precision_heads: bool = False
    """Run the heads in --precision too (bf16/fp16) instead of fp32 as the reference does:
    0.5-1.0 ms a frame faster on an H200, outputs within bf16 rounding (docs/BENCHMARKS.md,
    2026-11-30 session 4)."""
    formats: tuple[str, ...] = ALL_FORMATS
    conf_threshold: float = 1.5
    voxel_size: Optional[float] = None
    sky_mask: bool = False
    """Segment the sky (ONNX model) and leave it out of the point cloud; masks are cached."""
    sky_model: Optional[str] = None
    """Sky-segmentation ONNX file (default: $MAPSTREAM_SKY_MODEL, else the hub's skyseg.onnx)."""
    no_resume: bool = False
    """Start over even if the output folder holds a finished part of this run."""
    quiet: bool = False

    def main(self) -> int:
        from ..pipeline import RunOptions, run

        interval = self.keyframe_interval
        if interval is not None and interval != "auto":
            try:
                interval = int(interval)
            except ValueError:
                raise ValueError(
                    f"--keyframe-interval takes an integer k (every k-th frame stored) or 'auto', got {interval!r}"
                ) from None
        opts = RunOptions(
            input=self.input, out=self.out, model=self.model, checkpoint_file=self.checkpoint_file, mode=self.mode,
            image_size=self.image_size, preprocess=self.preprocess, fps=self.fps, stride=self.stride,
            first_k=self.first_k, num_scale_frames=self.num_scale_frames, keyframe_interval=interval,
            window_size=self.window_size, overlap=self.overlap, device=self.device, precision=self.precision,
            backend=self.backend, formats=self.formats, conf_threshold=self.conf_threshold,
            voxel_size=self.voxel_size, resume=not self.no_resume, demo=self.demo,
            sky_mask=self.sky_mask, sky_model=self.sky_model, compile=self.compile,
            low_precision_heads=self.low_precision_heads,
        )
        summary = run(opts, progress=not self.quiet)
        for warning in summary.warnings:
            print(f"WARNING: {warning}")
        print(
            f"{summary.frames} frame{'' if summary.frames == 1 else 's'} ({summary.new_frames} new) at "
            f"{summary.fps:.2f} FPS with {summary.model}\n"
            f"outputs in {summary.out}: " + ", ".join(sorted(summary.outputs))
        )
        return 0
