"""Attention backends behind one interface, chosen by capability."""
from .backend import AttentionBackend, KeyNormHint
from .fused import plain_pytorch
from .registry import BACKENDS, available_backends, select_backend
from .sdpa import SDPABackend

__all__ = ["AttentionBackend", "BACKENDS", "KeyNormHint", "SDPABackend", "available_backends", "plain_pytorch", "select_backend"]
