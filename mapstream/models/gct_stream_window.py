"""Names for code ported from the reference's windowed module (`gct_stream_window`).

There is one model class; windowed inference is `GCTStream.inference_windowed`."""
from .gct import GCTStream as _GCTStream

__all__ = ["GCTStream", "GCTStreamWindow"]


class GCTStreamWindow(_GCTStream):
    """`GCTStream` under the reference's windowed-module name (same model, same weights)."""


GCTStream = GCTStreamWindow
