"""The main job: frames in (folder, video, webcam, demo), every output format out.

Frames are read and fed one at a time (host and GPU memory stay bounded on long videos);
finished frames go to disk in shards as they come (`FrameStore`), so an interrupted run
keeps them and a rerun resumes: it restarts the stream `overlap` frames before the last
finished frame and aligns the new predictions to the finished ones with the windowed
Sim(3) estimate.
"""
from __future__ import annotations

import json
import logging
import math
import os
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import CacheConfig
from ..device import resolve_device
from ..export import ALL_FORMATS, CloudOptions, check_formats, export_all, runtime_versions, write_run_json
from ..geometry import invert_se3
from ..keyframes import make_policy
from ..progress import progress_bar
from ..session import FramePrediction
from ..validation import check_scale_frames
from ..windowed import WindowedSession, pairwise_alignment
from ..windowed.online import check_window_options, predictions_as_window, warp_prediction
from ..windowed.plan import check_keyframe_interval
from .frame_store import FrameStore, lock_run_folder
from .model_source import DEFAULT_CHECKPOINT, DEFAULT_REPO, resolve_model

__all__ = ["RunOptions", "RunSummary", "check_options", "run"]

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
    _cache_config(CacheConfig(), opts)  # its own errors for a bad window or capacity
    if opts.camera_iterations < 1:
        raise ValueError(f"camera_iterations must be >= 1, got {opts.camera_iterations}")
    if opts.keyframe_interval is not None:
        make_policy(opts.keyframe_interval)  # its own error for a bad interval
    _check_input_apart_from_outputs(opts)
    if opts.mode not in ("streaming", "windowed"):
        raise ValueError(f"mode must be 'streaming' or 'windowed', got {opts.mode!r}")
    if opts.mode == "windowed":
        check_window_options(opts.window_size, opts.overlap, opts.shared_from)
        if opts.overlap_keyframes is not None and opts.overlap_keyframes < 1:
            raise ValueError(f"overlap_keyframes must be >= 1 (or unset), got {opts.overlap_keyframes}")
        if opts.keyframe_interval is not None:
            check_keyframe_interval(opts.keyframe_interval)


def _cache_config(base: CacheConfig, opts: RunOptions) -> CacheConfig:
    """The run's cache policy. The scale frames of the cache are the run's scale frames, as
    in the reference demo (its --num_scale_frames sets kv_cache_scale_frames too)."""
    scale = base.scale_frames if opts.num_scale_frames is None else opts.num_scale_frames
    return replace(
        base, scale_frames=scale, sliding_window=opts.sliding_window,
        trajectory_capacity=opts.trajectory_capacity,
    )


def _input_key(spec: str | None) -> str | None:
    """The input as the run records it: an existing path resolved, so that `frames`,
    `./frames` and its absolute path are one input (a run resumes whichever is given)."""
    if spec is None or "://" in spec or not Path(spec).exists():
        return spec
    return str(Path(spec).resolve())


_PER_FRAME_FOLDERS = ("images", "depth", "depth_preview", "masks")
"""Output folders holding one ``<stem>.png`` a frame (`Reconstruction.file_stems`)."""
_FRAME_FOLDERS = (*_PER_FRAME_FOLDERS, "sparse")
"""The output folder's subfolders that exports write frame by frame (sparse/: COLMAP's model,
which names every frame's image)."""
_COLMAP_FILES = ("cameras.txt", "images.txt", "points3D.txt")
"""What `write_colmap` writes in ``sparse/0``."""


