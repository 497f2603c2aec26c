"""The main job: frames in (folder, video, webcam, demo), every output format out.

Frames are read and fed one at a time (host and GPU memory stay bounded on long videos);
finished frames go to disk in shards as they come (`FrameStore`), so an interrupted run
keeps them and a rerun resumes: it restarts the stream `overlap` frames before the last
finished frame and aligns the new predictions to the finished ones with the windowed
Sim(3) estimate.
"""
from __future__ import annotations

import logging
import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import StreamConfig
from ..device import resolve_device
from ..export import ALL_FORMATS, CloudOptions, check_formats, export_all, runtime_versions, write_run_json
from ..geometry import invert_se3
from ..keyframes import make_policy
from ..progress import progress_bar
from ..session import FramePrediction, Session
from ..validation import check_scale_frames
from ..windowed import WindowedSession, pairwise_alignment
from ..windowed.online import check_window_options, predictions_as_window, warp_prediction
from ..windowed.plan import check_keyframe_interval
from .frame_store import FrameStore, lock_run_folder
from .model_source import DEFAULT_CHECKPOINT, DEFAULT_REPO, resolve_model
from .outputs import FRAME_FOLDERS, RUN_FILES, EarlierRun, remove_interrupted_writes

__all__ = ["RunOptions", "RunSummary", "check_input", "check_options", "run"]

log = logging.getLogger(__name__)

TRAINED_VIEWS = 320  # the reference's rule: keyframe interval ceil(N / 320) for long inputs
DEMO_HW = (112, 196)  # the size the demo renders its frames at
# Run settings that older run folders did not record, with the value those runs used.
_RECORDED_LATER = {
    "rotate": 0, "overlap_keyframes": None, "cache_scale_frames": 8, "sliding_window": 64, "trajectory_capacity": 1024,
    "camera_iterations": 4,
}


@dataclass
class RunOptions:
    input: str | None
    out: Path
    model: str = DEFAULT_REPO
    checkpoint_file: str = DEFAULT_CHECKPOINT
    mode: str = "streaming"
    image_size: int = 518
    preprocess: str = "crop"
    rotate: int = 0  # degrees clockwise, applied to every frame before preprocessing
    fps: float | None = 10.0
    stride: int = 1
    first_k: int | None = None
    num_scale_frames: int = 8
    keyframe_interval: int | str | None = None
    sliding_window: int = 64  # stored frames the streaming cache keeps after the scale frames
    trajectory_capacity: int | None = 1024  # evicted frames whose special tokens are kept (None: all)
    camera_iterations: int = 4  # the camera head's refinement passes
    window_size: int = 64
    overlap: int = 16
    overlap_keyframes: int | None = None  # windowed: overlap in keyframes (overrides overlap)
    shared_from: str = "later"  # windowed: the window a shared frame comes from (the offline stitch's)
    device: str = "auto"
    precision: str = "auto"
    backend: str = "auto"
    formats: tuple[str, ...] = ALL_FORMATS
    conf_threshold: float = 1.5
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
    compile: bool = False
    low_precision_heads: bool = False  # heads in `precision` too (default: fp32, as the reference)
    fast: bool = True  # CUDA-graph steps on CUDA devices (no effect on the CPU)


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
    if opts.num_scale_frames is not None:
        check_scale_frames(opts.num_scale_frames)
    _cache_config(StreamConfig(), opts)  # its own errors for a bad window or capacity
    if opts.camera_iterations < 1:
        raise ValueError(f"camera_iterations must be >= 1, got {opts.camera_iterations}")
    if opts.keyframe_interval is not None:
        make_policy(opts.keyframe_interval)  # its own error for a bad interval
    if opts.demo and opts.input is not None:
        raise ValueError(f"--demo renders its own frames and reads no input: give the input {opts.input} or --demo, "
                         "not both")
    _check_input_apart_from_outputs(opts)
    if opts.mode not in ("streaming", "windowed"):
        raise ValueError(f"mode must be 'streaming' or 'windowed', got {opts.mode!r}")
    if opts.mode == "windowed":
        check_window_options(StreamConfig(window_size=opts.window_size, overlap=opts.overlap,
                                          shared_from=opts.shared_from))
        if opts.overlap_keyframes is not None and opts.overlap_keyframes < 1:
            raise ValueError(f"overlap_keyframes must be >= 1 (or unset), got {opts.overlap_keyframes}")
        if opts.keyframe_interval is not None:
            check_keyframe_interval(opts.keyframe_interval)


def check_input(opts: RunOptions) -> None:
    """Open the run's input and let it go: a missing path, an empty folder or an unreadable
    video is told (ValueError or OSError) before anything else starts (`mapstream run --view`
    checks it before serving). `run` opens it itself; the demo's frames are rendered then."""
    if not opts.demo:
        _source(opts)


# Options that only some runs read, with the condition under which they are read.
_ONLY_WHEN = {
    "window_size": ("windowed", "--mode windowed"), "overlap": ("windowed", "--mode windowed"),
    "overlap_keyframes": ("windowed", "--mode windowed"), "shared_from": ("windowed", "--mode windowed"),
    "sky_model": ("sky_mask", "--sky-mask"), "image_size": ("input", "an input (--demo renders its own size)"),
}


def _unused_options(opts: RunOptions) -> list[str]:
    """Options given another value than their default that this run does not read: told,
    since a user who sets one expects an effect."""
    defaults = RunOptions(input=None, out=Path())
    unused = []
    for name, (needs, what) in _ONLY_WHEN.items():
        read = {"windowed": opts.mode == "windowed", "sky_mask": opts.sky_mask, "input": not opts.demo}[needs]
        if not read and getattr(opts, name) != getattr(defaults, name):
            unused.append(f"{name}={getattr(opts, name)!r} has no effect without {what}")
    return unused


def _cache_config(base: StreamConfig, opts: RunOptions) -> StreamConfig:
    """The run's cache policy. The scale frames of the cache are the run's scale frames, as
    in the reference demo (its --num_scale_frames sets kv_cache_scale_frames too)."""
    scale = base.num_scale_frames if opts.num_scale_frames is None else opts.num_scale_frames
    return base.with_settings(
        num_scale_frames=scale, cache_scale_frames=None, sliding_window=opts.sliding_window,
        trajectory_capacity=opts.trajectory_capacity,
    )


def _input_key(spec: str | None) -> str | None:
    """The input as the run records it: an existing path resolved, so that `frames`,
    `./frames` and its absolute path are one input (a run resumes whichever is given)."""
    if spec is None or "://" in spec or not Path(spec).exists():
        return spec
    return str(Path(spec).resolve())


def _check_input_apart_from_outputs(opts: RunOptions) -> None:
    """Refuse an input the run's outputs would overwrite or be read back from: the output folder
    itself (its summary.png would be a frame of the next run) or one of its per-frame folders
    (the preprocessed frames, written to OUT/images, would replace the photos of the same name);
    for a glob, any file it matches there."""
    if opts.demo:
        return
    out = Path(os.path.realpath(opts.out))
    folders = {name: Path(os.path.realpath(out / name)) for name in FRAME_FOLDERS}  # a link: where exports write
    source = _input_path(opts)
    if source is not None:
        source = Path(os.path.realpath(source))
        if source == out:
            raise ValueError(
                f"the output folder is the input folder {opts.input}: the run would read its own outputs "
                "(summary.png...) as frames when run again; write them elsewhere, e.g. to a subfolder"
            )
        if source.parent == out and source.name in RUN_FILES:
            raise ValueError(
                f"the input {opts.input} is a file the run writes in its output folder {out}: it would be replaced; "
                "move it or give another output folder"
            )
        for name, folder in folders.items():
            if source == folder or folder in source.parents:
                raise ValueError(
                    f"the input {opts.input} lies in the output folder's {name}/, which the run's exports write frame "
                    f"by frame (its files could replace your own); give another output folder, e.g. {out / 'mapstream'}"
                )
        return
    for match in _glob_matches(opts):
        match = Path(os.path.realpath(match))
        if match.parent == out or any(match.parent == f or f in match.parents for f in folders.values()):
            raise ValueError(
                f"the input {opts.input} matches {match}, in the output folder {out} or one of the folders its "
                "exports write frame by frame: the run would read its own outputs as frames, or write over the "
                "files it reads; narrow the pattern or give another output folder"
            )


def _glob_matches(opts: RunOptions) -> list[str]:
    """The files a glob input reads (as `io.sources` expands it, ``**`` included); none for
    any other input."""
    from ..io.sources import glob_files, is_glob

    spec = opts.input
    if spec is None or "://" in str(spec) or not is_glob(str(spec)):
        return []
    return glob_files(str(spec))


