"""The run's input: opened, kept apart from the run's outputs, and its files listed so that
no cleanup removes one."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .options import RunOptions
from .outputs import FRAME_FOLDERS, RUN_FILES

if TYPE_CHECKING:
    from ..io.sources import FrameSource

__all__ = ["DEMO_HW", "check_input_apart_from_outputs", "frame_width", "input_files", "input_key", "open_input"]

DEMO_HW = (168, 294)  # the size the demo renders its frames at: the shipped small model's own


def input_key(spec: str | None) -> str | None:
    """The input as the run records it: an existing path resolved, so that `frames`,
    `./frames` and its absolute path are one input (a run resumes whichever is given)."""
    if spec is None or "://" in spec or not Path(spec).exists():
        return spec
    return str(Path(spec).resolve())


def check_input_apart_from_outputs(opts: RunOptions) -> None:
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


def input_files(opts: RunOptions) -> set[Path]:
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


def frame_width(opts: RunOptions, model_width: int) -> int:
    """The width a run's frames are preprocessed to: the demo's rendered width, else the
    options' `image_size`, else ``model_width`` (the model's own)."""
    if opts.demo:
        return DEMO_HW[1]
    return opts.image_size if opts.image_size is not None else model_width


def open_input(opts: RunOptions) -> FrameSource:
    """The run's frames: its input opened, or the demo's frames rendered into OUT/input."""
    from ..checkpoint import DEFAULT_IMAGE_SIZE
    from ..io.sources import open_source

    # No width given: the official one until the model's own is known (`run` opens again then).
    width = frame_width(opts, DEFAULT_IMAGE_SIZE)
    kwargs = dict(mode=opts.preprocess, image_size=width, stride=opts.stride, first_k=opts.first_k, rotate=opts.rotate)
    if opts.demo:
        return open_source(str(_demo_input(opts.out / "input", opts.demo_frames)), **kwargs)
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
