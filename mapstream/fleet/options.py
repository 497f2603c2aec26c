"""How a job over many inputs runs (`JobOptions`): here or on Ray, its workers, its retries."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JobOptions"]


@dataclass(frozen=True)
class JobOptions:
    """How a job runs. ``ray``: on Ray (a local instance unless ``ray_address`` names a
    running cluster, which also implies Ray); ``workers``: Ray actors (default: one per GPU of
    the cluster, else one), or ignored without Ray; ``cpus_per_worker``: CPU cores an actor
    takes and its torch threads; ``retries``: further attempts at a failed input."""

    ray: bool = False
    ray_address: str | None = None
    workers: int | None = None
    cpus_per_worker: int = 1
    retries: int = 2

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.cpus_per_worker < 1:
            raise ValueError(f"cpus_per_worker must be >= 1, got {self.cpus_per_worker}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")

    @property
    def uses_ray(self) -> bool:
        return self.ray or self.ray_address is not None
