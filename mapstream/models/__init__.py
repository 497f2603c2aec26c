"""The network: the aggregator, the heads' assembly (`GCTNetwork`), a stream's state, and
synthetic (rule) weights. It imports nothing above it; sessions, windowed inference, the fast
path and the reference's protocol (`mapstream.compat`) build on it."""
from .aggregator import AggregatorStream
from .gct import GCTNetwork
from .state import StreamState
from .synthetic import fill_synthetic_, synthetic_state_dict, synthetic_tensor

__all__ = [
    "AggregatorStream",
    "GCTNetwork",
    "StreamState",
    "fill_synthetic_",
    "synthetic_state_dict",
    "synthetic_tensor",
]
