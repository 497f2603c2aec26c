"""The pose graph (GTSAM): conventions, drift corrected by a loop, robust loops, merging."""
import numpy as np
import pytest

pytest.importorskip("gtsam")

from mapstream.geometry.align import Sim3, umeyama  # noqa: E402
from mapstream.globalmap.graph import Edge, PoseGraph, from_gtsam, to_gtsam  # noqa: E402

ODOMETRY = np.array([0.01, 0.02, 0.01])
LOOP = np.array([0.02, 0.03, 0.02])


def _rz(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _ring(n: int, laps: float = 1.0) -> list[Sim3]:
    """Cameras on a unit circle, each facing along the tangent."""
    return [Sim3(_rz(2 * np.pi * laps * k / n), np.array([np.cos(2 * np.pi * laps * k / n),
                                                          np.sin(2 * np.pi * laps * k / n), 0.0]), 1.0)
            for k in range(n)]


def _drifted(truth: list[Sim3], scale_drift: float, yaw_drift: float) -> list[Sim3]:
    """Odometry integrated with a per-step scale and yaw error (what a stream's drift looks like)."""
    out = [truth[0]]
    for k in range(1, len(truth)):
        step = truth[k - 1].inverse().compose(truth[k])
        step = Sim3(_rz(yaw_drift) @ step.R, step.t * scale_drift**k, 1.0)
        out.append(out[-1].compose(step))
    return out


def _graph(est: list[Sim3], robust: str = "gnc") -> PoseGraph:
    graph = PoseGraph(robust)
    for k, pose in enumerate(est):
        graph.add_node(k, pose)
        if k:
            graph.add_edge(Edge(k - 1, k, est[k - 1].inverse().compose(pose), ODOMETRY, "odometry"))
        graph.update()
    return graph


def _error(graph: PoseGraph, truth: list[Sim3]) -> float:
    return max(float(np.linalg.norm(graph.estimate(k).t - truth[k].t)) for k in graph.keys)


def test_conversion_keeps_our_sim3_convention():
    sim = Sim3(_rz(0.4), np.array([1.0, -2.0, 0.5]), 1.7)
    points = np.random.default_rng(0).normal(size=(5, 3))
    native = to_gtsam(sim)
    np.testing.assert_allclose([native.transformFrom(p) for p in points], sim.apply_points(points), atol=1e-12)
    back = from_gtsam(native)
    np.testing.assert_allclose(back.R, sim.R, atol=1e-12)
    np.testing.assert_allclose(back.t, sim.t, atol=1e-12)
    assert back.s == pytest.approx(sim.s)


def test_odometry_alone_keeps_the_stream_and_the_first_node_fixes_the_frame():
    truth = _ring(24)
    est = _drifted(truth, 0.99, 0.01)
    graph = _graph(est)
    for k in graph.keys:
        np.testing.assert_allclose(graph.estimate(k).t, est[k].t, atol=1e-6)
        assert graph.estimate(k).s == pytest.approx(1.0, abs=1e-6)


def _aligned_ate(graph: PoseGraph, truth: list[Sim3]) -> float:
    est = np.stack([graph.estimate(k).t for k in graph.keys])
    ref = np.stack([truth[k].t for k in graph.keys])
    sim = umeyama(est, ref, with_scale=True)
    return float(np.sqrt(((sim.apply_points(est) - ref) ** 2).sum(1).mean()))


def test_loop_edges_tie_the_second_lap_to_the_first():
    per_lap = 30
    truth = _ring(2 * per_lap, laps=2.0)  # node k + 30 stands where node k stood
    est = _drifted(truth, 0.997, 0.003)
    graph = _graph(est)

    def apart() -> float:  # how far the two passes over the same places are drawn apart
        return max(float(np.linalg.norm(graph.estimate(k).t - graph.estimate(k + per_lap).t)) for k in range(per_lap))

    before, ate_before = apart(), _aligned_ate(graph, truth)
    for k in range(0, per_lap, 3):
        graph.add_edge(Edge(k, k + per_lap, truth[k].inverse().compose(truth[k + per_lap]), LOOP, "loop", robust=True))
        graph.update()
    graph.solve()
    assert graph.rejected_loops == []
    assert before > 0.1
    assert apart() < before / 2
    assert _aligned_ate(graph, truth) < ate_before / 3
    np.testing.assert_allclose(graph.estimate(0).t, truth[0].t, atol=1e-5)  # the first node holds the frame


def test_gnc_keeps_one_wrong_loop_from_bending_the_map():
    per_lap = 30
    truth = _ring(2 * per_lap, laps=2.0)
    est = _drifted(truth, 0.997, 0.003)
    wrong = Sim3(_rz(np.pi), np.array([2.0, 0.0, 0.0]), 1.0)  # a look-alike across the room

    def solved(rejection: str) -> tuple[float, PoseGraph]:
        graph = _graph(est, rejection)
        for k in range(0, per_lap, 3):
            graph.add_edge(Edge(k, k + per_lap, truth[k].inverse().compose(truth[k + per_lap]), LOOP, "loop",
                                robust=True))
        graph.add_edge(Edge(4, 50, wrong, LOOP, "loop", robust=True))
        graph.update()
        graph.solve()
        return _aligned_ate(graph, truth), graph

    ate_gnc, graph = solved("gnc")
    ate_plain, _ = solved("none")
    assert [(e.i, e.j) for e in graph.rejected_loops] == [(4, 50)]
    assert ate_plain > 3 * ate_gnc


def test_merging_nodes_away_keeps_the_others_and_their_constraints():
    truth = _ring(30, laps=1.0 + 1 / 30)
    est = _drifted(truth, 0.99, 0.01)
    graph = _graph(est)
    graph.add_edge(Edge(1, 29, truth[1].inverse().compose(truth[29]), LOOP, "loop", robust=True))
    graph.update()
    graph.solve()
    kept = {k: graph.estimate(k) for k in graph.keys}
    graph.merge_away([1, 3, 5, 7, 9])
    assert graph.keys == [0, 2, 4, 6, 8] + list(range(10, 30))
    # The loop on node 1 moved onto node 0 and the chain through the merged nodes was composed
    # exactly: the solution of the smaller graph is the same map.
    assert sum(e.kind == "loop" for e in graph.edges) == 1
    for k in graph.keys:
        assert np.linalg.norm(graph.estimate(k).t - kept[k].t) < 0.02
    # Merging the first node away is refused silently (it holds the map's frame).
    graph.merge_away([0])
    assert graph.keys[0] == 0


def test_an_edge_on_an_unknown_node_is_refused():
    graph = PoseGraph()
    graph.add_node(0, Sim3.identity())
    with pytest.raises(ValueError, match="node 3"):
        graph.add_edge(Edge(0, 3, Sim3.identity(), ODOMETRY, "odometry"))
    with pytest.raises(ValueError, match="already has a node 0"):
        graph.add_node(0, Sim3.identity())
