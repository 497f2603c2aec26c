"""The main job: frames in (folder, video, webcam, demo), every output format out.

`run` reads as its four steps: prepare (the model, the session and the run's folder, with the
frames an earlier run finished), stream (`run_stream`: frames fed one at a time, each stored
as it is finished, so that host and GPU memory stay bounded on long videos and an
interrupted run keeps its frames), export (every format from the stored frames) and record
(run.json, written last by the `RunFolder`, which also removes what earlier runs there wrote
and this one does not write again).
"""
from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import DEFAULT_IMAGE_SIZE, model_image_size, model_trained_views
from ..config import StreamConfig
from ..device import resolve_device
from ..export import CloudOptions, check_formats, export_all, runtime_versions
from ..export.reconstruction import Reconstruction
from ..globalmap import GlobalMap, MapConfig
from ..gpu_memory import MemoryPlan, parse_memory
from ..io.intrinsics import read_intrinsics
from ..layers.quantized import TRUNK_WEIGHTS
from ..session import FramePrediction, Session, resolve_precision
from ..windowed import WindowedSession
from .frame_store import FrameStore
from .loop_closure import MapRun, corrected_reconstruction, known_poses_of
from .memory_budget import fit_to_budget, held_to_budget, memory_record
from .model_source import prepare_for_inference, resolve_model
from .options import RunOptions, recorded_options
from .run_folder import RunFolder
from .run_input import check_input_apart_from_outputs, frame_width, input_files, input_key, open_input
from .run_stream import Streamed, stream_frames
from .stream_plan import StreamPlan, check_mode, plan_stream

__all__ = ["OpenedSession", "RunOptions", "RunSummary", "check_input", "check_options", "run"]

log = logging.getLogger(__name__)

# Run settings that older run folders did not record, with the value those runs used.
_RECORDED_LATER = {
    "rotate": 0, "overlap_keyframes": None, "cache_scale_frames": 8, "sliding_window": 64, "trajectory_capacity": 1024,
    "camera_iterations": 4, "intrinsics": None, "kv_dtype": "auto", "trunk_weights": "auto",
}
# Windowed settings that older run folders did not record, with the value their windowed runs
# used (None for a run that streamed): shared frames came from the earlier window, and windows
# were joined on their last shared stored frame.
_WINDOWED_RECORDED_LATER = {"shared_from": "earlier", "window_join": "anchor"}


@dataclass
class RunSummary:
    frames: int
    new_frames: int
    fps: float
    out: Path
    outputs: dict[str, Path] = field(default_factory=dict)
    model: str = ""
    warnings: list[str] = field(default_factory=list)


def check_options(opts: RunOptions) -> None:
    """Check ``opts`` before any heavy work (`run` does it first): among them those that would
    otherwise fail only once every frame has been processed. Raises ValueError."""
    check_formats(opts.formats)
    CloudOptions(  # its own errors for the point cloud's settings
        conf_threshold=opts.conf_threshold, conf_percentile=opts.conf_percentile, voxel_size=opts.voxel_size,
        max_points=opts.max_points,
    )
    if opts.fps is not None:
        from ..io.video import sample_interval

        sample_interval(None, opts.fps)  # its own error for a rate that keeps no frame
    if not isinstance(opts.map, MapConfig):
        raise TypeError(f"RunOptions.map must be a MapConfig, got {type(opts.map).__name__}")
    if opts.known_poses is not None and not opts.loop_closure:
        raise ValueError("known poses are priors in the global map: add --loop-closure to use --known-poses")
    if opts.intrinsics is not None:
        read_intrinsics(opts.intrinsics)  # its own error for a value or file it cannot read
    if not isinstance(opts.stream, StreamConfig):
        raise TypeError(f"RunOptions.stream must be a StreamConfig, got {type(opts.stream).__name__}")
    if opts.gpu_memory is not None:
        parse_memory(opts.gpu_memory)  # its own error for what is not an amount
    if opts.trunk_weights not in TRUNK_WEIGHTS:
        raise ValueError(f"trunk_weights must be one of {', '.join(TRUNK_WEIGHTS)}, got {opts.trunk_weights!r}")
    if opts.camera_iterations < 1:
        raise ValueError(f"camera_iterations must be >= 1, got {opts.camera_iterations}")
    if opts.demo and opts.input is not None:
        raise ValueError(f"--demo renders its own frames and reads no input: give the input {opts.input} or --demo, "
                         "not both")
    check_input_apart_from_outputs(opts)
    check_mode(opts.mode, opts.stream)


