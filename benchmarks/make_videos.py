"""Synthetic MP4 videos for the many-input job: `mapstream.synthetic.render_sequence` scenes.

    python3 benchmarks/make_videos.py FOLDER [--videos 16] [--frames 200] [--size 504x378] \
        [--render-scale 0.5] [--workers N] [--seed 0]

Writes FOLDER/video_000.mp4 ... (H.264 through PyAV's libx264, yuv420p, 10 fps), video i from
seed `--seed + i` (a different room and camera path each). Prints and returns the files and
the seconds spent.

Cost: render_sequence is a CPU ray caster. Measured on one core of a shared 2-core machine:
0.53 s a frame at 504x378 (one 200-frame video: 1.8 minutes; 16 of them: 28 minutes on one
core), 0.076 s a frame at 252x189. By default each frame is therefore rendered at half the
width and height (`--render-scale 0.5`: 7 times less work) and enlarged to the requested size
with bilinear filtering before encoding; one 200-frame 504x378 video then takes 24 s, encoding
included. A throughput job needs frames of the right size with scene-like content, which the
enlarged frames are (the model sees them as it would a soft camera image); `--render-scale 1`
renders at full size. The videos render in parallel processes
(`--workers`, default one per CPU core up to the number of videos).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


def _size(text: str) -> tuple[int, int]:
    """"WxH" -> (width, height), both even (yuv420p halves the chroma planes)."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be WIDTHxHEIGHT, got {text!r}") from None
    if width < 2 or height < 2 or width % 2 or height % 2:
        raise argparse.ArgumentTypeError(f"width and height must be even and >= 2 (H.264 4:2:0), got {text!r}")
    return width, height


def render_frames(frames: int, width: int, height: int, seed: int, render_scale: float) -> np.ndarray:
    """[frames, height, width, 3] uint8: the scene of `seed` rendered at `render_scale` of the size, enlarged."""
    from PIL import Image

    from mapstream.synthetic import render_sequence

    low = (max(2, round(height * render_scale)), max(2, round(width * render_scale)))
    rgb = render_sequence(frames, low, seed=seed).rgb
    if low == (height, width):
        return rgb
    return np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.BILINEAR)) for f in rgb])


def write_video(path: Path, rgb: np.ndarray, fps: int = 10) -> Path:
    """Encode `rgb` [N, H, W, 3] uint8 as H.264 in an MP4 at `fps`."""
    import av

    tmp = path.with_name(path.name + ".part")
    with av.open(str(tmp), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = rgb.shape[2], rgb.shape[1], "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        for frame in rgb:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    tmp.replace(path)  # a half-written video never carries the final name
    return path


def _one(job: tuple[Path, int, int, int, int, float]) -> str:
    path, frames, width, height, seed, render_scale = job
    return str(write_video(path, render_frames(frames, width, height, seed, render_scale)))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--videos", type=int, default=16)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--size", type=_size, default=(504, 378), help="WIDTHxHEIGHT (default 504x378)")
    ap.add_argument("--render-scale", type=float, default=0.5,
                    help="render at this fraction of the size, then enlarge (1: full size; see the docstring)")
    ap.add_argument("--workers", type=int, default=0, help="parallel processes (default: CPU cores, at most --videos)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the first video; video i uses seed + i")
    args = ap.parse_args(argv)
    if args.videos < 1 or args.frames < 1:
        ap.error("--videos and --frames must be >= 1")
    if not 0 < args.render_scale <= 1:
        ap.error("--render-scale must be in (0, 1]")
    args.folder.mkdir(parents=True, exist_ok=True)
    width, height = args.size
    jobs = [(args.folder / f"video_{i:03d}.mp4", args.frames, width, height, args.seed + i, args.render_scale)
            for i in range(args.videos)]
    workers = min(args.videos, args.workers or os.cpu_count() or 1)
    started = time.perf_counter()
    if workers == 1:
        files = [_one(job) for job in jobs]
    else:
        with ProcessPoolExecutor(workers) as pool:
            files = list(pool.map(_one, jobs))
    result = {"files": files, "frames": args.frames, "size": [width, height], "render_scale": args.render_scale,
              "workers": workers, "seconds": time.perf_counter() - started}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