def _input_files(opts: RunOptions) -> set[Path]:
    """The input's files as they lie on disk (links followed): a file input, a folder's files
    (it reads its top level), a glob's matches. A rerun's cleanup never removes one."""
    path = _input_path(opts)
    if path is None:
        files = [Path(m) for m in _glob_matches(opts)]
    elif path.is_dir():
        files = [p for p in path.iterdir() if p.is_file()]
    else:
        files = [path]
    return {Path(os.path.realpath(f)) for f in files}


def _input_path(opts: RunOptions) -> Path | None:
    """The input's place on disk (a folder or a file), None for a stream, a webcam or a glob."""
    if opts.demo:
        return Path(opts.out) / "input"
    if opts.input is None or "://" in str(opts.input):
        return None
    path = Path(opts.input)
    return path if path.exists() else None


def _source(opts: RunOptions):
    from ..io.sources import open_source

    kwargs = dict(
        mode=opts.preprocess, image_size=opts.image_size, stride=opts.stride, first_k=opts.first_k, rotate=opts.rotate
    )
    if opts.demo:
        folder = _demo_input(opts.out / "input", opts.demo_frames)
        kwargs["image_size"] = DEMO_HW[1]  # the demo runs at its rendered size
        return open_source(str(folder), **kwargs)
    if opts.input is None:
        raise ValueError("no input: give a folder, video, glob, webcam index or URL (or --demo)")
    return open_source(opts.input, fps=opts.fps, **kwargs)


def _demo_input(folder: Path, frames: int) -> Path:
    """A short synthetic sequence the project renders itself (no download)."""
    from PIL import Image

    from ..io.atomic import atomic_path, prepare_dir
    from ..synthetic import render_sequence

    folder = prepare_dir(folder)
    if len(list(folder.glob("*.png"))) == frames:
        return folder
    seq = render_sequence(frames, image_hw=DEMO_HW, seed=0)
    for i, rgb in enumerate(seq.rgb):
        with atomic_path(folder / f"{i:06d}.png") as tmp:
            Image.fromarray(rgb).save(tmp, format="PNG")
    return folder


def _keyframe_interval(opts: RunOptions, length: int | None):
    if opts.keyframe_interval is not None:
        return opts.keyframe_interval
    if length is None:
        return "auto" if opts.mode == "streaming" else 1
    # Keep the stored frames within the views the model was trained on (reference rule).
    return max(1, math.ceil(length / TRAINED_VIEWS)) if opts.mode == "streaming" else 1


def _record(pred: FramePrediction, frame: torch.Tensor, when: float | None) -> dict[str, Any]:
    image = (frame.permute(1, 2, 0).clamp(0, 1) * 255 + 0.5).to(torch.uint8).cpu().numpy()
    return {
        "image": image,
        "depth": pred.depth.float().cpu().numpy(),
        "depth_conf": pred.depth_conf.float().cpu().numpy(),
        "T_world_cam": pred.T_world_cam.float().cpu().numpy(),
        "K": pred.K.float().cpu().numpy(),
        "pose_enc": pred.pose_enc.float().cpu().numpy(),
        "keyframe": bool(pred.keyframe),
        "index": int(pred.index),
        "name": pred.name or f"frame_{pred.index:06d}",
        "time": float("nan") if when is None else float(when),
    }


def _as_prediction(record: dict[str, Any]) -> FramePrediction:
    t = {k: torch.as_tensor(np.asarray(record[k])) for k in ("pose_enc", "depth", "depth_conf", "T_world_cam", "K")}
    return FramePrediction(
        index=int(record["index"]), pose_enc=t["pose_enc"], T_world_cam=t["T_world_cam"],
        T_cam_world=invert_se3(t["T_world_cam"]),
        K=t["K"], depth=t["depth"], depth_conf=t["depth_conf"], keyframe=bool(record["keyframe"]), scale_frame=False,
    )


def _as_recorded_today(config: dict) -> dict:
    """An earlier run's recorded settings as this version records them: its input path
    resolved, and the window its shared frames came from (before `shared_from` existed, a
    windowed run emitted them from the earlier window)."""
    today = {**config, "input": _input_key(config.get("input"))}
    if "shared_from" not in config:
        today["shared_from"] = "earlier" if config.get("mode") == "windowed" else None
    return today


