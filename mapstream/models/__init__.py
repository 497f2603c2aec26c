"""The network: aggregator, the GCTStream model, checkpoints and synthetic weights."""
from .aggregator import AggregatorStream
from .gct import GCTStream, StreamState
from .synthetic import fill_synthetic_, synthetic_state_dict, synthetic_tensor

__all__ = [
    "AggregatorStream",
    "GCTStream",
    "StreamState",
    "fill_synthetic_",
    "synthetic_state_dict",
    "synthetic_tensor",
]
