"""Place recognition: a compact descriptor per keyframe from the network's own ViT tokens,
searched with faiss.

The descriptor pools the frame's normalised patch tokens (`GCTNetwork.patch_tokens`) with
generalised-mean (GeM, p = 3) pooling over the whole frame and over each quarter of it,
concatenated and L2-normalised: the whole frame's pool says what is seen, the quarters where
it is seen, so a view of the same things from elsewhere scores lower. Cosine similarity is an
inner product of such vectors (faiss `IndexFlatIP`); candidates are restricted to keyframes
older than the temporal gap by an id range selector, so recent look-alike frames never crowd
them out.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["PlaceIndex", "place_descriptor"]

_GEM_P = 3.0


def _gem(tokens: torch.Tensor) -> torch.Tensor:
    """GeM over [N, C] tokens (shifted to be positive) -> [C]."""
    shifted = tokens - tokens.min(0).values + 1e-6
    return shifted.pow(_GEM_P).mean(0).pow(1 / _GEM_P)


def place_descriptor(tokens: torch.Tensor) -> np.ndarray:
    """[h, w, C] patch tokens -> [5 C] float32 L2-normalised descriptor (module docstring)."""
    h, w, c = tokens.shape
    flat = torch.nn.functional.normalize(tokens.float().reshape(h * w, c), dim=-1).reshape(h, w, c)
    parts = [_gem(flat.reshape(-1, c))]
    for rows in (slice(0, max(h // 2, 1)), slice(h // 2, h)):
        for cols in (slice(0, max(w // 2, 1)), slice(w // 2, w)):
            block = flat[rows, cols].reshape(-1, c)
            parts.append(_gem(block) if len(block) else parts[0])
    pooled = [torch.nn.functional.normalize(p - p.mean(), dim=0) for p in parts]
    out = torch.nn.functional.normalize(torch.cat(pooled), dim=0)
    return out.cpu().numpy().astype(np.float32)


class PlaceIndex:
    """Descriptors of the map's keyframes, keyed by frame index (faiss, exact inner product)."""

    def __init__(self, dim: int) -> None:
        import faiss

        self._faiss = faiss
        self.dim = dim
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def add(self, key: int, descriptor: np.ndarray) -> None:
        vector = np.ascontiguousarray(descriptor, dtype=np.float32).reshape(1, self.dim)
        self._index.add_with_ids(vector, np.array([key], dtype=np.int64))

    def remove(self, keys: list[int]) -> None:
        if keys:
            self._index.remove_ids(np.asarray(keys, dtype=np.int64))

    def search(self, descriptor: np.ndarray, k: int, *, older_than: int) -> list[tuple[int, float]]:
        """The `k` most similar keyframes whose key is below `older_than`, best first, as
        (key, cosine similarity)."""
        if older_than <= 0 or len(self) == 0:
            return []
        faiss = self._faiss
        params = faiss.SearchParameters(sel=faiss.IDSelectorRange(0, int(older_than)))
        vector = np.ascontiguousarray(descriptor, dtype=np.float32).reshape(1, self.dim)
        scores, keys = self._index.search(vector, k, params=params)
        return [(int(key), float(score)) for key, score in zip(keys[0], scores[0]) if key >= 0]
