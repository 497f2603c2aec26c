"""Windowed sessions on the server: a session runs windows when its mode says so, or the
server's "auto" does on weights that record their training clip length, and then answers
every frame once with what a local `WindowedSession` of the same settings gives (bit for
bit with --max-batch 1)."""
from __future__ import annotations

import pytest
from safetensors.torch import save_file

import mapstream
from mapstream.client import Client, ServiceError
from mapstream.config import StreamConfig
from mapstream.windowed import WindowedSession

from serve_helpers import as_tensor, assert_exact, events, frames, results, send_sequences, serving, tiny_model

VIEWS = 5
SERVER = StreamConfig(overlap=2)  # the windows' overlap is the server's; a window of 5 needs a shorter one


@pytest.fixture(scope="module")
def clip_model(tmp_path_factory):
    """The tiny network, from a file that records training clips of VIEWS frames."""
    path = tmp_path_factory.mktemp("weights") / "views.safetensors"
    save_file(dict(tiny_model().state_dict()), str(path), metadata={"preset": "tiny", "trained_views": str(VIEWS)})
    return mapstream.load_model(path, preset="tiny")


def local_windows(model, images, **settings) -> list:
    with WindowedSession(model, output_device="cpu", **settings) as session:
        preds = []
        for image in images:
            preds += session.step(as_tensor(image))
        return preds + session.flush()


def served(model, images, *, server=SERVER, **open_options):
    with serving(model, max_batch=1, stream=server) as running:
        session = Client(running.url).open_session(depth=True, dtype="float32", **open_options)
        return session.info, send_sequences(session, images)


def test_a_live_session_runs_windows_of_the_weights_clip_length_and_answers_each_frame_as_it_comes(clip_model):
    images = frames(31, 13)
    info, answers = served(clip_model, images, settings={"num_scale_frames": 2})
    assert info["mode"] == "windowed" and info["trained_views"] == VIEWS
    assert info["windows"] == {"window_size": VIEWS, "overlap": 2, "overlap_keyframes": None, "shared_from": "earlier",
                               "window_join": "shared", "span": VIEWS, "overlap_frames": 2}
    assert info["settings"]["keyframe_interval"] == 1  # every frame of a window is stored
    got = results(answers)
    assert [r.frame for r in got] == [r.index for r in got] == list(range(13))  # once each, in order
    want = local_windows(clip_model, images, num_scale_frames=2, keyframe_interval=1, window_size=VIEWS, overlap=2,
                         shared_from="earlier")
    for result, pred in zip(got, want, strict=True):
        assert_exact(result, pred)
    # Live frames are answered as they come: only the first window's scale phase buffers.
    assert [e.frame for e in events(answers, "buffered")] == [0]


def test_a_session_that_announces_its_frames_is_planned_as_a_run_of_that_input(clip_model):
    short, long = frames(32, VIEWS), frames(33, 12)
    info, answers = served(clip_model, short, settings={"num_scale_frames": 2}, frames=VIEWS)
    assert info["mode"] == "streaming" and info["windows"] is None  # it fits one training clip
    assert len(results(answers)) == VIEWS
    info, answers = served(clip_model, long, settings={"num_scale_frames": 2}, frames=12)
    assert info["mode"] == "windowed" and info["windows"]["shared_from"] == "later"  # as a run of a known input
    got = results(answers)
    assert sorted(r.index for r in got) == list(range(12))
    want = local_windows(clip_model, long, num_scale_frames=2, keyframe_interval=1, window_size=VIEWS, overlap=2)
    for result, pred in zip(sorted(got, key=lambda r: r.index), sorted(want, key=lambda p: p.index), strict=True):
        assert_exact(result, pred)
    # A window's last frames wait for the next window, which predicts them again.
    assert 4 in {e.frame for e in events(answers, "buffered")}


def test_the_client_or_the_server_chooses_the_mode(clip_model):
    images = frames(34, 9)
    info, answers = served(clip_model, images, settings={"num_scale_frames": 2}, mode="streaming")
    assert info["mode"] == "streaming" and info["settings"]["keyframe_interval"] is None
    local = mapstream.Session(clip_model, num_scale_frames=2, output_device="cpu")
    want = [p for image in images for p in local.step(as_tensor(image))] + local.flush()
    for result, pred in zip(results(answers), want, strict=True):
        assert_exact(result, pred)
    # Weights that record no clip length stream through one cache, unless windows are asked for.
    plain = tiny_model()
    info, _ = served(plain, images[:3], settings={"num_scale_frames": 2})
    assert info["mode"] == "streaming" and info["trained_views"] is None
    server = SERVER.with_settings(window_size=4, overlap=1)
    info, answers = served(plain, images, server=server, settings={"num_scale_frames": 2, "window_join": "anchor"},
                           mode="windowed")
    assert info["mode"] == "windowed" and info["windows"]["window_size"] == 4
    assert info["windows"]["window_join"] == "anchor" and info["windows"]["shared_from"] == "later"
    want = local_windows(plain, images, num_scale_frames=2, window_size=4, overlap=1, window_join="anchor")
    for result, pred in zip(sorted(results(answers), key=lambda r: r.index), want, strict=True):
        assert_exact(result, pred)


def test_a_windowed_session_refuses_keyframe_flags_and_provisional_predictions_with_reasons(clip_model):
    images = frames(35, 6)
    with serving(clip_model, max_batch=1, stream=SERVER) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 2, "provisional": True})
        assert session.info["mode"] == "windowed"
        assert any("no provisional predictions: this session runs windows" in w for w in session.info["warnings"])
        sent = [session.send(image, keyframe=True if i == 3 else None) for i, image in enumerate(images)]
        answers = session.close()
    refused = events(answers, "error")
    assert [(e.frame, e.data["code"], e.data["fatal"]) for e in refused] == [(3, "bad_frame", False)]
    assert "send frames with keyframe null" in refused[0].data["message"]
    got = results(answers)
    assert [r.frame for r in got] == [f for f in sent if f != 3] and not any(r.provisional for r in got)


@pytest.mark.parametrize("options, message", [
    ({"mode": "sideways"}, "mode is one of auto, streaming, windowed"),
    ({"frames": 0}, "frames is the number of frames the client will send"),
    ({"mode": "windowed", "settings": {"keyframe_interval": "auto"}}, "settings: .*keyframe"),
])
def test_an_open_message_with_a_mode_or_frames_no_session_runs_is_refused(clip_model, options, message):
    with serving(clip_model, stream=SERVER) as running:
        with pytest.raises(ServiceError, match=message) as refused:
            Client(running.url).open_session(**options)
    assert refused.value.code == "bad_open"


def test_a_reset_inside_a_window_finishes_the_sequence_and_starts_new_windows(clip_model):
    """A scene cut flushes the windows (the frames a later window would have taken come from
    the last one) and the next sequence, of another size, starts from a first window."""
    first, second = frames(36, 7), frames(37, 6, hw=(42, 28))
    with serving(clip_model, max_batch=1, stream=SERVER) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 2, "shared_from": "later"},
                                                   depth=True, dtype="float32")
        answers = send_sequences(session, first, second)
    got = results(answers)
    assert [(r.sequence, r.index) for r in got] == [(0, i) for i in range(7)] + [(1, i) for i in range(6)]
    settings = dict(num_scale_frames=2, keyframe_interval=1, window_size=VIEWS, overlap=2)
    for result, pred in zip(got, local_windows(clip_model, first, **settings) + local_windows(clip_model, second,
                                                                                             **settings), strict=True):
        assert_exact(result, pred)
