"""What a run folder's records say about the predictions in it, before anyone looks at them:
whether the run finished, and whether its weights were untrained or mapstream's own small model.

`mapstream run` keeps its finished frames in ``.frames/`` and counts them in
``progress.json`` as they come, and writes ``run.json`` last. So a folder whose
``progress.json`` counts frames that run.json does not vouch for (no run.json, another
configuration, another number of frames) holds a run that stopped before its exports, and a
run.json with a ``state`` is the mark of a run that stopped while writing them (its
``replaced_by`` entries say what that run was writing). Either way the same ``mapstream run``
command resumes it. A run on the tiny preset's seeded random weights records its model as
``tiny (synthetic weights)`` and that warning in run.json, a run on the shipped small model
:data:`mapstream.weights.SMALL_MODEL` and its warning; the predictions are that run's, or,
after a run stopped while writing its outputs, possibly the stopped run's.

Only the records are read here; what predictions.npz holds is :func:`mapstream.viewer.load_run`'s.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..export.run_info import names_untrained_weights
from ..weights import SMALL_WARNING, names_small_weights

__all__ = ["PREDICTIONS_NAME", "RunNotes", "frames_named", "read_run_notes"]

PREDICTIONS_NAME = "predictions.npz"

UNTRAINED_WARNING_MARK = "untrained (synthetic) weights"
"""What the warning such a run records says (in capitals)."""
UNTRAINED_NOTE = (
    "These predictions come from untrained weights (the tiny preset's seeded random weights): they exercise "
    "every stage of mapstream but are not a reconstruction of the scene. Run `mapstream run` with the official "
    "checkpoint (--model) for real results."
)
SMALL_NOTE = (
    "These predictions come from mapstream's own small model, trained on procedural rooms only, not from the "
    "official LingBot-Map weights: its cameras and depth are far less accurate. Run `mapstream run` with the "
    "official checkpoint (--model) for the official model's results."
)


@dataclass(frozen=True)
class RunNotes:
    """What a run folder's records say; None where there is nothing to say."""

    unfinished: str | None = None
    """That a run into the folder did not finish, the frames it finished, and how to finish it."""
    weights: str | None = None
    """That the predictions come from untrained weights or from mapstream's small model."""

    @property
    def messages(self) -> tuple[str, ...]:
        return tuple(note for note in (self.unfinished, self.weights) if note is not None)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def frames_named(names: list[Any]) -> str:
    """``N frames (FIRST to LAST)``, or ``N frames`` without usable names."""
    count = f"{len(names)} frame{'s' if len(names) != 1 else ''}"
    if not names or not all(isinstance(n, str) for n in names):
        return count
    return f"{count} ({names[0]})" if len(names) == 1 else f"{count} ({names[0]} to {names[-1]})"


def _progress_names(progress: dict[str, Any]) -> list[Any]:
    names: list[Any] = []
    for shard in progress.get("shards", []) if isinstance(progress.get("shards"), list) else []:
        names.extend(_dict(shard).get("names", []) or [])
    return names


def _resume_hint(folder: Path, settings: dict[str, Any]) -> str:
    """How to finish the run: its own command again, which resumes from the frames it kept."""
    given = _dict(settings.get("options")).get("input") or settings.get("input")
    source = "--demo" if settings.get("input") == "demo" else str(given) if given else "INPUT"
    return (f"run the same command again: `mapstream run {source} ... --out {folder}`, with the options it had, "
            "resumes from the frames it kept")


def _stopped_exporting(folder: Path, info: dict[str, Any]) -> str:
    entries = [e for e in info.get("replaced_by", []) if isinstance(e, dict)] if isinstance(
        info.get("replaced_by"), list) else []
    last = entries[-1] if entries else {}
    stems = last.get("frame_stems") if isinstance(last.get("frame_stems"), list) else []
    frames = f" after inferring {frames_named(stems)}" if stems else ""
    held = "may mix that run's with an earlier run's" if "frames" in info else "may be only part of its outputs"
    return (f"The run in {folder} did not finish: it stopped while writing its outputs{frames}, so the files here "
            f"{held}. To finish it, {_resume_hint(folder, _dict(last.get('settings')))}.")


def _unfinished_after(info: dict[str, Any] | None, progress: dict[str, Any] | None) -> bool:
    """Whether ``progress`` counts frames of a run that ``info`` (the finished run's record) is not."""
    frames = (progress or {}).get("frames")
    if not isinstance(frames, int) or frames <= 0:
        return False
    if info is None:
        return True
    recorded = _dict(info.get("config"))
    kept = _dict((progress or {}).get("config"))
    same_config = bool(recorded) and all(recorded.get(key) == value for key, value in kept.items())
    return not same_config or info.get("frames") != frames


def _stopped_streaming(folder: Path, info: dict[str, Any] | None, progress: dict[str, Any]) -> str:
    names = _progress_names(progress)
    kept = frames_named(names) if names else f"{progress['frames']} frames"
    earlier = (f"; the outputs here are those of an earlier run ({info['frames']} frames)"
               if info is not None and isinstance(info.get("frames"), int) else "")
    return (f"A run into {folder} did not finish: it stopped after {kept}, kept in {folder / '.frames'} but not "
            f"exported{earlier}. To finish it, {_resume_hint(folder, _dict(progress.get('config')))}.")


def _weights_note(info: dict[str, Any]) -> str | None:
    """What to say of the weights of a run whose outputs may be in the folder: the finished run
    of run.json, or a run that stopped while writing its outputs over it. (A run that stopped
    before its exports wrote none.)"""
    models = [_dict(info.get("config")).get("model")]
    if isinstance(info.get("replaced_by"), list):
        models += [_dict(_dict(e).get("settings")).get("model") for e in info["replaced_by"]]
    recorded = info.get("warnings")
    warnings = [w.lower() for w in recorded if isinstance(w, str)] if isinstance(recorded, list) else []
    if any(names_untrained_weights(m) for m in models) or any(UNTRAINED_WARNING_MARK in w for w in warnings):
        return UNTRAINED_NOTE
    if any(names_small_weights(m) for m in models) or SMALL_WARNING.lower() in warnings:
        return SMALL_NOTE
    return None


def read_run_notes(run: str | os.PathLike[str]) -> RunNotes:
    """The notes of run folder ``run`` (or of the folder of its ``predictions.npz``, given as a
    path); none for a folder without a run's records, or another ``.npz`` file."""
    path = Path(run)
    if path.suffix == ".npz" and not path.is_dir():
        if path.name != PREDICTIONS_NAME:  # a copy elsewhere: the folder's records are not about it
            return RunNotes()
        path = path.parent
    folder = path
    info = _read_json(folder / "run.json")
    progress = _read_json(folder / "progress.json")
    if info is not None and "state" in info:
        unfinished: str | None = _stopped_exporting(folder, info)
    elif progress is not None and _unfinished_after(info, progress):
        unfinished = _stopped_streaming(folder, info, progress)
    else:
        unfinished = None
    return RunNotes(unfinished=unfinished, weights=_weights_note(info or {}))