def _check_input_apart_from_outputs(opts: RunOptions) -> None:
    """Refuse an input the run's outputs would overwrite or be read back from: the output folder
    itself (its summary.png would be a frame of the next run) or one of its per-frame folders
    (the preprocessed frames, written to OUT/images, would replace the photos of the same name);
    for a glob, any file it matches there."""
    if opts.demo:
        return
    out = Path(os.path.realpath(opts.out))
    folders = {name: Path(os.path.realpath(out / name)) for name in _FRAME_FOLDERS}  # a link: where exports write
    source = _input_path(opts)
    if source is not None:
        source = Path(os.path.realpath(source))
        if source == out:
            raise ValueError(
                f"the output folder is the input folder {opts.input}: the run would read its own outputs "
                "(summary.png...) as frames when run again; write them elsewhere, e.g. to a subfolder"
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


_BEING_REPLACED = (
    "a run into this folder was writing its outputs and did not finish: the folder may hold part of them beside an "
    "earlier run's files; run it again (its settings are under replaced_by) to complete it"
)
_FORMAT_OUTPUTS = {
    "npz": ("predictions.npz",), "tum": ("trajectory_tum.txt",), "ply": ("points.ply",), "glb": ("scene.glb",),
    "depth": ("depth", "depth_preview"), "images": ("images",), "colmap": ("images", "sparse/0"),
    "nerfstudio": ("images", "transforms.json", "masks"), "summary": ("summary.png",),
}
"""What each export format may write in the output folder (files, or folders of per-frame
files), as `export.export_all` names them; read for a run that stopped while exporting."""


def _mark_being_replaced(out: Path, earlier: dict, settings: dict, formats, stems: list[str]) -> None:
    """Before this run's exports write, run.json says that the folder is being rewritten
    (``state``) and records what this run is about to write (``replaced_by``: its settings,
    formats, frame names and the time, after the entries of runs stopped the same way before),
    keeping what a later run's cleanup reads of the earlier run. A run killed while exporting
    thus leaves no run.json that vouches for the folder as one finished run, and the next run
    removes the files it wrote (`_replacing_outputs`). This run's own run.json, written last,
    replaces it."""
    entry = {"settings": settings, "formats": list(formats), "frame_stems": stems, "since": time.time()}
    write_run_json({**earlier, "state": _BEING_REPLACED, "replaced_by": [*_replacing_runs(earlier), entry]},
                   out / "run.json")


def _replacing_runs(info: dict) -> list[dict]:
    """The runs that stopped while replacing the run of run.json ``info`` (`_mark_being_replaced`)."""
    entries = info.get("replaced_by", [])
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _replacing_outputs(out: Path, info: dict) -> tuple[list[Path], list[Path]]:
    """(files, folders) that runs stopped while replacing the run of ``info`` wrote: the
    outputs of their formats (`_FORMAT_OUTPUTS`) and the per-frame files of their own frame
    names, the files among them changed since the run marked the folder (older ones, a user's
    own `points.ply` say, were not written by it); the folders for the cleanup to remove
    once empty."""
    files: list[Path] = []
    folders: list[Path] = []
    for entry in _replacing_runs(info):
        formats, since = entry.get("formats"), entry.get("since")
        if not isinstance(formats, list) or not isinstance(since, (int, float)):
            continue
        outputs = [out / p for name in formats if isinstance(name, str) for p in _FORMAT_OUTPUTS.get(name, ())]
        for path in [*outputs, *_known_files(out, outputs, _previous_stems(entry))]:
            try:
                if path.is_dir() and not path.is_symlink():
                    folders.append(path)
                elif path.stat().st_mtime >= since:
                    files.append(path)
            except OSError:  # not there: never written
                continue
    return files, folders


def _earlier_run(out: Path) -> dict:
    """The run.json an earlier run left in ``out``, read once for what the cleanup needs of it
    (empty when there is none or it is unreadable)."""
    try:
        info = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _previous_outputs(out: Path, info: dict) -> list[Path]:
    """The outputs an earlier run in ``out`` listed in its run.json ``info``, as paths under
    ``out`` (none if unreadable). run.json records them as that run was given ``out``, relative
    to its working directory when ``out`` was relative; they are re-rooted here."""
    try:
        listed = info.get("outputs", {})
        old_out = Path(info["config"]["options"]["out"])
    except (KeyError, AttributeError, TypeError):
        return []
    paths = []
    for value in listed.values() if isinstance(listed, dict) else []:
        if not isinstance(value, str):  # a damaged or hand-edited run.json
            continue
        path = Path(value)
        try:
            paths.append(out / path.relative_to(old_out))
        except ValueError:  # not under the out it was given: trusted only if absolute
            if path.is_absolute():
                paths.append(path)
    return paths


def _known_files(out: Path, outputs: dict[str, Path] | list[Path], stems: list[str]) -> list[Path]:
    """The files inside the output folders among ``outputs`` (format name -> path, or paths)
    whose names mapstream writes: ``<stem>.png`` for each stem in each per-frame folder
    directly in ``out``, and COLMAP's three text files in ``out/sparse/0``."""
    paths = outputs.values() if isinstance(outputs, dict) else outputs
    root = Path(os.path.abspath(out))
    files = []
    for folder in (Path(os.path.abspath(p)) for p in paths):
        if folder.parent == root and folder.name in _PER_FRAME_FOLDERS:
            files += [folder / f"{stem}.png" for stem in stems]
        elif folder == root / "sparse" / "0":
            files += [folder / name for name in _COLMAP_FILES]
    return files


def _previous_stems(info: dict) -> list[str]:
    """The frame stems an earlier run recorded in its run.json ``info`` (none before they were
    recorded); only plain names that fit a file name with ".png", so that a damaged or
    hand-edited run.json cannot point outside its folders."""
    stems = info.get("frame_stems", [])
    if not isinstance(stems, list):
        return []
    return [s for s in stems if isinstance(s, str) and 0 < len(s.encode()) <= 251 and s not in (".", "..")
            and Path(s).name == s and "\\" not in s and "\0" not in s]


def _below_without_links(out: Path, path: Path) -> Path | None:
    """``path`` resolved, when it lies below ``out`` with no link on the way down from ``out``
    (``out`` itself may be one); else None. What a removal may touch: a link, or anything
    reached through one, may be the user's."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(out))
    except ValueError:
        return None
    root = Path(os.path.realpath(out))  # where the names below out lie, out's own links followed
    step = root
    for part in rel.parts:
        step = step / part
        if step.is_symlink():
            return None
    return step if rel.parts else None


def _remove_stale_outputs(out: Path, previous: list[Path], written: dict[str, Path], inputs: set[Path],
                          previous_known: list[Path] = (), known_written: list[Path] = ()) -> None:
    """Remove the files an earlier run in ``out`` wrote and this one did not write again (another
    input, fewer frames, fewer formats), so that no file of another run passes for this one's:
    its listed files (``previous``) and the files of its listed folders that carry names
    mapstream writes (``previous_known``: per-frame PNGs by the stems its run.json recorded,
    COLMAP's files). Only regular files below ``out``, reached without a link, and none of the
    input's files (``inputs``, `_input_files`). A folder of outputs (depth/, images/,
    sparse/0...) goes only once empty: it may hold the user's own files, and is then named in
    a warning. A file that cannot be removed is told: this run's outputs are written by now."""
    keep = {p for p in (_below_without_links(out, q) for q in (*written.values(), *known_written)) if p is not None}
    removed = 0
    for given in [*previous_known, *previous]:  # files first: their folders may empty
        try:
            path = _below_without_links(out, given)
            if path is None or path in keep or path in inputs or not path.exists():
                continue
            if path.is_file():
                path.unlink()
                removed += 1
                log.debug("removed %s, an earlier run's output this run does not write", path)
            elif path.is_dir():
                _remove_if_empty(path, out.resolve())
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("could not remove %s, an earlier run's output: %s", given, exc)
    if removed:
        log.info("removed %d files of an earlier run in %s that this run does not write", removed, out)


def _remove_if_empty(folder: Path, root: Path) -> None:
    """Remove ``folder``, and then its parents below ``root``, while they are empty; warn
    about the first that is not."""
    if any(folder.iterdir()):
        log.warning("%s holds files this run did not write (an earlier run's, or yours); "
                    "left as it was (delete it if it is not needed)", folder)
        return
    while folder != root and root in folder.parents and not any(folder.iterdir()):
        folder.rmdir()
        log.info("removed %s, an earlier run's output folder this run does not write", folder)
        folder = folder.parent


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
    device = resolve_device(opts.device)
    source = _source(opts)  # a missing or unreadable input is told before any folder is made
    out = prepare_dir(opts.out)  # and an unwritable output before the model loads
    with lock_run_folder(out):  # and another run writing there
        _remove_interrupted_writes(out)
        return _run_into(out, opts, source, device, started, progress, on_frame)


_RUN_FILES = (*(p for paths in _FORMAT_OUTPUTS.values() for p in paths if Path(p).suffix), "run.json", "progress.json")
"""The files a run writes directly in its output folder: its formats' files (the entries of
`_FORMAT_OUTPUTS` with a suffix; the others are folders), run.json and the frame store's
progress.json."""


def _remove_interrupted_writes(out: Path) -> None:
    """Delete the temp files of atomic writes that a killed run left behind
    (`io.atomic`: ``.<name>.tmp-<8 hex><suffix>``), and only a run's own: in the output folder
    those of the files it writes there, in its per-frame folders those of PNGs, in sparse/0
    those of COLMAP's files. Nothing below a link is touched (as the rerun cleanup), and no
    other file: another tool may be writing its own temp files here (`mapstream render`'s
    video, the viewer's screenshots), which the run's lock does not keep out."""
    from ..io.atomic import remove_stale_temp_files

    removed = remove_stale_temp_files(out, recursive=False, targets=lambda name: name in _RUN_FILES)
    for name in _PER_FRAME_FOLDERS:
        if not (out / name).is_symlink():
            removed += remove_stale_temp_files(out / name, recursive=False, targets=lambda n: n.endswith(".png"))
    if not (out / "sparse").is_symlink() and not (out / "sparse" / "0").is_symlink():
        removed += remove_stale_temp_files(out / "sparse" / "0", recursive=False, targets=lambda n: n in _COLMAP_FILES)
    if removed:
        log.info("removed %d temp files of an interrupted write in %s", len(removed), out)


def _run_into(out: Path, opts: RunOptions, source, device, started: float, progress, on_frame) -> RunSummary:
    """`run` once its options are checked, its input open and its folder held."""
    model, model_desc, warnings = resolve_model(
        opts.model, filename=opts.checkpoint_file, device=device, demo=opts.demo, backend=opts.backend,
        camera_num_iterations=opts.camera_iterations,
    )
    cache = _cache_config(model.cache_config, opts)
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
        "image_size": opts.image_size, "preprocess": opts.preprocess, "rotate": opts.rotate, "fps": opts.fps,
        "stride": opts.stride,
        "first_k": opts.first_k, "num_scale_frames": opts.num_scale_frames, "keyframe_interval": interval,
        "window_size": opts.window_size, "overlap": opts.overlap, "overlap_keyframes": opts.overlap_keyframes,
        "shared_from": opts.shared_from if opts.mode == "windowed" else None,
        "precision": precision,
        "cache_scale_frames": cache.scale_frames, "sliding_window": cache.sliding_window,
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
            model, window_size=opts.window_size, overlap_size=opts.overlap, overlap_keyframes=opts.overlap_keyframes,
            num_scale_frames=opts.num_scale_frames,
            keyframe_interval=interval, output_device="cpu", precision=precision,
            cache=cache, fast=opts.fast and device.type == "cuda", shared_from=opts.shared_from,
        )
    else:  # "streaming" (`check_options` took no other mode)
        session = model.session(
            num_scale_frames=opts.num_scale_frames, keyframe_interval=interval, output_device="cpu", precision=precision,
            cache=cache, fast=opts.fast and device.type == "cuda",
        )

    resume_at = store.finished
    overlap = min(resume_at, max(opts.num_scale_frames, 2))
    if resume_at:  # the cache of the interrupted stream is gone: say what the new frames come from
        log.warning(
            "resuming after %d finished frames: the stream restarts with the last %d of them as its scale frames and "
            "is aligned to them by Sim(3), so the frames after differ from an uninterrupted run's "
            "(--no-resume starts over)", resume_at, overlap,
        )
    anchors = store.last_records(overlap) if resume_at else []
    realign = _Realigner(anchors, resume_at - overlap) if resume_at else None
    offset = resume_at - overlap if realign is not None else 0
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

    earlier = _earlier_run(out)  # before this run's run.json replaces it
    previous = _previous_outputs(out, earlier)
    stopped_files, stopped_folders = _replacing_outputs(out, earlier)
    previous_known = list(dict.fromkeys([*_known_files(out, previous, _previous_stems(earlier)), *stopped_files]))
    previous = list(dict.fromkeys([*previous, *stopped_folders]))
    recon = store.assemble(fps=opts.fps)
    settings = {**config, "options": {k: str(v) for k, v in asdict(opts).items()}}  # run.json's "config"
    _mark_being_replaced(out, earlier, settings, opts.formats, recon.file_stems())
    if opts.sky_mask:
        recon = _with_sky_masks(recon, out, opts.sky_model, warnings, progress)
    outputs = export_all(
        recon, out, formats=opts.formats, conf_threshold=opts.conf_threshold, conf_percentile=opts.conf_percentile,
        voxel_size=opts.voxel_size, max_points=opts.max_points, drop_black=opts.drop_black_background,
        drop_white=opts.drop_white_background, progress=progress,
    )
    stems = recon.file_stems()
    _remove_stale_outputs(out, previous, outputs, _input_files(opts), previous_known, _known_files(out, outputs, stems))
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
