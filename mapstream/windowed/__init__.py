"""Long sequences: overlapping windows on clean caches, aligned by Sim(3) and stitched."""
from .align import AlignmentWarning, Sim3, pairwise_alignment, stitch_windows, warp_predictions
from .engine import run_window, windowed_inference
from .online import WindowedSession
from .plan import WindowPlan, plan_windows

__all__ = [
    "AlignmentWarning",
    "Sim3",
    "WindowPlan",
    "WindowedSession",
    "pairwise_alignment",
    "plan_windows",
    "run_window",
    "stitch_windows",
    "warp_predictions",
    "windowed_inference",
]
