"""A graphed step lives exactly as long as what holds it: no reference cycle keeps it (and with it
the captured graphs' memory and the cache storage its device steps point at) alive until the
garbage collector's cycle search happens to run. Checked with the collector off, on the CPU
(capture=False: the same objects without CUDA graphs)."""
from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

import mapstream
from mapstream.fast import GraphedStep


@pytest.fixture(scope="module")
def model():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


@pytest.fixture
def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _graphed_steps() -> list[weakref.ref]:
    with warnings.catch_warnings():  # looking at every object touches deprecated module attributes
        warnings.simplefilter("ignore", FutureWarning)
        return [weakref.ref(o) for o in gc.get_objects() if isinstance(o, GraphedStep)]


FRAMES = torch.rand(6, 3, 28, 42, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("fast", ["pieces", "whole"])
def test_a_closed_sessions_graphed_step_is_freed_at_once(model, collector_off, fast):
    session = model.session(num_scale_frames=2, sliding_window=3, fast=fast)
    with torch.no_grad():
        session.run_frames(FRAMES)
    steps = _graphed_steps()
    assert len(steps) == 1 and steps[0]().whole == (fast == "whole")
    session.close()
    assert steps[0]() is None  # closed: the session gave it back
    del session


@pytest.mark.parametrize("fast", ["pieces", "whole"])
def test_a_dropped_sessions_graphed_step_is_freed_with_it(model, collector_off, fast):
    session = model.session(num_scale_frames=2, sliding_window=3, fast=fast)
    with torch.no_grad():
        session.run_frames(FRAMES)
    (step,) = _graphed_steps()
    del session  # never closed
    assert step() is None


def test_the_batched_graphs_of_a_group_go_when_its_last_session_goes(model, collector_off):
    sessions = [model.session(num_scale_frames=2, sliding_window=3, fast=True) for _ in range(2)]
    with torch.no_grad():
        for i in range(FRAMES.shape[0]):
            mapstream.step_together(sessions, [FRAMES[i], FRAMES[i].flip(-1)])
    batched = [ref for ref in _graphed_steps() if ref().streams == 2]
    assert len(batched) == 1  # built once the group size repeated
    sessions.pop().close()
    assert batched[0]() is not None  # the other session still holds them
    sessions.clear()
    assert batched[0]() is None


def test_a_new_group_size_frees_the_last_sizes_batched_graphs_before_capturing_its_own(model, collector_off):
    sessions = [model.session(num_scale_frames=2, sliding_window=3, fast=True) for _ in range(3)]
    captured = []

    def batched() -> list:
        return [ref for ref in _graphed_steps() if ref().streams > 1]

    with torch.no_grad():
        for i, size in enumerate([3, 3, 3, 3, 2, 2]):  # steps 0-1: scale phases; step 3: three captured
            if i == 4:
                captured = batched()
            mapstream.step_together(sessions[:size], [FRAMES[i].roll(b, -1) for b in range(size)])
    (three,) = captured
    assert three() is None  # the left-out session still holds the slot, not the old graphs
    (two,) = batched()
    assert two().streams == 2 and all(s.batched_slot.graphs is two() for s in sessions)
