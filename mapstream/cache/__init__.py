"""The streaming KV-cache subsystem: a spec, a page pool, and a manager that decides what is
visible. Pure bookkeeping plus copies; no attention math lives here."""
from .device_step import DeviceStep
from .manager import (
    CacheStateError,
    CacheStats,
    FlashInferKVCacheManager,
    Step,
    StreamCacheManager,
    attend_streams,
    open_steps,
    thin_trajectory,
)
from .page_pool import PagePool, PageRun, PoolRegistry, PoolStats
from .reference import reference_cache, shared_pools
from .spec import CacheSpec, StorageKey, TokenLayout

__all__ = [
    "CacheSpec",
    "CacheStateError",
    "CacheStats",
    "DeviceStep",
    "FlashInferKVCacheManager",
    "PagePool",
    "PageRun",
    "PoolRegistry",
    "PoolStats",
    "Step",
    "StorageKey",
    "StreamCacheManager",
    "TokenLayout",
    "attend_streams",
    "open_steps",
    "reference_cache",
    "shared_pools",
    "thin_trajectory",
]
