"""Several online streams stepped together: their frames go through one batched forward.

    a, b = model.session(), model.session()
    for frame_a, frame_b in zip(camera_a, camera_b):
        preds_a, preds_b = mapstream.step_together([a, b], [frame_a, frame_b])

Each session gets exactly what `session.step(frame)` would have given it (same caches, same
keyframe decisions; values equal up to the rounding of batched matrix products). The
per-frame work (ViT, frame blocks, projections, MLPs, heads) runs once for the whole batch;
the global and camera-head attention still read each stream's own cache. Sessions still in
their scale phase, or whose model, frame size, device, precision or attention backend differ from the others',
are stepped on their own. Batched steps run eagerly (no CUDA graphs): the gain is that one
pass of launches serves N streams.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .models.aggregator import kv_dtype
from .session import FramePrediction, Session, _autocast
from .validation import keyframe_flag

__all__ = ["step_together"]


@torch.no_grad()
def step_together(
    sessions: Sequence[Session],
    frames: Sequence[torch.Tensor],
    *,
    keyframes: Sequence[bool | None] | None = None,
    names: Sequence[str | None] | None = None,
) -> list[list[FramePrediction]]:
    """Feed frame b ([3, H, W] in [0, 1]) to session b for every b, batching what can be
    batched. Returns, per session, what its `step` would have returned.

    Every frame is validated before any session changes state, so a bad frame raises
    (naming its position) and leaves all sessions as they were.
    """
    count = len(sessions)
    keyframes = list(keyframes) if keyframes is not None else [None] * count
    names = list(names) if names is not None else [None] * count
    if not len(frames) == len(keyframes) == len(names) == count:
        raise ValueError(
            f"{count} sessions need as many frames, keyframe flags and names "
            f"(got {len(frames)}, {len(keyframes)}, {len(names)})"
        )
    for b, session in enumerate(sessions):
        if not isinstance(session, Session):
            raise TypeError(
                f"sessions[{b}] is a {type(session).__name__}; step_together takes mapstream.Session objects "
                "(step other kinds of stream on their own)"
            )
    if len({id(s) for s in sessions}) != count:
        raise ValueError("a session appears twice; its frames are sequential, step them in separate calls")
    try:
        keyframes = [keyframe_flag(k) for k in keyframes]
    except TypeError as err:
        raise TypeError(f"keyframes: {err}") from err
    checked = []
    for b, (session, frame) in enumerate(zip(sessions, frames)):
        session._check_open()
        try:
            checked.append(session._check_frame(frame))
        except ValueError as err:
            raise ValueError(f"frame {b}: {err}") from err

    results: list[list[FramePrediction]] = [[] for _ in range(count)]
    groups: dict[tuple, list[int]] = {}
    for b, session in enumerate(sessions):
        if session.in_scale_phase:
            results[b] = session._step_checked(checked[b], keyframes[b], names[b])
        else:
            key = (id(session.model), tuple(checked[b].shape[-2:]), session.device, session.precision,
                   session.config.backend)
            groups.setdefault(key, []).append(b)
    for members in groups.values():
        if len(members) == 1:
            b = members[0]
            results[b] = sessions[b]._step_checked(checked[b], keyframes[b], names[b])
            continue
        batched = _step_batch([sessions[b] for b in members], [checked[b] for b in members],
                              [keyframes[b] for b in members], [names[b] for b in members])
        for b, preds in zip(members, batched):
            results[b] = preds
    return results


def _step_batch(sessions, frames, keyframes, names) -> list[list[FramePrediction]]:
    """One batched forward for sessions past their scale phase sharing model, size, precision."""
    lead = sessions[0]
    plans = [s._plan(k, n) for s, k, n in zip(sessions, keyframes, names)]
    batch = torch.cat(frames).to(lead.device, non_blocking=True)  # [N, 1, 3, H, W]
    with _autocast(lead.device, lead.precision):
        out = lead.model.forward_streams(
            batch, [s.state for s in sessions], stores=[p.store for p in plans],
            num_frame_for_scale=[s._scale for s in sessions], backend=lead.backend_for(kv_dtype(batch)),
            validate=False,
        )
    return [
        session._complete(plan, session._to_output({k: v[row : row + 1] for k, v in out.items()}))
        for row, (session, plan) in enumerate(zip(sessions, plans))
    ]
