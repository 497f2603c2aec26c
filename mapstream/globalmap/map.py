"""The global map: keyframes of a stream in a pose graph, closed into one consistent map.

    gmap = GlobalMap(model, MapConfig())
    for pred, frame in stream:            # the predictions a session (or windowed session) hands up
        gmap.add(pred, frame)
    gmap.finish()                          # the final batch solve
    T = gmap.correct_pose(i, T_world_cam)  # any frame's pose, corrected

Every `keyframe_every`-th frame becomes a map keyframe: a node joined to the previous one by
an odometry edge (the stream's relative pose, weighted by the frame's confidence, looser
across a window join). Each keyframe's place descriptor is looked up among keyframes older
than `temporal_gap` frames; candidates are verified by the network (`LoopVerifier`) and an
accepted one adds a loop edge; iSAM2 updates the estimate at once. A frame's correction is
interpolated (on the Sim(3) manifold) between the keyframes around it, so every frame, and
every point it produced, moves with its keyframes.

The map uses the stream only through the predictions it is handed: it knows nothing of
sessions or windows. Memory is bounded by `capacity` keyframes (`MapKeyframe.nbytes` each,
plus a pose-graph node and a descriptor): when it is exceeded every second keyframe of the
older half is merged away (its edges composed onto its neighbours).
"""
from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import torch

from ..geometry.align import Sim3, align_poses
from .config import MapConfig
from .graph import Edge, PoseGraph, from_gtsam, to_gtsam
from .keyframes import MapKeyframe, encode_image, sample
from .loops import LoopCheck, LoopVerifier
from .places import PlaceIndex, place_descriptor

__all__ = ["GlobalMap", "require_libraries"]

log = logging.getLogger(__name__)

KEPT_REJECTIONS = 256
"""Rejected loop checks the map remembers (the latest), for run.json and diagnostics."""


def require_libraries() -> None:
    """A clear error when GTSAM or faiss is missing (both come with `pip install 'mapstream[map]'`)."""
    missing = []
    for name, package in (("gtsam", "gtsam"), ("faiss", "faiss-cpu")):
        try:
            __import__(name)
        except ImportError:
            missing.append(package)
    if missing:
        raise ValueError(f"loop closure needs {' and '.join(missing)}, which are not installed: "
                         "pip install 'mapstream[map]'")


