"""The page pool: contiguous runs, reuse, merging, trimming."""
from __future__ import annotations

import pytest
import torch

from mapstream.cache import PagePool, StorageKey

KEY = StorageKey(num_layers=2, num_heads=1, head_dim=2, page_tokens=3, dtype=torch.float32, device=torch.device("cpu"))


def test_runs_are_contiguous_views_of_one_chunk():
    pool = PagePool(KEY, min_chunk_pages=10)
    a, b = pool.allocate(4), pool.allocate(3)
    assert (a.chunk, a.first_page, b.first_page) == (0, 0, 4)
    assert a.storage.shape == (2, 2, 1, 12, 2)
    a.storage.fill_(1.0)
    assert b.storage.abs().sum() == 0  # runs do not overlap
    s = pool.stats()
    assert (s.chunks, s.pages_total, s.pages_in_use, s.pages_free) == (1, 10, 7, 3)


def test_freed_runs_are_merged_and_reused():
    pool = PagePool(KEY, min_chunk_pages=10)
    a, b, c = pool.allocate(3), pool.allocate(3), pool.allocate(3)
    pool.free(a)
    pool.free(b)
    d = pool.allocate(6)  # fits only because a and b merged
    assert (d.chunk, d.first_page) == (0, 0)
    assert pool.stats().chunks == 1
    pool.free(c)
    pool.free(d)
    assert pool.stats().pages_in_use == 0


def test_a_new_chunk_when_no_run_fits_and_trim_releases_it():
    pool = PagePool(KEY)
    a = pool.allocate(2)
    b = pool.allocate(5)
    assert b.chunk == 1
    pool.free(b)
    released = pool.trim()
    assert released == 5 * pool.bytes_per_page
    assert pool.stats().chunks == 1
    pool.free(a)
    with pytest.raises(ValueError):
        pool.allocate(0)


def test_bytes_per_page():
    pool = PagePool(KEY)
    assert pool.bytes_per_page == 2 * 2 * 1 * 3 * 2 * 4
