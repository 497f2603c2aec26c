"""Fast paths for CUDA streaming (each checked against the plain path)."""
from .graphs import GraphedStep

__all__ = ["GraphedStep"]
