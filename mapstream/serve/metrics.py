"""The service's Prometheus metrics, in a registry of each server's own (two servers in one
process count apart). Gauges that describe the present (sessions, queues, GPU memory) are read
when scraped; counters and histograms are updated as things happen."""
from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Metrics"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """Every metric of one server. ``sessions`` and ``queued``: callables read at each scrape
    (open sessions; frames queued per session)."""

    def __init__(self, sessions: Callable[[], int], queued: Callable[[], list[int]]) -> None:
        try:
            import prometheus_client as prom
        except ImportError as err:
            raise ImportError("mapstream serve needs prometheus_client and websockets: "
                              "pip install 'mapstream[serve]'") from err
        self._prom = prom
        self.registry = prom.CollectorRegistry(auto_describe=True)
        r = self.registry
        prom.Gauge("mapstream_sessions", "Sessions open now", registry=r).set_function(sessions)
        prom.Gauge("mapstream_queued_frames", "Frames queued over all sessions", registry=r).set_function(
            lambda: sum(queued()))
        prom.Gauge("mapstream_queue_depth_max", "Frames queued in the fullest session's queue", registry=r
                   ).set_function(lambda: max(queued(), default=0))
        if torch.cuda.is_available():
            prom.Gauge("mapstream_gpu_memory_allocated_bytes", "GPU memory held by tensors", registry=r
                       ).set_function(torch.cuda.memory_allocated)
            prom.Gauge("mapstream_gpu_memory_reserved_bytes", "GPU memory reserved by the allocator", registry=r
                       ).set_function(torch.cuda.memory_reserved)
        self.sessions_opened = prom.Counter("mapstream_sessions_opened", "Sessions opened", registry=r)
        self.refused = prom.Counter("mapstream_connections_refused", "Connections refused at the handshake",
                                    ["reason"], registry=r)
        self.frames = prom.Counter("mapstream_frames", "Frames by outcome (done: final prediction sent)",
                                   ["outcome"], registry=r)
        self.latency = prom.Histogram("mapstream_frame_latency_seconds",
                                      "From a frame's arrival to its final prediction's sending",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.batch = prom.Histogram("mapstream_batch_frames", "Frames per batched forward",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST
