"""`--frames START:STOP[:STEP]`: a part of a run, for the commands that read one."""
from __future__ import annotations


def frame_slice(text: str) -> slice:
    """Python slice notation over the run's frames: ``0:100``, ``50:``, ``::2``, ``-30:``.

    Raises:
        ValueError: not two or three integer fields, or a step that is not positive.
    """
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        start, stop, step = (int(p) if p.strip() else None for p in (parts + [""])[:3])
    except ValueError:
        raise ValueError(
            f"--frames {text!r}: expected START:STOP or START:STOP:STEP with integers (e.g. 0:100, 50:, ::2)"
        ) from None
    if step is not None and step < 1:
        raise ValueError(f"--frames {text!r}: the step must be a positive integer (frames stay in time order)")
    return slice(start, stop, step)


def select_frames(recon, text: str | None):
    """``recon`` restricted to ``--frames text`` (all of it for None); a clear error when the
    selection is empty."""
    if text is None:
        return recon
    chosen = range(len(recon))[frame_slice(text)]
    if len(chosen) == 0:
        raise ValueError(f"--frames {text}: selects none of the run's {len(recon)} frames (numbered from 0)")
    return recon.select(list(chosen))
