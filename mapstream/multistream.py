"""Several online streams stepped together: their frames go through one batched forward.

    a, b = model.session(), model.session()
    for frame_a, frame_b in zip(camera_a, camera_b):
        preds_a, preds_b = mapstream.step_together([a, b], [frame_a, frame_b])

Each session gets exactly what `session.step(frame)` would have given it (same caches, same
keyframe decisions; values equal up to the rounding of batched matrix products). The
per-frame work (ViT, frame blocks, projections, MLPs, heads) runs once for the whole batch;
the global and camera-head attention still read each stream's own cache. Sessions still in
their scale phase, or whose model, frame size, device, precision or attention backend differ from the others',
are stepped on their own. A `WindowedSession` joins the batch with its current window's
session; a window that opens on this frame first feeds its shared frames again on its own.

A batch whose sessions all have the fast path on (`fast`) runs in the pieces form of
`mapstream.fast`, N frames wide (`BatchedPiecewiseGraphs`: CUDA graphs between each stream's
eager cache attentions; on a CPU the same decomposition eagerly), once the group has had the
same number of sessions twice in a row: a group whose size changes every call would capture
graphs it never replays. Each (model, frame size, device, precision, attention backend)
keeps the graphs of its latest group size only (`BatchedSlot`), replayed for every batch of
that size: a server whose batches change size holds one set of batched graphs, not one a
size. Otherwise a batch runs the eager batched forward (`GCTNetwork.forward_streams`); the
reason is logged at debug level.
"""
from __future__ import annotations

import logging
import weakref
from typing import Sequence

import torch

from .fast import BatchedPiecewiseGraphs
from .models.aggregator import kv_dtype
from .session import FramePrediction, Session
from .validation import keyframe_flag
from .windowed import WindowedSession

__all__ = ["step_together"]

log = logging.getLogger(__name__)

# model -> {(frame size, device, precision, backend): the group size last seen}, gone with the model.
_last_sizes: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


class BatchedSlot:
    """Where the batched graphs of one (model, frame size, device, precision, backend) live:
    those of one group size at a time (graphs of another size replace them, the old ones
    freed before the new are captured). Every session stepped in a batch of that key holds
    the slot (`Session.batched_slot`), so the graphs live as long as one of those sessions
    (and with them the model, whose id keys the slot) and no longer: the graphs hold the model."""

    __slots__ = ("graphs", "__weakref__")

    def __init__(self) -> None:
        self.graphs: BatchedPiecewiseGraphs | None = None


# (id(model), the same key) -> its slot, kept alive by the sessions that hold it.
_slots: "weakref.WeakValueDictionary[tuple, BatchedSlot]" = weakref.WeakValueDictionary()


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
        if not isinstance(session, (Session, WindowedSession)):
            raise TypeError(
                f"sessions[{b}] is a {type(session).__name__}; step_together takes mapstream.Session and "
                "mapstream.WindowedSession objects (step other kinds of stream on their own)"
            )
    if len({id(s) for s in sessions}) != count:
        raise ValueError("a session appears twice; its frames are sequential, step them in separate calls")
    try:
        keyframes = [keyframe_flag(k) for k in keyframes]
    except TypeError as err:
        raise TypeError(f"keyframes: {err}") from err
    for b, (session, keyframe) in enumerate(zip(sessions, keyframes)):
        if isinstance(session, WindowedSession) and keyframe is not None:
            raise ValueError(f"keyframes[{b}]: a WindowedSession stores frames at its fixed interval and takes no "
                             "keyframe flag (give None)")
    windowed = {b: s for b, s in enumerate(sessions) if isinstance(s, WindowedSession)}
    stepped = [s.session if b in windowed else s for b, s in enumerate(sessions)]
    checked = []
    for b, (session, frame) in enumerate(zip(stepped, frames)):
        try:
            checked.append(session.check_frame(frame))
        except ValueError as err:
            raise ValueError(f"frame {b}: {err}") from err

    opened = {b: s.begin_step() for b, s in windowed.items()}
    results = _step_sessions(stepped, checked, keyframes, names)
    for b, session in windowed.items():
        results[b] = opened[b] + session.end_step(frames[b], results[b], name=names[b])
    return results


