"""Names for code ported from the reference's `gct_stream_window_v2` module, whose only
difference is that the point head is built by default."""
from typing import Any

from .gct import GCTStream as _GCTStream

__all__ = ["GCTStream", "GCTStreamWindowV2"]


class GCTStreamWindowV2(_GCTStream):
    """`GCTStream` with `enable_point=True` unless told otherwise. A checkpoint without
    `point_head.*` weights fails strict loading instead of giving random world points."""

    def __init__(self, *args: Any, enable_point: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, enable_point=enable_point, **kwargs)


GCTStream = GCTStreamWindowV2