def check_input(opts: RunOptions) -> None:
    """Open the run's input and let it go: a missing path, an empty folder or an unreadable
    video is told (ValueError or OSError) before anything else starts (`mapstream run --view`
    checks it before serving). `run` opens it itself; the demo's frames are rendered then."""
    if not opts.demo:
        open_input(opts)


# Options that only some runs read, with the condition under which they are read.
_ONLY_WHEN = {
    "window_size": ("windowed", "--mode windowed (--mode auto's windows are as long as the model's training clips)"),
    "overlap": ("windows", "--mode windowed or auto"), "overlap_keyframes": ("windows", "--mode windowed or auto"),
    "shared_from": ("windows", "--mode windowed or auto"), "window_join": ("windows", "--mode windowed or auto"),
    "sky_model": ("sky_mask", "--sky-mask"), "image_size": ("input", "an input (--demo renders its own size)"),
}


def _unused_options(opts: RunOptions) -> list[str]:
    """Options given another value than their default that this run does not read: told,
    since a user who sets one expects an effect."""
    defaults, stream_defaults = RunOptions(input=None, out=Path()), StreamConfig()
    unused = []
    for name, (needs, what) in _ONLY_WHEN.items():
        read = {"windowed": opts.mode == "windowed", "windows": opts.mode != "streaming", "sky_mask": opts.sky_mask,
                "input": not opts.demo}[needs]
        given, default = (
            (getattr(opts.stream, name), getattr(stream_defaults, name)) if hasattr(stream_defaults, name)
            else (getattr(opts, name), getattr(defaults, name))
        )
        if not read and given != default:
            unused.append(f"{name}={given!r} has no effect without {what}")
    if opts.stream.provisional:
        unused.append("provisional=True has no effect in a run (its outputs are the final predictions)")
    return unused


def _as_recorded_today(config: dict) -> dict:
    """An earlier run's recorded settings as this version records them: its input path
    resolved, and the windowed settings it did not record yet (`_WINDOWED_RECORDED_LATER`)."""
    today = {**config, "input": input_key(config.get("input"))}
    windowed = config.get("mode") == "windowed"
    for name, before in _WINDOWED_RECORDED_LATER.items():
        today.setdefault(name, before if windowed else None)
    return today


