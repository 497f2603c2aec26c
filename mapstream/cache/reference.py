"""The caches of the reference's stateful protocol, and the page pools caches share by default.

The reference keeps a sequence's caches inside its modules: `model(frames)` reads and extends
them until `clean_kv_cache()`. mapstream's modules hold weights only; the caches that protocol
needs are held here, one per module that runs it (the aggregator, the camera head), created on
first use and dropped with the module. Nothing else reads them: sessions and every other
caller pass caches of their own.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable

from .manager import StreamCacheManager
from .page_pool import PoolRegistry

__all__ = ["reference_cache", "shared_pools"]

_caches: "weakref.WeakKeyDictionary[object, StreamCacheManager]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_pools = PoolRegistry()


def shared_pools() -> PoolRegistry:
    """The page pools every cache leases from unless given others: caches of one storage
    geometry reuse each other's released pages whichever model or session made them."""
    return _pools


def reference_cache(owner: object, make: Callable[[], StreamCacheManager]) -> StreamCacheManager:
    """The reference protocol's cache of `owner` (a module), made by `make()` on first use."""
    with _lock:
        cache = _caches.get(owner)
        if cache is None:
            cache = _caches[owner] = make()
        return cache
