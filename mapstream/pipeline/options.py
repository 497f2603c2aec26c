"""What a run reads (`RunOptions`): its input, its output folder, the model, the stream's
settings and the exports. `mapstream run` fills it from its flags; `run` checks it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config import DEFAULT_CAMERA_ITERATIONS, StreamConfig
from ..export import ALL_FORMATS, DEFAULT_CONF_THRESHOLD
from ..globalmap.config import MapConfig
from ..hub import DEFAULT_FILENAME, DEFAULT_REPO

__all__ = ["RunOptions", "recorded_options"]


@dataclass
class RunOptions:
    input: str | None
    out: Path
    model: str = DEFAULT_REPO
    checkpoint_file: str = DEFAULT_FILENAME
    mode: str = "auto"  # "auto", "streaming" or "windowed" (`mapstream.pipeline.stream_plan`)
    image_size: int | None = None  # frame width; None: the model's own (`mapstream.checkpoint.model_image_size`)
    preprocess: str = "crop"
    rotate: int = 0  # degrees clockwise, applied to every frame before preprocessing
    fps: float | None = 10.0
    stride: int = 1
    first_k: int | None = None
    stream: StreamConfig = field(default_factory=StreamConfig)  # the stream's settings (scale, cache, windows...)
    camera_iterations: int = DEFAULT_CAMERA_ITERATIONS  # the camera head's refinement passes
    device: str = "auto"
    formats: tuple[str, ...] = ALL_FORMATS
    conf_threshold: float = DEFAULT_CONF_THRESHOLD
    conf_percentile: float | None = None  # also keep only pixels above this percentile of confidence
    max_points: int | None = 2_000_000  # point cloud: a seeded subsample of at most this many (None: all)
    voxel_size: float | None = None
    drop_black_background: bool = False  # point cloud: leave out near-black pixels
    drop_white_background: bool = False  # point cloud: leave out near-white pixels
    resume: bool = True
    demo: bool = False
    demo_frames: int = 24
    sky_mask: bool = False
    sky_model: str | None = None
    compile: bool = False  # build the model with torch.compile'd static parts
    low_precision_heads: bool = False  # heads in the stream's precision too (default: fp32, as the reference)
    trunk_weights: str = "auto"  # the trunk's linear weights: "auto" (its precision), "int8" or "fp8" (torchao)
    gpu_memory: str | None = None  # a GPU memory budget ("8GB"): the cache's storage, window and heads fitted to it
    loop_closure: bool = False  # a global map beside the stream: loops closed, every output corrected (docs/MAP.md)
    map: MapConfig = field(default_factory=MapConfig)  # the global map's settings (read with loop_closure)
    known_poses: Path | None = None  # TUM trajectory of poses known for some frames: priors in the map
    intrinsics: str | None = None  # the camera's known intrinsics: fx,fy,cx,cy, a cameras.txt or a transforms.json


def recorded_options(opts: RunOptions) -> dict[str, str]:
    """A run's options as run.json records them (each as text; the stream's settings among
    them, the global map's only when loop closure is on): what a rerun compares to know the
    same run finished before."""
    options = {**asdict(opts), **asdict(opts.stream)}
    options.pop("stream")
    if not opts.loop_closure:
        options["map"] = None
    return {k: str(v) for k, v in options.items()}