def _step_sessions(sessions: Sequence[Session], checked, keyframes, names) -> list[list[FramePrediction]]:
    """`step_together` for sessions and frames that passed its checks."""
    results: list[list[FramePrediction]] = [[] for _ in sessions]
    groups: dict[tuple, list[int]] = {}
    for b, session in enumerate(sessions):
        if session.in_scale_phase:
            results[b] = session.step_checked(checked[b], keyframe=keyframes[b], name=names[b])
        else:
            key = (id(session.model), tuple(checked[b].shape[-2:]), session.device, session.precision,
                   session.config.backend)
            groups.setdefault(key, []).append(b)
    for members in groups.values():
        if len(members) == 1:
            b = members[0]
            results[b] = sessions[b].step_checked(checked[b], keyframe=keyframes[b], name=names[b])
            continue
        batched = _step_batch([sessions[b] for b in members], [checked[b] for b in members],
                              [keyframes[b] for b in members], [names[b] for b in members])
        for b, preds in zip(members, batched):
            results[b] = preds
    return results


def _step_batch(sessions, frames, keyframes, names) -> list[list[FramePrediction]]:
    """One batched forward for sessions past their scale phase sharing model, size, precision."""
    lead = sessions[0]
    plans = [s.plan_step(k, n) for s, k, n in zip(sessions, keyframes, names)]
    batch = torch.cat(frames).to(lead.device, non_blocking=True)  # [N, 1, 3, H, W]
    states, stores = [s.state for s in sessions], [p.store for p in plans]
    graphs = _batched_graphs(sessions, tuple(batch.shape[-2:]))
    with lead.autocast():
        backend = lead.backend_for(kv_dtype(batch))
        if graphs is not None:
            out = graphs(batch, states, stores=stores, backend=backend)
        else:
            out = lead.model.forward_streams(
                batch, states, stores=stores, num_frame_for_scale=[p.scale for p in plans], backend=backend,
                validate=False,
            )
    return [
        session.complete_step(plan, {k: v[row : row + 1] for k, v in out.items()})
        for row, (session, plan) in enumerate(zip(sessions, plans))
    ]


def _batched_graphs(sessions: Sequence[Session], image_hw: tuple[int, int]) -> BatchedPiecewiseGraphs | None:
    """The batched fast step for this group (sessions sharing model, frame size, device,
    precision and backend), or None for the eager batched forward (module docstring)."""
    lead, count = sessions[0], len(sessions)
    if not all(s.fast for s in sessions):
        log.debug("step_together: %d sessions run the eager batched forward: the fast path is off in "
                  "at least one of them", count)
        return None
    key = (image_hw, lead.device, lead.precision, lead.config.backend)
    slot = _slots.get((id(lead.model), key))
    if slot is not None and slot.graphs is not None and slot.graphs.streams == count:
        return _held(sessions, slot)
    sizes = _last_sizes.setdefault(lead.model, {})
    previous, sizes[key] = sizes.get(key), count
    if previous != count:
        log.debug("step_together: %d sessions run the eager batched forward: the group had %s sessions "
                  "last time (graphs are built once a group size repeats)", count, previous)
        return None
    if slot is None:
        slot = _slots[(id(lead.model), key)] = BatchedSlot()
    slot.graphs = None  # another group size's graphs are freed before these are captured
    with lead.autocast():
        slot.graphs = BatchedPiecewiseGraphs(lead.model, image_hw, streams=count, capture=lead.device.type == "cuda")
    return _held(sessions, slot)


def _held(sessions: Sequence[Session], slot: BatchedSlot) -> BatchedPiecewiseGraphs:
    """The slot's graphs, now that each of `sessions` holds the slot (what keeps it alive)."""
    for session in sessions:
        session.batched_slot = slot
    return slot.graphs
