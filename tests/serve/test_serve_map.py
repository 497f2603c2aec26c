"""Sessions opened with loop_closure: a global map beside each sequence, whose corrected
keyframes reach the client as `map` events, the final one before the sequence's reset or close."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gtsam")
pytest.importorskip("faiss")

from mapstream.client import Client, Event, ServiceError  # noqa: E402
from mapstream.geometry.align import Sim3  # noqa: E402
from mapstream.globalmap import MapConfig  # noqa: E402
from mapstream.globalmap import loops as loop_checks  # noqa: E402

from serve_helpers import events, frames, results, send_sequences, serving, tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_each_sequence_gets_its_final_map_before_its_reset_and_close_are_answered(model):
    config = MapConfig(keyframe_every=3, min_similarity=1.0)  # no loop: the map is the stream
    with serving(model, map_config=config) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 2}, loop_closure=True)
        assert session.info["loop_closure"]["keyframe_every"] == 3
        answers = send_sequences(session, frames(1, 7), frames(2, 5))
    kinds = [a.type if isinstance(a, Event) else "result" for a in answers]
    maps = events(answers, "map")
    assert [(m.data["sequence"], m.data["final"]) for m in maps] == [(0, True), (1, True)]
    # Each final map comes after its sequence's results and before the answer that ends it.
    assert kinds.index("map") < kinds.index("reset") < len(kinds) - 1 - kinds[::-1].index("map") < kinds.index("closed")
    first_results = [i for i, a in enumerate(answers) if not isinstance(a, Event) and a.sequence == 0]
    assert max(first_results) < kinds.index("map")
    for sequence, count in ((0, 7), (1, 5)):
        got = {r.index: r for r in results(answers) if r.sequence == sequence}
        final = maps[sequence].data
        assert [k["index"] for k in final["keyframes"]] == list(range(0, count, 3))
        assert final["stats"]["keyframes"] == len(range(0, count, 3)) and final["loops"] == []
        for keyframe in final["keyframes"]:  # no loop: each keyframe where the stream put it
            np.testing.assert_allclose(keyframe["T_world_cam"], got[keyframe["index"]].T_world_cam, atol=1e-5)
            assert keyframe["scale"] == pytest.approx(1.0, abs=1e-6)


def test_a_loop_closed_while_streaming_reaches_the_client_as_it_closes(model, monkeypatch):
    def accept(self, candidate_side, query_side, *, candidate, query, similarity, estimate_candidate,
               estimate_query):
        check = loop_checks.LoopCheck(candidate.index, query.index, similarity)
        check.relative = estimate_candidate.inverse().compose(estimate_query).compose(Sim3(np.eye(3), [0, 0.01, 0], 1))
        check.accepted, check.reason = True, "accepted by the test"
        return check

    monkeypatch.setattr(loop_checks.LoopVerifier, "check", accept)
    config = MapConfig(keyframe_every=2, min_similarity=0.0, temporal_gap=4, loop_cooldown=100, nearby_candidates=0)
    with serving(model, map_config=config) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 2}, loop_closure=True)
        answers = send_sequences(session, frames(3, 9))
    maps = events(answers, "map")
    live, final = [m.data for m in maps if not m.data["final"]], [m.data for m in maps if m.data["final"]]
    assert len(live) == 1 and len(final) == 1  # the cooldown lets one loop close
    (loop,) = live[0]["loops"]
    assert loop[1] - loop[0] >= 4 and final[0]["loops"] == [loop]
    assert final[0]["stats"]["loops"] == 1


def test_maps_beyond_the_servers_limit_are_refused_at_open(model):
    with serving(model, max_maps=1, map_config=MapConfig(min_similarity=1.0)) as running:
        first = Client(running.url).open_session(loop_closure=True)
        with pytest.raises(ServiceError, match="at most 1 global maps"):
            Client(running.url).open_session(loop_closure=True)
        plain = Client(running.url).open_session()  # a session without a map still opens
        assert plain.info["loop_closure"] is None
        plain.close()
        first.close()
    with serving(model) as running, pytest.raises(ServiceError, match="loop_closure is true or false"):
        Client(running.url).open_session(loop_closure="yes")
