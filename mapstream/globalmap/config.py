"""The global map's settings: one typed declaration, one default each (the CLI's
`--loop-closure` flags, the service and the benchmarks derive theirs from `MapConfig`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["MapConfig"]

OUTLIER_REJECTION = ("gnc", "none")


@dataclass(frozen=True)
class MapConfig:
    """How the global map picks keyframes, finds and checks loops, and weighs its factors.

    Units: distances in the stream's own (predicted) scale are given relative to the
    keyframe's median depth, so the same settings serve any scene size.
    """

    keyframe_every: int = 4
    """Frames between two map keyframes (every frame is corrected; keyframes carry the graph)."""
    temporal_gap: int = 60
    """A loop candidate is at least this many frames older than the keyframe it would close on."""
    candidates: int = 3
    """Places looked up (faiss, cosine) for each keyframe, best first; each is verified in turn until one is accepted."""
    nearby_candidates: int = 2
    """Keyframes verified besides the place matches: those the graph's present estimate puts nearest the current one (0: none)."""
    nearby_radius: float = 1.0
    """A nearby keyframe's camera centre is within this many of the current keyframe's median depths of the current one's."""
    nearby_angle_deg: float = 60.0
    """A nearby keyframe looks within this angle of the current keyframe's viewing direction."""
    min_similarity: float = 0.8
    """Cosine similarity of place descriptors below which a candidate is not verified."""
    clip_neighbours: int = 0
    """Keyframes on each side of the candidate (and before the current one) in the verification clip; 0: the clip is the two frames alone, which the network registers more surely after a jump, so that more loops pass, each measured as well (docs/MAP.md, Figures)."""
    min_inlier_ratio: float = 0.4
    """Share of a clip side's pixels (confidence-weighted) that must agree with the map after alignment (the candidate's side and the current keyframe's each)."""
    min_overlap: float = 0.6
    """Share of the current frame's pixels (confidence-weighted) the clip must place on surfaces the candidate sees, and of the candidate's on the current frame's."""
    inlier_tolerance: float = 0.1
    """A pixel agrees when its aligned 3D point is within this fraction of its depth of the map's."""
    max_rotation_deg: float = 45.0
    """Largest rotation a loop may apply to the current keyframe's pose against the graph's estimate."""
    max_shift: float = 0.25
    """Largest shift a loop may apply, as a fraction of the path travelled since the candidate (plus `inlier_tolerance` of the depth)."""
    max_scale_change: float = 0.35
    """Largest |log| of the scale change a loop may apply."""
    check_every: int = 1
    """Keyframes between two loop searches (1: every keyframe)."""
    loop_cooldown: int = 2
    """Keyframes after an accepted loop before the next search."""
    capacity: int = 2048
    """Keyframes the map holds at most; beyond it every second of the older half is merged away (bounded memory on endless streams)."""
    odometry_sigma: tuple[float, float, float] = (0.01, 0.02, 0.01)
    """Rotation (rad), translation (fraction of the median depth) and log-scale sigmas of one odometry edge."""
    join_factor: float = 1.0
    """Odometry sigmas are this many times larger across a window join (where a windowed stream's Sim(3) alignment joins two windows); 1 weighs a join as any odometry edge: with loop edges only as accurate as the small model measures them, a weaker join lets them bend the path there (docs/MAP.md, Figures)."""
    loop_sigma: tuple[float, float, float] = (0.05, 0.1, 0.08)
    """Rotation (rad), translation (fraction of the candidate keyframe's median depth) and log-scale sigmas of one loop edge."""
    prior_sigma: tuple[float, float] = (0.02, 0.05)
    """Rotation (rad) and position sigmas of a known pose (in the known poses' units, e.g. metres)."""
    outlier_rejection: str = "gnc"
    """How the final solve treats loop edges: gnc (graduated non-convexity: a loop that disagrees with the rest gets weight 0) or none."""
    depth_stride: int = 4
    """Pixels between two samples of a keyframe's depth kept for loop alignment."""
    image_quality: int = 92
    """JPEG quality of the keyframe images kept for verification clips."""

    def __post_init__(self) -> None:
        positive = ("keyframe_every", "temporal_gap", "candidates", "check_every", "depth_stride", "capacity")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"MapConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.capacity < 16:
            raise ValueError(f"MapConfig.capacity must be >= 16 keyframes, got {self.capacity}")
        for name in ("clip_neighbours", "loop_cooldown", "nearby_candidates"):
            if getattr(self, name) < 0:
                raise ValueError(f"MapConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("min_similarity", "min_inlier_ratio", "min_overlap"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"MapConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("nearby_radius", "nearby_angle_deg", "inlier_tolerance", "max_rotation_deg", "max_shift",
                     "max_scale_change", "join_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"MapConfig.{name} must be > 0, got {getattr(self, name)}")
        if len(self.prior_sigma) != 2 or not all(v > 0 for v in self.prior_sigma):
            raise ValueError(f"MapConfig.prior_sigma must be two positive sigmas (rotation, position), "
                             f"got {self.prior_sigma}")
        for name in ("odometry_sigma", "loop_sigma"):
            value = getattr(self, name)
            if len(value) != 3 or not all(v > 0 for v in value):
                raise ValueError(f"MapConfig.{name} must be three positive sigmas (rotation, translation, scale), "
                                 f"got {value}")
        if self.outlier_rejection not in OUTLIER_REJECTION:
            raise ValueError(f"MapConfig.outlier_rejection must be one of {', '.join(OUTLIER_REJECTION)}, "
                             f"got {self.outlier_rejection!r}")
        if not 1 <= self.image_quality <= 100:
            raise ValueError(f"MapConfig.image_quality must be in 1..100, got {self.image_quality}")

    def with_settings(self, **settings) -> "MapConfig":
        unknown = set(settings) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown map settings: {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **settings)