class GlobalMap:
    """See the module docstring. Not thread-safe: `BackgroundMap` runs one on a thread."""

    def __init__(self, model, config: MapConfig | None = None) -> None:
        require_libraries()
        self.model = model
        self.config = config or MapConfig()
        self.graph = PoseGraph(self.config.outlier_rejection)
        self.keyframes: dict[int, MapKeyframe] = {}
        self.places: PlaceIndex | None = None
        self.verifier = LoopVerifier(model, self.config)
        self.loops: list[LoopCheck] = []  # accepted, in order
        self.rejected: deque[LoopCheck] = deque(maxlen=KEPT_REJECTIONS)
        self.checks = 0
        self._last: tuple[int, np.ndarray] | None = None  # the last frame's index and camera centre
        self._path = 0.0
        self._joined = False  # a window join since the last keyframe
        self._past_first_scale = False
        self._confidences: deque[float] = deque(maxlen=512)
        self._cooldown = 0
        self._since_check = 0
        self._unsearched: deque[int] = deque()  # keyframes added with search=False
        self.late_searches = 0  # of those, searched by `search_skipped`
        self.keyframe_seconds: deque[float] = deque(maxlen=1024)
        self.merged = 0
        self.window_joins = 0  # keyframes whose odometry edge crosses a window join

    # ------------------------------------------------------------------ input
    @torch.no_grad()
    def add(self, pred, frame: torch.Tensor | None, *, search: bool = True) -> LoopCheck | None:
        """Take one finished frame (a `FramePrediction` in the stream's world frame and the
        [3, H, W] image the model saw; a frame that will not be a keyframe may come without
        its image). Returns the loop it closed, if any; `search=False` registers a keyframe
        without looking for loops."""
        T = np.eye(4)
        T[:3] = pred.T_world_cam.double().cpu().numpy()
        centre = T[:3, 3]
        if self._last is not None:
            if pred.index <= self._last[0]:
                raise ValueError(f"frames must reach the map in order: {pred.index} after {self._last[0]}")
            self._path += float(np.linalg.norm(centre - self._last[1]))
        self._last = (pred.index, centre)
        if pred.scale_frame and self._past_first_scale:
            self._joined = True
        if not pred.scale_frame:
            self._past_first_scale = True
        if pred.index % self.config.keyframe_every:
            return None
        if frame is None:
            raise ValueError(f"frame {pred.index} is a map keyframe: its image is needed")
        started = time.perf_counter()
        closed = self._add_keyframe(pred, frame, T, search)
        self.keyframe_seconds.append(time.perf_counter() - started)
        return closed

    def _add_keyframe(self, pred, frame: torch.Tensor, T: np.ndarray, search: bool) -> LoopCheck | None:
        cfg = self.config
        tokens = self.model.patch_tokens(frame.to(next(self.model.parameters()).device)[None])[0]
        descriptor = place_descriptor(tokens)
        kf = MapKeyframe(
            index=int(pred.index), T_world_cam=T, K=pred.K.double().cpu().numpy(),
            depth=sample(pred.depth.float().cpu().numpy(), cfg.depth_stride),
            conf=sample(pred.depth_conf.float().cpu().numpy(), cfg.depth_stride), stride=cfg.depth_stride,
            image=encode_image(frame, cfg.image_quality), image_hw=tuple(frame.shape[-2:]), descriptor=descriptor,
            path_length=self._path, joined=self._joined,
        )
        self.window_joins += kf.joined
        self._joined = False
        previous = self.graph.keys[-1] if len(self.graph) else None
        self._register(kf, previous)
        if self.places is None:
            self.places = PlaceIndex(len(descriptor))
        closed = self._search(kf) if search else None
        if not search:
            self._unsearched.append(kf.index)
        self.places.add(kf.index, descriptor)
        if len(self.keyframes) > cfg.capacity:
            self._thin()
        return closed

    def _register(self, kf: MapKeyframe, previous: int | None) -> None:
        """The keyframe's node, at the graph's estimate of the previous one moved by the
        stream's relative pose, and its odometry edge."""
        cfg = self.config
        conf = float(np.median(kf.conf))
        self._confidences.append(conf)
        self.keyframes[kf.index] = kf
        if previous is None:
            self.graph.add_node(kf.index, kf.pose)
            self.graph.update()
            return
        before = self.keyframes[previous]
        relative = before.pose.inverse().compose(kf.pose)
        weight = float(np.clip(conf / max(float(np.median(self._confidences)), 1e-6), 0.25, 4.0))
        rot, trans, scale = cfg.odometry_sigma
        sigmas = np.array([rot, trans * before.median_depth, scale]) / np.sqrt(weight)
        if kf.joined:
            sigmas = sigmas * cfg.join_factor
        self.graph.add_node(kf.index, self.graph.estimate(previous).compose(relative))
        self.graph.add_edge(Edge(previous, kf.index, relative, sigmas, "odometry"))
        self.graph.update()

    def _search(self, kf: MapKeyframe) -> LoopCheck | None:
        cfg = self.config
        if self._cooldown:
            self._cooldown -= 1
            return None
        self._since_check += 1
        if self._since_check < cfg.check_every:
            return None
        self._since_check = 0
        older_than = kf.index - cfg.temporal_gap + 1
        found = dict(self.places.search(kf.descriptor, cfg.candidates, older_than=older_than))
        for key in self._nearby(kf, older_than):
            found.setdefault(key, float(kf.descriptor @ self.keyframes[key].descriptor))
        for key, similarity in sorted(found.items(), key=lambda item: -item[1]):
            if similarity < cfg.min_similarity or key not in self.keyframes:
                continue
            check = self._verify(key, kf, similarity)
            self.checks += 1
            if not check.accepted:
                log.debug("loop %d -> %d rejected: %s", key, kf.index, check.reason)
                self.rejected.append(check)
                continue
            rot, trans, scale = cfg.loop_sigma
            sigmas = np.array([rot, trans * self.keyframes[key].median_depth, scale])
            self.graph.add_edge(Edge(key, kf.index, check.relative, sigmas, "loop", robust=True))
            self.graph.update()
            self.loops.append(check)
            self._cooldown = cfg.loop_cooldown
            log.info("loop closed: keyframe %d -> %d (similarity %.2f, inliers %.2f, correction %.1f deg, %.2f of the "
                     "path)", key, kf.index, similarity, check.inlier_ratio, check.rotation_deg, check.shift)
            return check
        return None

    def _nearby(self, kf: MapKeyframe, older_than: int) -> list[int]:
        """Up to `nearby_candidates` keyframes older than `older_than` whose camera the graph's
        present estimate puts nearest the current one's (within `nearby_radius` median depths,
        looking within `nearby_angle_deg`): a revisited place the descriptors miss."""
        cfg = self.config
        if not cfg.nearby_candidates:
            return []
        here = self.graph.estimate(kf.index)
        radius = cfg.nearby_radius * kf.median_depth * here.s
        min_cos = np.cos(np.radians(cfg.nearby_angle_deg))
        near = []
        for key in self.graph.keys:
            if key >= older_than:
                break
            there = self.graph.estimate(key)
            distance = float(np.linalg.norm(there.t - here.t))
            if distance <= radius and float(there.R[:, 2] @ here.R[:, 2]) >= min_cos:
                near.append((distance, key))
        return [key for _, key in sorted(near)[: cfg.nearby_candidates]]

    def _verify(self, key: int, kf: MapKeyframe, similarity: float) -> LoopCheck:
        keys = self.graph.keys
        n = self.config.clip_neighbours
        at = keys.index(key)
        candidate_side = [self.keyframes[k] for k in keys[max(at - n, 0) : at + n + 1] if k < kf.index]
        before = [k for k in keys if k < kf.index and k > candidate_side[-1].index][-n:] if n else []
        query_side = [self.keyframes[k] for k in before] + [kf]
        return self.verifier.check(
            candidate_side, query_side, candidate=self.keyframes[key], query=kf, similarity=similarity,
            estimate_candidate=self.graph.estimate(key), estimate_query=self.graph.estimate(kf.index),
        )

    def _thin(self) -> None:
        """Merge away every second keyframe of the older half (bounded memory)."""
        keys = self.graph.keys
        older = keys[1 : len(keys) // 2]
        drop = older[::2]
        self.graph.merge_away(drop)
        self.places.remove(drop)
        for key in drop:
            del self.keyframes[key]
        gone = set(drop)
        self._unsearched = deque(key for key in self._unsearched if key not in gone)
        self.merged += len(drop)
        log.debug("map thinned: %d keyframes merged away, %d kept", len(drop), len(self.keyframes))

    def search_skipped(self) -> list[LoopCheck]:
        """Look for loops at the keyframes that were added with `search=False` (a map that fell
        behind its stream catches up once the stream has ended). Returns the loops closed."""
        closed = []
        while self._unsearched:
            key = self._unsearched.popleft()
            if key in self.keyframes:
                self.late_searches += 1
                check = self._search(self.keyframes[key])
                if check is not None:
                    closed.append(check)
        return closed

    # ------------------------------------------------------------------ output
    def finish(self) -> None:
        """The final batch solve over the whole graph."""
        if len(self.graph) > 1:
            self.graph.solve()

    def apply_known_poses(self, known: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict:
        """Priors from poses known for some frames (GPS, wheel odometry, ARKit: metric, with
        gravity): `known[i] = (T_known, T_stream)`, frame i's camera-to-world pose in the known
        frame and as the stream predicted it. The map is moved into the known frame by the
        Sim(3) that best fits the known poses (`align_poses`: orientations and centres), each
        known frame adds a prior on the keyframe nearest it (its pose through the stream's
        relative pose to that keyframe; rotation and position held with `prior_sigma`, scale
        free), and the whole graph is solved again: the map takes the known poses' frame,
        scale and gravity. Returns what run.json records of it."""
        keys = self.graph.keys
        if not known or not keys:
            return {"known_poses": 0}
        frames = sorted(known)
        corrected = np.stack([self.correct_pose(i, known[i][1])[0] for i in frames])
        targets = np.stack([np.asarray(known[i][0], dtype=np.float64)[:3] for i in frames])
        to_known = align_poses(corrected, targets, mode="sim3")
        self.graph.transform(to_known)
        rot, trans = self.config.prior_sigma
        anchored = set()
        for i in frames:
            key = min(keys, key=lambda k: abs(k - i))
            T_stream = np.eye(4)
            T_stream[:3] = np.asarray(known[i][1], dtype=np.float64)[:3]
            T_known = np.eye(4)
            T_known[:3] = np.asarray(known[i][0], dtype=np.float64)[:3]
            relative = np.linalg.inv(T_stream) @ self.keyframes[key].T_world_cam  # frame i -> keyframe, stream
            target = T_known @ relative
            scale = self.graph.estimate(key).s  # free: held only loosely where it is
            self.graph.add_edge(Edge(key, None, Sim3(target[:3, :3], target[:3, 3], scale),
                                     np.array([rot, trans, 10.0]), "prior"))
            anchored.add(key)
        self.graph.solve()
        after = np.stack([self.correct_pose(i, known[i][1])[0][:, 3] for i in frames])
        rms = float(np.sqrt(((after - targets[:, :, 3]) ** 2).sum(1).mean()))
        log.info("known poses: %d frames on %d keyframes; the map moved into their frame (scale x%.4f), "
                 "%.3f m RMS from them after the solve", len(frames), len(anchored), to_known.s, rms)
        return {"known_poses": len(frames), "keyframes_anchored": len(anchored), "scale_to_known": to_known.s,
                "rms_to_known": rms}

    def _keyframe_correction(self, key: int) -> Sim3:
        """X_estimate X_stream^-1: the world Sim(3) that moves what keyframe `key` produced
        from the stream's frame to the map's."""
        return self.graph.estimate(key).compose(self.keyframes[key].pose.inverse())

    def correction(self, index: int) -> Sim3:
        """The world Sim(3) that moves frame `index`'s pose and points from the stream's frame
        to the map's: interpolated between the keyframes around it."""
        keys = self.graph.keys
        if not keys:
            return Sim3.identity()
        at = int(np.searchsorted(keys, index, side="right")) - 1
        if at < 0:
            return self._keyframe_correction(keys[0])
        if at >= len(keys) - 1 or keys[at] == index:
            return self._keyframe_correction(keys[at])
        a, b = keys[at], keys[at + 1]
        ca, cb = to_gtsam(self._keyframe_correction(a)), to_gtsam(self._keyframe_correction(b))
        alpha = (index - a) / (b - a)
        step = type(ca).Logmap(ca.between(cb)) * alpha
        return from_gtsam(ca.compose(type(ca).Expmap(step)))

    def correct_pose(self, index: int, T_world_cam: np.ndarray) -> tuple[np.ndarray, float]:
        """Frame `index`'s corrected camera-to-world [3, 4] and the factor its depth scales by."""
        corr = self.correction(index)
        out = np.asarray(T_world_cam, dtype=np.float64)[:3].copy()
        out[:, :3] = corr.R @ out[:, :3]
        out[:, 3] = corr.s * (corr.R @ out[:, 3]) + corr.t
        return out, corr.s

    def keyframe_poses(self) -> dict[int, np.ndarray]:
        """Each keyframe's corrected camera-to-world [3, 4] (for a live view)."""
        return {k: self.correct_pose(k, self.keyframes[k].T_world_cam)[0] for k in self.graph.keys}

    def stats(self) -> dict:
        seconds = np.asarray(self.keyframe_seconds) if self.keyframe_seconds else np.zeros(1)
        return {
            "keyframes": len(self.keyframes),
            "merged_away": self.merged,
            "bytes": int(sum(kf.nbytes for kf in self.keyframes.values())),
            "loops": len(self.loops),
            "checks": self.checks,
            "searched_late": self.late_searches,
            "window_joins": self.window_joins,
            "rejected": len(self.rejected),
            "seconds_per_keyframe": {"median": float(np.median(seconds)), "max": float(seconds.max())},
        }

    def record(self) -> dict:
        """What run.json records: settings, statistics, every accepted loop edge with its
        scores and the latest rejected checks."""
        return {
            "stats": self.stats(),
            "loops": [c.to_dict() for c in self.loops],
            "rejected": [c.to_dict() for c in self.rejected],
        }