def run(
    opts: RunOptions, *, progress: bool | None = None,
    on_frame: Callable[[FramePrediction, torch.Tensor, int], None] | None = None,
    open_session: Callable[[RunOptions, torch.device, int | None], OpenedSession] | None = None,
    on_model: Callable[[str, list[str]], None] | None = None,
    on_map: Callable[[dict, list[tuple[int, int]]], None] | None = None,
) -> RunSummary:
    """Run the whole job; see the module docstring. Returns what was done and where.

    on_frame: called with each finished frame's prediction (on the CPU, aligned to the earlier
        frames when resuming), its input frame ([3, H, W] in [0, 1]) and its index in the
        sequence, as soon as the frame is stored (e.g. :meth:`mapstream.viewer.LiveView.add`).
    open_session: where the frames are predicted, given the options, the device and the
        input's length (None: unknown), which plans the stream (`plan_stream`; default: a
        `Session` or `WindowedSession` of the model the options name, here; `mapstream stream`
        gives a session of a server).
    on_model: called once the model is open, before the first frame, with its description and
        warnings as run.json records them (e.g. a live view tells a fallback to other weights).
    on_map: with loop closure, called with the global map's corrected keyframe poses and its
        loop edges after every loop it closes and at the end (e.g. `LiveView.show_map`).
    """
    started = time.perf_counter()
    check_options(opts)  # fail on a bad option before any heavy work
    for unused in _unused_options(opts):
        log.warning("%s", unused)
    if opts.gpu_memory is not None and open_session is not None:
        log.warning("--gpu-memory plans the memory of a run's own model; where the frames are predicted "
                    "elsewhere (a server, a fleet worker) it has no effect")
    device = resolve_device(opts.device)
    source = open_input(opts)  # a missing or unreadable input is told before any folder is made
    folder = RunFolder(opts.out, inputs=input_files(opts))
    with folder.held():  # an unwritable output, or another run there, is told before the model loads
        job = _prepare(opts, folder, source, device, open_session or _local_session)
        if opts.image_size is None and not opts.demo:
            log.info("frames %d pixels wide, the width the model was trained at (--image-size chooses another)",
                     job.image_size)
        if source.image_size != job.image_size:  # no width given, and the model's own is another
            source = open_input(replace(opts, image_size=job.image_size))
        if on_model is not None:
            on_model(job.model_desc, list(job.warnings))
        mapping = _start_map(opts, job, on_map)
        loaded = time.perf_counter()
        try:
            with held_to_budget(job.memory, device):
                streamed = stream_frames(
                    job.session, source, job.store, scale_frames=opts.stream.num_scale_frames, out=folder.path,
                    progress=progress, on_frame=_both(mapping.take, on_frame) if mapping else on_frame,
                    intrinsics=read_intrinsics(opts.intrinsics) if opts.intrinsics is not None else None,
                )
        except BaseException:
            if mapping is not None:
                mapping.close()
            raise
        gmap = mapping.finish() if mapping is not None else None
        inferred = time.perf_counter()
        recon, outputs, settings = _export(opts, job, progress, gmap)
        timings = {"setup": loaded - started, "inference": inferred - loaded - streamed.in_callback,
                   "on_frame": streamed.in_callback, "export": time.perf_counter() - inferred}
        return _record(opts, job, recon, outputs, settings, streamed, timings, gmap)


def _both(first, second):
    """One per-frame callback calling `first`, then `second` (when there is one)."""
    if second is None:
        return first

    def call(pred, frame, index):
        first(pred, frame, index)
        second(pred, frame, index)

    return call


def _start_map(opts: RunOptions, job: "_Job", on_map) -> MapRun | None:
    """The run's global map when loop closure is on, handed the frames an earlier run finished."""
    if not opts.loop_closure:
        return None
    mapping = MapRun(job.model, opts.map, on_map=on_map)
    if job.store.finished:
        try:
            mapping.resume(job.store.assemble(), job.store.scale_frames())
        finally:
            job.store.discard_assembled()
    return mapping


@dataclass(frozen=True)
class OpenedSession:
    """Where a run's frames are predicted: the session (`step`, `flush`, `close` as
    `Session`'s), the model's description and warnings, and the settings the run records."""

    session: Any
    mode: str  # "streaming" or "windowed", as planned
    stream: StreamConfig  # the session's settings, as planned
    model_desc: str
    warnings: list[str]
    precision: str
    heads_precision: str
    camera_iterations: int
    where: str | None = None  # run.json's "device" when not the run's own device (a server's address)
    image_size: int = DEFAULT_IMAGE_SIZE  # the model's own frame width, for runs that choose none
    model: Any = None  # the network, where it runs here (loop closure measures loops with it)
    memory: MemoryPlan | None = None  # what --gpu-memory chose
    trunk_weights: str = "auto"  # how the predicting model stores its trunk's linear weights


