"""One consistent map of a long stream: loop closure and a pose graph above the stream.

`GlobalMap` takes the predictions a session hands up and keeps a GTSAM pose graph over
keyframes (odometry edges from the stream, loop edges found by place recognition with faiss
and measured by the network itself); `BackgroundMap` runs it beside the stream on a thread.
Settings: `MapConfig`. docs/MAP.md is the manual.
"""
from .background import BackgroundMap
from .config import MapConfig
from .loops import LoopCheck
from .map import GlobalMap

__all__ = ["BackgroundMap", "GlobalMap", "LoopCheck", "MapConfig"]
