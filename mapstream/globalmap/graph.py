"""The pose graph: one Sim(3) node per map keyframe, odometry, loop and prior factors, solved
with GTSAM (iSAM2 as keyframes arrive, Levenberg-Marquardt over the whole graph at the end).

A node `X_i` maps keyframe i's camera coordinates, in the scale the stream predicted it in,
to the map's world frame; its first value is the caller's (the map's: the estimate of the
node before it moved by the stream's relative pose). A between factor says
`X_i^-1 X_j = Z_ij`; its sigmas are (rotation rad, translation, log scale), with the
translation in i's camera units. Loop edges are the uncertain ones: the batch solve runs
GTSAM's graduated non-convexity (GNC, truncated least squares) over them, with odometry and
priors as known inliers, so a loop that survived verification but disagrees with the rest of
the graph gets weight 0 instead of bending the map (`rejected_loops`). A plain robust kernel
would not do: a true loop after a long drift starts with a large residual and would be
down-weighted as well; GNC starts from the convex problem and tightens gradually. While
streaming, iSAM2 takes verified loops as plain Gaussian factors.

Conventions: our `Sim3` (mapstream.geometry.align) is x -> s R x + t; GTSAM's Similarity3
is x -> s (R x + t'), so t' = t / s.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..geometry.align import Sim3

__all__ = ["Edge", "PoseGraph", "to_gtsam", "from_gtsam"]

log = logging.getLogger(__name__)


def to_gtsam(sim: Sim3):
    import gtsam

    return gtsam.Similarity3(gtsam.Rot3(np.asarray(sim.R, dtype=np.float64)), np.asarray(sim.t) / sim.s, float(sim.s))


def from_gtsam(value) -> Sim3:
    s = float(value.scale())
    return Sim3(np.asarray(value.rotation().matrix()), s * np.asarray(value.translation()), s)


@dataclass
class Edge:
    """A between factor `X_i^-1 X_j = relative` (or, with `j is None`, a prior `X_i = relative`)."""

    i: int
    j: int | None
    relative: Sim3
    sigmas: np.ndarray  # [3]: rotation, translation, log scale
    kind: str  # "odometry", "loop" or "prior"
    robust: bool = False  # an uncertain edge (a loop): GNC may reject it in the batch solve


def _noise(sigmas: np.ndarray):
    import gtsam

    rot, trans, scale = (float(v) for v in sigmas)
    return gtsam.noiseModel.Diagonal.Sigmas(np.array([rot] * 3 + [trans] * 3 + [scale]))


class PoseGraph:
    """Nodes and factors over keyframe keys (frame indices); see the module docstring.

    The first node is held by a tight prior (the gauge: the map's frame is the stream's).
    `add_node` + `add_edge` queue work that `update` hands to iSAM2; `solve` optimises the
    whole graph again from the current estimate (the batch solve at the end of a stream, and
    after nodes are merged away).
    """

    def __init__(self, outlier_rejection: str = "gnc") -> None:
        import gtsam

        self._gtsam = gtsam
        self.outlier_rejection = outlier_rejection
        self.rejected_loops: list[Edge] = []  # loop edges the last batch solve gave weight 0
        self.edges: list[Edge] = []
        self._initial: dict[int, Sim3] = {}
        self._estimate: dict[int, Sim3] = {}
        self._new_values = gtsam.Values()
        self._new_factors = gtsam.NonlinearFactorGraph()
        self._isam = self._new_isam()

    def _new_isam(self):
        gtsam = self._gtsam
        params = gtsam.ISAM2Params()
        params.setRelinearizeThreshold(0.01)
        return gtsam.ISAM2(params)

    # ------------------------------------------------------------------ building
    @property
    def keys(self) -> list[int]:
        return sorted(self._estimate)

    def __len__(self) -> int:
        return len(self._estimate)

    def __contains__(self, key: int) -> bool:
        return key in self._estimate

    def add_node(self, key: int, initial: Sim3) -> None:
        if key in self._estimate:
            raise ValueError(f"the pose graph already has a node {key}")
        first = not self._estimate
        self._initial[key] = initial
        self._estimate[key] = initial
        self._new_values.insert(key, to_gtsam(initial))
        if first:
            self._queue(self._gauge(key))

    def _gauge(self, key: int) -> Edge:
        """The tight prior that holds the first node where the stream put it (the map's frame
        is the stream's), unless priors on known poses give the frame (`anchored`)."""
        return Edge(key, None, self._initial[key], np.array([1e-6, 1e-6, 1e-6]), "gauge")

    @property
    def anchored(self) -> bool:
        """Priors on known poses fix the map's frame (and scale): no gauge."""
        return any(e.kind == "prior" for e in self.edges)

    def transform(self, sim: Sim3) -> None:
        """Move every estimate by `sim` (world -> new world), e.g. into the frame of known poses
        before they are added as priors. Call `solve` after."""
        for key, value in self._estimate.items():
            self._estimate[key] = sim.compose(value)

    def add_edge(self, edge: Edge) -> None:
        for key in (edge.i, edge.j):
            if key is not None and key not in self._estimate:
                raise ValueError(f"an edge on node {key}, which the pose graph does not have")
        self.edges.append(edge)
        self._queue(edge)

    def _queue(self, edge: Edge) -> None:
        self._new_factors.add(self._factor(edge))

    def _factor(self, edge: Edge):
        gtsam = self._gtsam
        noise = _noise(edge.sigmas)
        if edge.j is None:
            return gtsam.PriorFactorSimilarity3(edge.i, to_gtsam(edge.relative), noise)
        return gtsam.BetweenFactorSimilarity3(edge.i, edge.j, to_gtsam(edge.relative), noise)

    # ------------------------------------------------------------------ solving
    def update(self) -> None:
        """Hand the queued nodes and factors to iSAM2 and refresh the estimate."""
        if self._new_factors.size() == 0 and self._new_values.size() == 0:
            return
        self._isam.update(self._new_factors, self._new_values)
        self._new_factors = self._gtsam.NonlinearFactorGraph()
        self._new_values = self._gtsam.Values()
        self._read(self._isam.calculateEstimate())

    def solve(self, iterations: int = 100) -> None:
        """Optimise the whole graph from the current estimate (Levenberg-Marquardt, inside
        GNC over the loop edges unless `outlier_rejection` is "none"), then continue
        incrementally from the result."""
        gtsam = self._gtsam
        graph = gtsam.NonlinearFactorGraph()
        values = gtsam.Values()
        first = self.keys[0] if self._estimate else None
        if first is None:
            return
        if not self.anchored:
            graph.add(self._factor(self._gauge(first)))
        for edge in self.edges:
            graph.add(self._factor(edge))
        for key, value in self._estimate.items():
            values.insert(key, to_gtsam(value))
        lm = gtsam.LevenbergMarquardtParams()
        lm.setMaxIterations(iterations)
        offset = graph.size() - len(self.edges)  # the gauge's factor comes first, when there is one
        uncertain = [n + offset for n, e in enumerate(self.edges) if e.robust]
        self.rejected_loops = []
        if uncertain and self.outlier_rejection == "gnc":
            params = gtsam.GncLMParams(lm)
            params.setKnownInliers([n for n in range(graph.size()) if n not in set(uncertain)])
            optimizer = gtsam.GncLMOptimizer(graph, values, params)
            # A loop is an inlier while its whitened squared error is within the 99 % chi-square
            # bound of a 7-dof factor.
            optimizer.setInlierCostThresholdsAtProbability(0.99)
            result = optimizer.optimize()
            weights = np.asarray(optimizer.getWeights())
            self.rejected_loops = [self.edges[n - offset] for n in uncertain if weights[n] < 0.5]
            if self.rejected_loops:
                # The solution without them, exactly (GNC's last weights are near 0, not 0).
                graph = gtsam.NonlinearFactorGraph()
                if not self.anchored:
                    graph.add(self._factor(self._gauge(first)))
                for edge in self.edges:
                    if not any(edge is r for r in self.rejected_loops):
                        graph.add(self._factor(edge))
                result = gtsam.LevenbergMarquardtOptimizer(graph, result, lm).optimize()
        else:
            result = gtsam.LevenbergMarquardtOptimizer(graph, values, lm).optimize()
        self._read(result)
        # iSAM2 starts again from the solved graph (nothing queued is lost: all of it is in `edges`).
        self._isam = self._new_isam()
        self._isam.update(graph, result)
        self._new_factors = gtsam.NonlinearFactorGraph()
        self._new_values = gtsam.Values()

    def _read(self, values) -> None:
        for key in list(self._estimate):
            if values.exists(key):
                self._estimate[key] = from_gtsam(values.atSimilarity3(key))

    def estimate(self, key: int) -> Sim3:
        return self._estimate[key]

    def residual(self, edge: Edge) -> np.ndarray:
        """(rotation rad, translation, |log scale|) of an edge's error at the current estimate."""
        xi = self._estimate[edge.i]
        predicted = xi if edge.j is None else xi.inverse().compose(self._estimate[edge.j])
        error = edge.relative.inverse().compose(predicted)
        angle = float(np.arccos(np.clip((np.trace(error.R) - 1) / 2, -1.0, 1.0)))
        return np.array([angle, float(np.linalg.norm(error.t)), abs(float(np.log(error.s)))])

    # ------------------------------------------------------------------ bounded size
    def merge_away(self, keys: list[int]) -> None:
        """Remove nodes (never the first), joining their neighbours' odometry edges by
        composition and moving their loop and prior edges onto the previous kept node; then
        solve the smaller graph again. What the removed nodes constrained stays in the graph."""
        drop = set(keys) - {self.keys[0]}
        if not drop:
            return
        order = self.keys
        kept_before: dict[int, int] = {}
        previous = order[0]
        for key in order:
            if key in drop:
                kept_before[key] = previous
            else:
                previous = key
        # Relative pose of a dropped node from its kept predecessor, along the odometry chain.
        odometry = {(e.i, e.j): e for e in self.edges if e.kind == "odometry"}
        offset: dict[int, tuple[Sim3, np.ndarray]] = {}
        previous = order[0]
        for key in order:
            if key in drop:
                step = odometry.get((previous, key))
                base, var = offset.get(previous, (Sim3.identity(), np.zeros(3)))
                rel = step.relative if step is not None else self._estimate[previous].inverse().compose(self._estimate[key])
                sig = step.sigmas if step is not None else np.zeros(3)
                offset[key] = (base.compose(rel), var + sig**2)
            previous = key

        def lift(key: int) -> tuple[int, Sim3, np.ndarray]:
            if key not in drop:
                return key, Sim3.identity(), np.zeros(3)
            rel, var = offset[key]
            return kept_before[key], rel, var

        edges: list[Edge] = []
        for edge in self.edges:
            i, rel_i, var_i = lift(edge.i)
            if edge.j is None:
                edges.append(Edge(i, None, edge.relative.compose(rel_i.inverse()), np.sqrt(edge.sigmas**2 + var_i),
                                  edge.kind, edge.robust))
                continue
            if edge.kind == "odometry" and (edge.i in drop or edge.j in drop):
                continue  # rebuilt below
            j, rel_j, var_j = lift(edge.j)
            if i == j:
                continue
            relative = rel_i.compose(edge.relative).compose(rel_j.inverse())
            edges.append(Edge(i, j, relative, np.sqrt(edge.sigmas**2 + var_i + var_j), edge.kind, edge.robust))
        kept = [k for k in order if k not in drop]
        chained = {(e.i, e.j) for e in edges if e.kind == "odometry"}
        for a, b in zip(kept, kept[1:]):
            if (a, b) in chained:
                continue
            rel, var = Sim3.identity(), np.zeros(3)
            key = a
            for nxt in order[order.index(a) + 1 : order.index(b) + 1]:
                step = odometry.get((key, nxt))
                rel = rel.compose(step.relative if step is not None
                                  else self._estimate[key].inverse().compose(self._estimate[nxt]))
                var = var + (step.sigmas**2 if step is not None else 0.0)
                key = nxt
            edges.append(Edge(a, b, rel, np.sqrt(var), "odometry"))
        for key in drop:
            del self._estimate[key], self._initial[key]
        self.edges = edges
        self.solve()