@dataclass
class _Job:
    """What `_prepare` sets up for the other steps."""

    folder: RunFolder
    device: torch.device
    model_desc: str
    warnings: list[str]  # told in run.json and the summary
    config: dict[str, Any]  # the settings a resume must share (the frame store compares them)
    store: FrameStore
    session: Any  # Session or WindowedSession
    image_size: int  # the frames' width: the options', else the model's own (the demo: its rendered width)
    where: str | None = None
    model: Any = None  # the network, where it runs here
    priors: dict | None = None  # what the global map's priors did (run.json)
    memory: MemoryPlan | None = None  # what --gpu-memory chose


def _local_session(opts: RunOptions, device: torch.device, length: int | None) -> OpenedSession:
    """The model the options name, loaded and cast, and a session of it as `plan_stream`
    plans for an input of ``length`` frames."""
    model, model_desc, warnings = resolve_model(
        opts.model, filename=opts.checkpoint_file, device=device, demo=opts.demo, backend=opts.stream.backend,
        camera_num_iterations=opts.camera_iterations, compile=opts.compile,
    )
    precision = resolve_precision(opts.stream.precision, device)
    plan = plan_for_model(opts, length, model, precision)
    memory = fit_to_budget(opts, model, plan, precision, device, frame_width(opts, model_image_size(model)))
    prepare_for_inference(model, precision, low_precision_heads=opts.low_precision_heads,
                          trunk_weights=opts.trunk_weights, memory=memory)
    if memory is not None:
        plan = replace(plan, stream=memory.stream)
        torch.cuda.reset_peak_memory_stats(device)  # the budget counts from the loaded model on
    return OpenedSession(planned_session(model, plan), plan.mode, plan.stream, model_desc, warnings, precision,
                         str(model.head_dtype).removeprefix("torch."), opts.camera_iterations,
                         image_size=model_image_size(model), model=model, memory=memory,
                         trunk_weights=model.trunk_weights)


def plan_for_model(opts: RunOptions, length: int | None, model, precision: str) -> StreamPlan:
    """The run's `plan_stream` for ``model`` (the clip length its weights record) on an input
    of ``length`` frames, at ``precision``, told in the log when "auto" chose windows. A local
    run and a fleet's worker plan alike through it."""
    plan = plan_stream(opts.mode, opts.stream, length, model_trained_views(model))
    if plan.reason:
        log.info("%s", plan.reason)
    return replace(plan, stream=plan.stream.with_settings(precision=precision))


def planned_session(model, plan: StreamPlan) -> Session | WindowedSession:
    """A new session of ``model`` as ``plan`` says, its predictions on the CPU (the run's store)."""
    kind = WindowedSession if plan.mode == "windowed" else Session
    return kind(model, plan.stream, output_device="cpu")


def _prepare(opts: RunOptions, folder: RunFolder, source, device: torch.device, open_session) -> _Job:
    """Open the run's session (``open_session``) and its frame store (with the frames an
    earlier run of the same settings finished)."""
    opened = open_session(opts, device, source.expected_length)
    stream, mode = opened.stream, opened.mode
    width = frame_width(opts, opened.image_size)
    try:
        config = {
            "input": input_key(opts.input) if not opts.demo else "demo", "model": opened.model_desc,
            "mode": mode, "image_size": width,
            "preprocess": opts.preprocess, "rotate": opts.rotate, "fps": opts.fps, "stride": opts.stride,
            "first_k": opts.first_k, "num_scale_frames": stream.num_scale_frames,
            "keyframe_interval": stream.keyframe_interval,
            "window_size": stream.window_size, "overlap": stream.overlap, "overlap_keyframes": stream.overlap_keyframes,
            "shared_from": stream.shared_from if mode == "windowed" else None,
            "window_join": stream.window_join if mode == "windowed" else None,
            "precision": opened.precision,
            "cache_scale_frames": stream.anchor_frames, "sliding_window": stream.sliding_window,
            "trajectory_capacity": stream.trajectory_capacity, "kv_dtype": stream.kv_dtype,
            "camera_iterations": opened.camera_iterations,
            "intrinsics": opts.intrinsics,
            "heads_precision": opened.heads_precision,
            "trunk_weights": opened.trunk_weights,
        }
        store = folder.frame_store(config, resume=opts.resume, recorded_later=_RECORDED_LATER,
                                   same_as_now=_as_recorded_today)
    except BaseException:
        opened.session.close()
        raise
    return _Job(folder, device, opened.model_desc, opened.warnings, config, store, opened.session, width, opened.where,
                opened.model, memory=opened.memory)


