"""Reusable network primitives (no model, cache or I/O imports)."""
from .block import Attention, Block, LayerScale, Mlp, layer_norm_bound
from .rope import Rotary, patch_positions_2d, rope2d, rope3d, rope3d_angles, rope3d_time_columns, rope3d_time_inv_freq, token_positions_3d
from .resize import resize_bilinear
from .vit import PatchEmbedViT

__all__ = [
    "Attention",
    "Block",
    "LayerScale",
    "Mlp",
    "PatchEmbedViT",
    "layer_norm_bound",
    "Rotary",
    "patch_positions_2d",
    "resize_bilinear",
    "rope2d",
    "rope3d",
    "rope3d_angles",
    "rope3d_time_columns",
    "rope3d_time_inv_freq",
    "token_positions_3d",
]
