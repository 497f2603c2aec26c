"""Camera path files for `mapstream render --path FILE`: a YAML or JSON list of segments.

::

    transition: 10            # frames over which a segment takes over from the one before
    segments:
      - {mode: static, frames: [0, 29]}
      - {mode: follow, frames: [30, 89], back: 0.3, height: 0.15}
      - {mode: pivot,  frames: [90, 149], turns: 0.5}    # or degrees: 180
      - {mode: birdeye, frames: [150, 199]}

``frames`` are ``[start, end]``, both included, numbered from 0 (the first frame rendered);
segments follow each other without gaps or overlaps, the first starting at 0. Parameters,
in multiples of the scene's extent: follow ``back``, ``height``, ``ahead`` (defaults 0.25,
0.12, 0.25); pivot ``turns`` or ``degrees`` over the segment (default one turn,
counter-clockwise seen from above). birdeye and static take none. The file may also be a
bare list of segments (transition 10). Everything is checked here, before a run is read;
errors name the segment and the field.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from mapstream.render.path import PATH_MODES, PathSegment, PathStyle, SegmentedPath

__all__ = ["MODE_FIELDS", "PATH_FILE_SUFFIXES", "load_path_file", "parse_segmented_path"]

PATH_FILE_SUFFIXES: tuple[str, ...] = (".yaml", ".yml", ".json")

MODE_FIELDS: dict[str, tuple[str, ...]] = {
    "follow": ("back", "height", "ahead"),
    "birdeye": (),
    "static": (),
    "pivot": ("turns", "degrees"),
}
"""The parameters each mode takes besides ``mode`` and ``frames``."""

_TOP_LEVEL = ("segments", "transition")


def load_path_file(path: str | os.PathLike[str]) -> SegmentedPath:
    """Read and check the path file ``path`` (``.yaml``/``.yml``: needs PyYAML; ``.json``).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: another suffix, a file that does not parse, or a segment that is not
            right (the message names the file, the segment and the field).
        ImportError: a YAML file without PyYAML installed.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in PATH_FILE_SUFFIXES:
        raise ValueError(f"{path}: a camera path file must end in {', '.join(PATH_FILE_SUFFIXES)}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such camera path file")
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON: {error}") from error
    else:
        yaml = _yaml()
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: not valid YAML: {error}") from error
    try:
        return parse_segmented_path(data)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error


def parse_segmented_path(data: object) -> SegmentedPath:
    """The :class:`SegmentedPath` a parsed path file describes: a mapping with ``segments``
    (a list) and an optional ``transition`` (frames, default 10), or a bare list of segments.
    ValueError naming the segment index and the field on anything unexpected."""
    if isinstance(data, list):
        data = {"segments": data}
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping with 'segments' (and 'transition'), or a list of segments, "
                         f"got {_kind(data)}")
    unknown = sorted(str(key) for key in data if key not in _TOP_LEVEL)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (the file has {', '.join(_TOP_LEVEL)})")
    segments = data.get("segments")
    if not isinstance(segments, list) or not segments:
        raise ValueError(f"'segments' must be a non-empty list of segments, got {_kind(segments)}")
    transition = data.get("transition", SegmentedPath.__dataclass_fields__["transition"].default)
    if isinstance(transition, bool) or not isinstance(transition, int) or transition < 0:
        raise ValueError(f"'transition' must be a whole number of frames >= 0, got {transition!r}")
    return SegmentedPath(tuple(_segment(index, item) for index, item in enumerate(segments)), transition)


def _segment(index: int, item: object) -> PathSegment:
    where = f"segment {index}"
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a mapping such as {{mode: follow, frames: [0, 99]}}, got {_kind(item)}")
    mode = item.get("mode")
    if mode not in PATH_MODES:
        raise ValueError(f"{where}: field 'mode' must be one of {', '.join(PATH_MODES)}, got {mode!r}")
    allowed = ("mode", "frames", *MODE_FIELDS[mode])
    for key in item:
        if key not in allowed:
            takes = ", ".join(MODE_FIELDS[mode]) or "no parameters"
            raise ValueError(f"{where}: unknown field {key!r} for mode {mode} (it takes {takes})")
    start, end = _frames(where, item.get("frames"))
    params = {name: _number(where, name, item[name]) for name in MODE_FIELDS[mode] if name in item}
    if "turns" in params and "degrees" in params:
        raise ValueError(f"{where}: give field 'turns' or field 'degrees', not both")
    if "degrees" in params:
        params["turns"] = params.pop("degrees") / 360.0
    try:
        style = PathStyle(mode=mode, **params)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return PathSegment(style=style, start=start, end=end)


def _frames(where: str, value: object) -> tuple[int, int]:
    if value is None:
        raise ValueError(f"{where}: field 'frames' is missing; give [start, end], both included")
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
        raise ValueError(f"{where}: field 'frames' must be [start, end], two whole frame numbers, got {value!r}")
    start, end = value
    if not 0 <= start <= end:
        raise ValueError(f"{where}: field 'frames' must be [start, end] with 0 <= start <= end, got {list(value)}")
    return start, end


def _number(where: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: field {name!r} must be a finite number, got {value!r}")
    return float(value)


def _kind(value: object) -> str:
    """``value`` for an error message: its repr, cut short, and its type."""
    if value is None:
        return "nothing"
    text = repr(value)
    return f"{text if len(text) <= 60 else text[:57] + '...'} ({type(value).__name__})"


def _yaml():
    """PyYAML, or an ImportError saying how to install it (or to write JSON instead)."""
    try:
        import yaml
    except ImportError as error:
        raise ImportError(
            "reading a YAML camera path file needs PyYAML: pip install pyyaml (or 'mapstream[video]'), "
            "or write the file as JSON (.json)"
        ) from error
    return yaml