def _export(opts: RunOptions, job: _Job, progress: bool | None,
            gmap: GlobalMap | None) -> tuple[Reconstruction, dict[str, Path], dict]:
    """Every requested format from the stored frames (corrected by the global map when there
    is one), the folder marked as being rewritten meanwhile. Returns the reconstruction, what
    was written and the run's settings."""
    recon = job.store.assemble(fps=opts.fps)
    if gmap is not None:
        if opts.known_poses is not None:
            job.priors = gmap.apply_known_poses(known_poses_of(recon, opts.known_poses))
        recon = corrected_reconstruction(recon, gmap)
    try:
        settings = {**job.config, "options": recorded_options(opts)}  # run.json's "config"
        job.folder.begin_export(settings, opts.formats, recon.file_stems())
        if opts.sky_mask:
            recon = _with_sky_masks(recon, job.folder.path, opts.sky_model, job.warnings, progress)
        outputs = export_all(
            recon, job.folder.path, formats=opts.formats, conf_threshold=opts.conf_threshold,
            conf_percentile=opts.conf_percentile, voxel_size=opts.voxel_size, max_points=opts.max_points,
            drop_black=opts.drop_black_background, drop_white=opts.drop_white_background, progress=progress,
        )
    finally:
        job.store.discard_assembled()
    return recon, outputs, settings


def _record(opts: RunOptions, job: _Job, recon: Reconstruction, outputs: dict[str, Path], settings: dict,
            streamed: Streamed, timings: dict[str, float], gmap: GlobalMap | None) -> RunSummary:
    """Write run.json (last: a folder with one and no ``state`` holds one finished run) and
    sum the run up."""
    fps = streamed.new_frames / max(timings["inference"], 1e-9)
    device = job.device
    info = {
        "config": settings,
        "versions": runtime_versions(),
        "device": job.where or str(device),
        "frames": len(recon),
        "new_frames": streamed.new_frames,
        "resumed_from": streamed.resumed_from,
        "timings_s": timings,
        "fps": fps,
        "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "warnings": job.warnings,
        "loop_closure": {**gmap.record(), "priors": job.priors} if gmap is not None else None,
        "intrinsics": streamed.intrinsics,
        "gpu_memory": memory_record(job.memory, device) if job.memory is not None else None,
    }
    outputs = {**outputs, "run_json": job.folder.finish(outputs, recon.file_stems(), info)}
    return RunSummary(len(recon), streamed.new_frames, fps, job.folder.path, outputs, job.model_desc, job.warnings)


def _with_sky_masks(recon, out: Path, model_path: str | None, warnings: list[str], progress: bool | None):
    """Sky masks for every frame (cached next to the outputs); a missing model is a warning."""
    import dataclasses

    from ..sky import SKY_CACHE_DIRNAME, SkyMaskError, compute_sky_masks

    try:
        masks = compute_sky_masks(recon.images, out / SKY_CACHE_DIRNAME, model_path, progress=progress)
    except SkyMaskError as exc:
        message = f"sky masking skipped: {exc}"
        log.warning(message)
        warnings.append(message)
        return recon
    return dataclasses.replace(recon, sky_mask=masks)
