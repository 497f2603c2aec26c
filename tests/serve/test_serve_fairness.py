"""One thread runs the model for every session, so what one session puts on it in one turn
is bounded by the server's limits, and the sessions take turns: while one client sends its
largest allowed frames with the most work it may ask for, another client's frame waits for at
most one turn of it, whatever it sends.

The model's work is read from its patch embedding, which every forward passes: frames times
their pixels, per forward."""
from __future__ import annotations

from mapstream.client import Client, Result, ServiceError
from mapstream.config import StreamConfig

from serve_helpers import frames, model_thread_held, serving, tiny_model, wait_until

MAX_PIXELS = 42 * 42
SCALE_FRAMES = 4  # the server's scale phase
LARGE, SMALL = (42, 42), (28, 42)  # the largest frame allowed, and another client's


def _greedy(url: str):
    """A session with the most work a client may ask for per frame: the longest scale phase
    (its frames all through the model at once) with a provisional answer for each of its
    frames (all the buffered frames through the model again); the server's bound when it
    refuses more."""
    try:
        return Client(url).open_session(settings={"num_scale_frames": 64, "provisional": True})
    except ServiceError as err:
        assert err.code == "bad_open" and f"at most the server's {SCALE_FRAMES}" in str(err)
        return Client(url).open_session(settings={"num_scale_frames": SCALE_FRAMES, "provisional": True})


def test_a_client_sending_its_largest_frames_gets_one_bounded_turn_between_anothers_frames():
    model = tiny_model()
    forwards = []  # (frame size, frames) of each forward, in the order the model ran them
    model.aggregator.patch_embed.register_forward_hook(
        lambda module, args, out: forwards.append((tuple(args[0].shape[-2:]), args[0].shape[0])))
    with serving(model, stream=StreamConfig(num_scale_frames=SCALE_FRAMES), max_frame_pixels=MAX_PIXELS,
                 max_batch=1, queue_size=8) as running:
        greedy = _greedy(running.url)
        other = Client(running.url).open_session(settings={"num_scale_frames": 1})
        large, small = frames(70, 8, LARGE), frames(71, 8, SMALL)
        with model_thread_held(running):  # both queue their frames, then the model runs them in turns
            other.send(small[0], wait=False)  # the other's first frame goes first
            wait_until(lambda: running.server.streams[other.id].waiting)
            for i in range(8):
                greedy.send(large[i], wait=False)
                if i < 7:
                    other.send(small[i + 1], wait=False)
            wait_until(lambda: sum(s.queued_frames for s in running.server.streams.values()) == 15)
        others = [r.frame for r in other.close() if isinstance(r, Result)]
        greedy.close()
    assert others == list(range(8))
    turns = ["other" if size == SMALL else "greedy" for size, _ in forwards]
    assert turns[:16] == ["other", "greedy"] * 8  # each of the other's frames waited for one turn of the greedy's
    work = [count * size[0] * size[1] for size, count in forwards if size == LARGE]
    assert max(work) <= SCALE_FRAMES * MAX_PIXELS, work  # and each such turn is bounded by the server's limits