def run(
    opts: RunOptions, *, progress: bool | None = None,
    on_frame: Callable[[FramePrediction, torch.Tensor, int], None] | None = None,
) -> RunSummary:
    """Run the whole job; see the module docstring. Returns what was done and where.

    on_frame: called with each finished frame's prediction (on the CPU, aligned to the earlier
        frames when resuming), its input frame ([3, H, W] in [0, 1]) and its index in the
        sequence, as soon as the frame is stored (e.g. :meth:`mapstream.viewer.LiveView.add`).
    """
    from ..io.atomic import prepare_dir

    started = time.perf_counter()
    check_options(opts)  # fail on a bad option before any heavy work
    for unused in _unused_options(opts):
        log.warning("%s", unused)
    device = resolve_device(opts.device)
    source = _source(opts)  # a missing or unreadable input is told before any folder is made
    out = prepare_dir(opts.out)  # and an unwritable output before the model loads
    with lock_run_folder(out):  # and another run writing there
        remove_interrupted_writes(out)
        return _run_into(out, opts, source, device, started, progress, on_frame)


def _run_into(out: Path, opts: RunOptions, source, device, started: float, progress, on_frame) -> RunSummary:
    """`run` once its options are checked, its input open and its folder held."""
    model, model_desc, warnings = resolve_model(
        opts.model, filename=opts.checkpoint_file, device=device, demo=opts.demo, backend=opts.backend,
        camera_num_iterations=opts.camera_iterations,
    )
    cache = _cache_config(model.stream_config, opts)
    from ..session import resolve_precision

    precision = resolve_precision(opts.precision, device)
    if precision in ("bf16", "fp16"):
        model.cast_for_inference(precision, heads=opts.low_precision_heads)
    if opts.compile:
        from ..models.compile import compile_model

        compile_model(model)
    interval = _keyframe_interval(opts, source.expected_length)
    config = {
        "input": _input_key(opts.input) if not opts.demo else "demo", "model": model_desc, "mode": opts.mode,
        "image_size": DEMO_HW[1] if opts.demo else opts.image_size, "preprocess": opts.preprocess, "rotate": opts.rotate, "fps": opts.fps,
        "stride": opts.stride,
        "first_k": opts.first_k, "num_scale_frames": opts.num_scale_frames, "keyframe_interval": interval,
        "window_size": opts.window_size, "overlap": opts.overlap, "overlap_keyframes": opts.overlap_keyframes,
        "shared_from": opts.shared_from if opts.mode == "windowed" else None,
        "precision": precision,
        "cache_scale_frames": cache.anchor_frames, "sliding_window": cache.sliding_window,
        "trajectory_capacity": cache.trajectory_capacity,
        "camera_iterations": opts.camera_iterations,
        "heads_precision": str(model.head_dtype).removeprefix("torch."),
    }
    store = FrameStore(
        out, config, resume=opts.resume, recorded_later=_RECORDED_LATER,
        same_as_now=_as_recorded_today,
    )
    loaded = time.perf_counter()

    if opts.mode == "windowed":
        session = WindowedSession(
            model, cache.with_settings(
                window_size=opts.window_size, overlap=opts.overlap, overlap_keyframes=opts.overlap_keyframes,
                keyframe_interval=interval, precision=precision, fast=opts.fast and device.type == "cuda",
                shared_from=opts.shared_from,
            ), output_device="cpu",
        )
    else:  # "streaming" (`check_options` took no other mode)
        session = Session(
            model, cache.with_settings(
                keyframe_interval=interval, precision=precision, fast=opts.fast and device.type == "cuda",
            ), output_device="cpu",
        )

    resume_at = store.finished
    expected = source.expected_length
    complete = bool(resume_at) and expected is not None and resume_at >= expected
    overlap = 0 if complete else min(resume_at, max(opts.num_scale_frames, 2))
    if complete:  # nothing to infer: the input is only read for its frames' names
        log.info("all %d frames of this input were finished by an earlier run with these settings: "
                 "writing the outputs again (--no-resume runs the model again)", resume_at)
    elif resume_at:  # the cache of the interrupted stream is gone: say what the new frames come from
        log.warning(
            "resuming after %d finished frames: the stream restarts with the last %d of them as its scale frames and "
            "is aligned to them by Sim(3), so the frames after differ from an uninterrupted run's "
            "(--no-resume starts over)", resume_at, overlap,
        )
    anchors = store.last_records(overlap) if overlap else []
    realign = _Realigner(anchors, resume_at - overlap) if overlap else None
    offset = resume_at - overlap
    # Inputs awaiting their prediction (scale phase), with the time the source gave them.
    frames: dict[int, tuple[torch.Tensor, float | None]] = {}
    new = 0
    in_callback = 0.0  # time spent in `on_frame`: the caller's, not the run's

    def emit(preds: list[FramePrediction]) -> None:
        nonlocal new, in_callback
        for pred in preds:
            seq_index = pred.index + offset
            if realign is not None:
                pred = realign.take(pred, seq_index)
                if pred is None:  # a re-fed frame: it only anchors the alignment
                    continue
            frame, when = frames.pop(seq_index)
            store.add(_record(pred, frame, when))
            if on_frame is not None:
                called = time.perf_counter()
                on_frame(pred, frame, seq_index)
                in_callback += time.perf_counter() - called
            new += 1
            bar.update(1)

    bar = progress_bar(source.expected_length, desc="mapstream", progress=progress, initial=resume_at)
    keep = 4 * max(opts.num_scale_frames, getattr(session, "overlap", 0), 8)
    try:
        source_read = 0
        for index, (name, frame) in enumerate(source):
            source_read = index + 1
            if index < resume_at and name != store.finished_name(index):
                raise ValueError(
                    f"the input is not the one the earlier run in {out} read: its frame {index} was "
                    f"{store.finished_name(index)!r}, now it is {name!r} (frames added or removed before the end?); "
                    "give the same input to resume, or start over (--no-resume; RunOptions(resume=False))"
                )
            if index < offset:
                continue
            frames[index] = frame, source.last_time
            emit(session.step(frame, name=name))
            for stale in [i for i in frames if i < index - keep]:
                frames.pop(stale)
        if source_read < resume_at:
            raise ValueError(
                f"the input is not the one the earlier run in {out} read: it has {source_read} frames, that run "
                f"finished {resume_at} (frames removed?); give the same input to resume, or start over "
                "(--no-resume; RunOptions(resume=False))"
            )
        emit(session.flush())
    finally:
        bar.close()
        store.flush()
        session.close()
    inferred = time.perf_counter()

    earlier = EarlierRun(out)  # before this run's run.json replaces it
    recon = store.assemble(fps=opts.fps)
    try:
        settings = {**config, "options": {k: str(v) for k, v in asdict(opts).items()}}  # run.json's "config"
        earlier.mark_being_replaced(settings, opts.formats, recon.file_stems())
        if opts.sky_mask:
            recon = _with_sky_masks(recon, out, opts.sky_model, warnings, progress)
        outputs = export_all(
            recon, out, formats=opts.formats, conf_threshold=opts.conf_threshold, conf_percentile=opts.conf_percentile,
            voxel_size=opts.voxel_size, max_points=opts.max_points, drop_black=opts.drop_black_background,
            drop_white=opts.drop_white_background, progress=progress,
        )
    finally:
        store.discard_assembled()
    stems = recon.file_stems()
    earlier.remove_what_is_not_rewritten(outputs, stems, _input_files(opts))
    exported = time.perf_counter()
    fps = new / max(inferred - loaded - in_callback, 1e-9)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    info = {
        "config": settings,
        "versions": runtime_versions(),
        "device": str(device),
        "frames": len(recon),
        "new_frames": new,
        "resumed_from": resume_at,
        "timings_s": {"setup": loaded - started, "inference": inferred - loaded - in_callback, "on_frame": in_callback,
                      "export": exported - inferred},
        "fps": fps,
        "peak_gpu_memory_bytes": peak,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "warnings": warnings,
        "outputs": {k: str(v) for k, v in outputs.items()},
        # The names of the per-frame files (<folder>/<stem>.png), so that a later run here
        # can remove those it does not write again.
        "frame_stems": stems,
    }
    outputs["run_json"] = write_run_json(info, out / "run.json")
    return RunSummary(len(recon), new, fps, out, outputs, model_desc, warnings)


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


class _Realigner:
    """Maps a resumed stream onto the finished frames: predictions of the re-fed frames
    (those already finished) only estimate the Sim(3); later ones are warped by it."""

    def __init__(self, anchors: list[dict[str, Any]], first_index: int) -> None:
        self.anchors = [_as_prediction(r) for r in anchors]
        self.first_index = first_index
        self.shared: list[FramePrediction] = []
        self.sim = None

    def take(self, pred: FramePrediction, seq_index: int) -> FramePrediction | None:
        if self.sim is None and len(self.shared) < len(self.anchors):
            self.shared.append(pred)
            if len(self.shared) == len(self.anchors):
                self.sim = pairwise_alignment(
                    predictions_as_window(self.anchors), predictions_as_window(self.shared), len(self.shared)
                )
                log.info("resumed stream aligned: scale %.4f", float(self.sim.scale[0]))
            return None
        return warp_prediction(pred, self.sim, index=seq_index)
