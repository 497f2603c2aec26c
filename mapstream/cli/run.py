"""`mapstream run`: reconstruct a folder, video, webcam or the built-in demo."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Optional

import tyro

from ..config import DEFAULT_CAMERA_ITERATIONS, StreamConfig
from ..export import ALL_FORMATS
from ..globalmap.config import MapConfig
from ..hub import DEFAULT_FILENAME, DEFAULT_REPO
from ..pipeline.options import RunOptions
from ._cloud import CloudFlags, PointCloudFlags
from ._fleet import FleetFlags
from ._flags import as_flags
from ._input import InputFlags


@dataclass(frozen=True)
class StreamFlags(StreamConfig):
    """`StreamConfig`'s fields as flags, checked when the run builds its `StreamConfig` from
    them (so that a bad value is told with its flag's name, as the run's other errors are)."""

    def __post_init__(self) -> None:
        pass

    def config(self) -> StreamConfig:
        return StreamConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(StreamConfig)})


@dataclass
class Run:
    """Turn frames into camera poses, depth and a point cloud, written in common formats.

    INPUT is an image folder, a video file, a glob ("frames/*.jpg"), a webcam index (0) or a
    stream URL. Without INPUT, --demo renders a short synthetic sequence. The official weights
    are used when they are cached or can be fetched (--demo: cached only), else mapstream's own
    small model (with a warning). Several
    inputs, a .txt file listing them, --many or --ray run one folder an input under --out.
    """

    ON_INTERRUPT: ClassVar[str] = "a run keeps the frames it finished and resumes from them when run again"

    input: Annotated[tyro.conf.Positional[tuple[str, ...]], tyro.conf.arg(metavar="[INPUT ...]")] = ()
    """Image folder, video file, glob, webcam index or stream URL (leave out with --demo); several: see --many."""
    out: Path = Path("runs/latest")
    """Output folder (created; an interrupted run there is resumed)."""
    demo: bool = False
    """Run on a built-in synthetic sequence (works offline; rendered 294 wide, whatever --image-size says)."""
    model: str = DEFAULT_REPO
    """Checkpoint path, folder, Hugging Face repo id (built as the preset its keys and shapes fit), "small" (mapstream's own shipped model) or "tiny" (untrained, for tests)."""
    checkpoint_file: str = DEFAULT_FILENAME
    """File inside the repo/folder given by --model."""
    mode: Literal["auto", "streaming", "windowed"] = "auto"
    """streaming: one cache over the whole input; windowed: overlapping windows joined by Sim(3) (docs/WINDOWED.md); auto: windows as long as the model's training clips when its weights record them (mapstream's own: 48 frames for the small model) and the input may be longer (unless --keyframe-interval is given), else streaming (docs/RUN.md)."""
    frames: Annotated[InputFlags, tyro.conf.OmitArgPrefixes] = field(default_factory=InputFlags)
    stream: Annotated[StreamFlags, tyro.conf.OmitArgPrefixes] = field(default_factory=StreamFlags)
    """The stream's settings (mapstream.StreamConfig): scale frames, what the cache keeps, keyframes,
    precision, attention backend, CUDA graphs, windows."""
    camera_iterations: int = DEFAULT_CAMERA_ITERATIONS
    """Refinement passes of the camera head (1 is faster and keeps a 4x smaller camera cache)."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (the first CUDA GPU when there is one, else the CPU)."""
    compile: bool = False
    """Build the model with torch.compile'd per-frame static parts (slow start, faster frames on GPUs)."""
    low_precision_heads: bool = False
    """Heads in --precision too, not fp32 as the reference: faster on GPUs, within that precision's rounding."""
    trunk_weights: Literal["auto", "int8", "fp8"] = RunOptions.trunk_weights
    """The trunk's linear weights (torchao): auto (in --precision); int8 (weight-only, half the bytes of bf16's); fp8 (e4m3 weights and activations on FP8 tensor cores: GPUs of compute capability 8.9 and up) (docs/RUN.md)."""
    gpu_memory: Optional[str] = RunOptions.gpu_memory
    """A GPU memory budget such as 8GB: the cache's storage (FP8), the sliding window and last the heads' precision are chosen to fit it, the choice is logged and recorded in run.json, and a budget nothing fits is refused (docs/RUN.md)."""
    formats: tuple[str, ...] = ALL_FORMATS
    """Outputs to write (default: all of them)."""
    loop_closure: bool = RunOptions.loop_closure
    """Build a global map beside the stream: loops found and closed in a pose graph, every output corrected (docs/MAP.md)."""
    known_poses: Optional[Path] = RunOptions.known_poses
    """With --loop-closure: a TUM trajectory of poses known for some frames (GPS, ARKit...), matched by timestamp: the map takes their frame and metric scale."""
    intrinsics: Optional[str] = RunOptions.intrinsics
    """The camera's known intrinsics, used in place of the network's for every output: fx,fy,cx,cy (pixels of the images as they are on disk, OpenCV's convention), a COLMAP cameras.txt or a transforms.json."""
    map: MapConfig = field(default_factory=MapConfig)
    """The global map's settings, read with --loop-closure (docs/MAP.md)."""
    cloud: CloudFlags = field(default_factory=PointCloudFlags)
    sky_mask: bool = False
    """Segment the sky (ONNX model) and leave it out of the point cloud; masks are cached."""
    sky_model: Optional[str] = None
    """Sky-segmentation ONNX file (default: $MAPSTREAM_SKY_MODEL, else the hub's skyseg.onnx)."""
    view: bool = False
    """Watch the reconstruction grow in a browser while the run streams (viser; see --view-port)."""
    view_port: int = 8080
    """Port of the live view (the next free one is taken if it is busy)."""
    view_host: str = "127.0.0.1"
    """Address of this machine the live view listens on; 0.0.0.0 makes it reachable from other machines."""
    view_allow_origin: tuple[str, ...] = ()
    """With --view: further web origins (http://HOST:PORT) whose pages may connect, e.g. a tunnel's local address."""
    keep_view: bool = True
    """With --view: keep serving after the run ends, until Ctrl-C (--no-keep-view: stop with the run)."""
    resume: bool = True
    """Continue an interrupted run found in --out, keeping its finished frames (the stream restarts on the last of them, aligned by Sim(3): later frames differ from an uninterrupted run's); --no-resume starts over."""
    quiet: bool = False
    """No progress bar."""
    fleet: Annotated[FleetFlags, tyro.conf.OmitArgPrefixes] = field(default_factory=FleetFlags)

    def main(self) -> int:
        from ..pipeline import RunOptions, check_input, check_options, run

        try:
            stream = self.stream.config()
        except ValueError as err:
            raise ValueError(as_flags(str(err), Run)) from err
        many = self.fleet.wanted(self.input)  # several inputs always are
        opts = RunOptions(
            input=None if many or not self.input else self.input[0],
            out=self.out, model=self.model, checkpoint_file=self.checkpoint_file, mode=self.mode,
            **self.frames.options(), stream=stream, camera_iterations=self.camera_iterations,
            device=self.device, formats=self.formats,
            conf_threshold=self.cloud.conf_threshold, conf_percentile=self.cloud.conf_percentile,
            voxel_size=self.cloud.voxel_size, drop_black_background=self.cloud.drop_black_background,
            drop_white_background=self.cloud.drop_white_background, max_points=self.cloud.max_points,
            resume=self.resume, demo=self.demo, sky_mask=self.sky_mask, sky_model=self.sky_model,
            compile=self.compile, low_precision_heads=self.low_precision_heads, gpu_memory=self.gpu_memory,
            trunk_weights=self.trunk_weights,
            loop_closure=self.loop_closure, map=self.map, known_poses=self.known_poses,
            intrinsics=self.intrinsics,
        )
        if many:
            return self._run_many(opts)
        try:
            if self.view:  # the run's options and input first: no server for a run that cannot start
                check_options(opts)
                check_input(opts)
            view = self._start_view()
        except ValueError as err:
            raise ValueError(as_flags(str(err), Run)) from err
        try:
            try:
                summary = run(opts, progress=not self.quiet, on_frame=None if view is None else view.add,
                              on_model=None if view is None else _tell_view(view),
                              on_map=view.show_map if view is not None and self.loop_closure else None)
            except ValueError as err:
                raise ValueError(as_flags(str(err), Run)) from err
            print_run_summary(summary)
            if view is not None and self.keep_view:
                print(f"the live view stays at {view.url} (every control: mapstream view {summary.out}); press Ctrl-C to stop")
                view.wait()
        except BaseException:
            if view is not None:
                view.stop(drain=False)  # an interrupted run: no waiting for the view's backlog
            raise
        if view is not None:
            view.stop()
        return 0

    def _run_many(self, opts) -> int:
        """Every input into its own folder under --out; the job's table at the end. Exit
        status 1 when an input failed."""
        from ..fleet import run_many
        from ._fleet import format_job

        if self.view or self.demo:
            raise ValueError("--view and --demo take one input; leave them out to run many")
        try:
            summary = run_many(self.input, opts, job=self.fleet.job_options(), progress=not self.quiet)
        except ValueError as err:
            raise ValueError(as_flags(str(err), Run)) from err
        print(format_job(summary))
        print(f"the job's summary: {summary.out / 'job.json'}")
        return 1 if summary.failed else 0

    def _start_view(self):
        """The live view, serving, when --view is given (else None)."""
        if not self.view:
            return None
        from ..pipeline.model_source import known_fallback
        from ..viewer.live import LiveOptions, LiveView
        from ..viewer.run_notes import UNTRAINED_NOTE
        from ..weights import SMALL_WARNING

        if not 0 <= self.view_port <= 65535:
            raise ValueError(f"--view-port must be in 0..65535 (0: any free port), got {self.view_port}")
        fallback = known_fallback(self.model, filename=self.checkpoint_file, demo=self.demo)
        notice = {"tiny": UNTRAINED_NOTE, "small": SMALL_WARNING}.get(fallback or "")
        view = LiveView(
            LiveOptions(conf_threshold=self.cloud.conf_threshold), host=self.view_host, port=self.view_port,
            title=f"mapstream run: {self.input or 'demo'}", allowed_origins=self.view_allow_origin,
            notices=[notice] if notice else [],
        ).start()
        print(f"live view at {view.url}")
        return view


def _tell_view(view):
    """What a live view is told once the model is open: that the run fell back to mapstream's
    small model, when that was learned only on loading it (the official checkpoint out of reach)."""
    from ..weights import SMALL_WARNING

    def on_model(description: str, warnings: list[str]) -> None:
        if SMALL_WARNING in warnings:
            view.add_notice(SMALL_WARNING)

    return on_model


def print_run_summary(summary, where: str = "") -> None:
    """A finished run's warnings, frames, speed and outputs; `where`: the server that predicted them."""
    for warning in summary.warnings:
        print(f"WARNING: {warning}")
    frames = f"{summary.frames} frame{'' if summary.frames == 1 else 's'}"
    if summary.new_frames:
        done = f"{frames} ({summary.new_frames} new) at {summary.fps:.2f} FPS"
    else:  # a rerun of a finished run: no frame ran, so there is no speed to tell
        done = f"{frames}, none new: an earlier run in this folder finished every frame; outputs written again"
    print(
        f"{done} with {summary.model}{f' on {where}' if where else ''}\n"
        f"outputs in {summary.out}: " + ", ".join(sorted(summary.outputs))
    )
