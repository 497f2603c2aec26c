"""A job's inputs: paths, globs and list files expanded into (input, output folder) pairs.

Each input gets one folder under the job's output folder, named by the part of its path that
tells it apart from the others: ``data/desk/rgb`` and ``data/room/rgb`` become ``desk`` and
``room`` (the parts every input shares are left out), ``videos/walk.mp4`` becomes ``walk``.
The same inputs always get the same names, so a rerun finds its folders again, and scenes of
a dataset folder get their scene's name, which `mapstream eval` pairs with the ground truth.
"""
from __future__ import annotations

import glob as globlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..io.images import IMAGE_EXTENSIONS

__all__ = ["JOB_RECORD", "JobInput", "expand_inputs", "is_list_file"]

JOB_RECORD = "job.json"  # the job's summary, beside the inputs' folders
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class JobInput:
    """One input of a job: ``input`` as `mapstream run` takes it, ``name`` of its folder
    ``out`` under the job's output folder."""

    input: str
    name: str
    out: Path


def is_list_file(spec: str) -> bool:
    """Whether ``spec`` names a list of inputs (a ``.txt`` file) rather than an input."""
    return spec.lower().endswith(".txt") and "://" not in spec


def expand_inputs(specs: Sequence[str], out_root: str | Path) -> list[JobInput]:
    """The job's inputs, in the order given: each spec is an input (a folder, a video file, a
    URL), a glob whose matches are inputs, or a ``.txt`` file listing inputs one a line
    (blank lines and lines starting with ``#`` skipped; relative paths are relative to the
    list's folder). Raises ValueError for a list file that is missing, a glob that matches
    nothing, a path that does not exist, an image file (a shell's expansion of an unquoted
    glob of frames, most likely), an input given twice, no input at all, or two inputs whose
    folders would have one name."""
    found: list[str] = []
    for spec in specs:
        found.extend(_expand(str(spec)))
    if not found:
        raise ValueError("no inputs given: name folders, videos, globs or a .txt file listing them")
    images = [spec for spec in found if "://" not in spec and Path(spec).suffix.lower() in IMAGE_EXTENSIONS]
    if images:
        raise ValueError(
            f"the input {images[0]} is an image: a job's inputs are folders, videos or streams, each one sequence; "
            "for one sequence of images give their folder, or their glob in quotes without --many"
        )
    seen: dict[str, str] = {}
    for spec in found:
        key = _identity(spec)
        if key in seen:
            raise ValueError(f"the input {spec} is given twice (also as {seen[key]}): each input is run once")
        seen[key] = spec
    names = _folder_names(found)
    by_name: dict[str, str] = {}
    for spec, name in zip(found, names):
        if name in by_name or name == JOB_RECORD:
            other = by_name.get(name, "the job's summary")
            raise ValueError(f"the inputs {other} and {spec} would both write to the folder {name}: rename one")
        by_name[name] = spec
    root = Path(out_root)
    return [JobInput(spec, name, root / name) for spec, name in zip(found, names)]


def _expand(spec: str) -> list[str]:
    if "://" in spec:
        return [spec]
    if is_list_file(spec):
        return _read_list(Path(spec))
    if any(c in spec for c in "*?["):
        matches = sorted(globlib.glob(spec, recursive=True))
        if not matches:
            raise ValueError(f"no input matches the glob {spec!r}")
        return matches
    if not Path(spec).exists():
        raise ValueError(f"the input {spec} does not exist")
    return [spec]


def _read_list(path: Path) -> list[str]:
    if not path.is_file():
        raise ValueError(f"the list of inputs {path} does not exist")
    specs = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "://" not in line and not Path(line).is_absolute():
            line = str(path.parent / line)
        if is_list_file(line):
            raise ValueError(f"{path} lists another list file ({line}): list the inputs themselves")
        specs.extend(_expand(line))
    if not specs:
        raise ValueError(f"the list of inputs {path} names no input")
    return specs


def _identity(spec: str) -> str:
    """One key for one input however it is spelled (a path resolved, a URL as given)."""
    return spec if "://" in spec else str(Path(spec).resolve())


def _parts(spec: str) -> list[str]:
    """The input's path components, the last one without its file extension."""
    if "://" in spec:
        parts = [p for p in PurePosixPath(spec.split("://", 1)[1].split("?", 1)[0]).parts if p != "/"]
    else:
        path = Path(spec).resolve()
        parts = [p for p in path.parts if p != path.anchor]
        if path.is_file() and parts:
            parts[-1] = path.stem
    parts = [_UNSAFE.sub("_", p).strip("._") for p in parts]
    return [p for p in parts if p] or ["input"]


def _folder_names(specs: list[str]) -> list[str]:
    """Each input's name: its last path component when those are unique; else the components
    every input shares at the end are left out and as many of the last remaining ones are
    joined (by ``_``) as tell the inputs apart."""
    parts = [_parts(s) for s in specs]
    last = [p[-1] for p in parts]
    if len(set(last)) == len(last):
        return last
    shared = 0
    while all(len(p) > shared + 1 for p in parts) and len({p[-1 - shared] for p in parts}) == 1:
        shared += 1
    rest = [p[: len(p) - shared] for p in parts]
    for take in range(1, max(len(r) for r in rest) + 1):
        names = ["_".join(r[-take:]) for r in rest]
        if len(set(names)) == len(names):
            return names
    return last  # the same path but for unsafe characters: `expand_inputs` tells which two
