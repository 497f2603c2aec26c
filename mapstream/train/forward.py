"""The training forward: a whole clip in one pass, with the streaming model's visibility.

Streaming sees a clip frame by frame: the scale frames together, then each later frame with
the frames stored before it. Training computes every frame at once, with gradients, and gives
each frame exactly that view through block-causal masks over the global attention and the
camera head's attention:

    query frame f sees key frame g  <=>  g <= f,  or both are scale frames (f, g < scale)

With every frame stored and nothing evicted (a clip no longer than the scale frames plus the
sliding window), the outputs are those of `inference_streaming` with keyframe interval 1.
Everything else (the per-frame work, the special tokens' copies, the 3D RoPE's time index of
frame f being f) is the network's own code, called here without a cache.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..attention.fused import plain_pytorch
from ..layers import patch_positions_2d, rope2d
from ..models.gct import GCTNetwork
from ..validation import check_images, check_scale_frames

__all__ = ["ATTENTION_KINDS", "clip_forward", "resolve_attention", "visibility_mask"]

ATTENTION_KINDS = ("auto", "sdpa", "flex")


def visibility_mask(num_frames: int, num_scale_frames: int, tokens_per_frame: int, device) -> torch.Tensor:
    """[S*P, S*P] bool, True where a query token may attend to a key token: block-causal over
    frames, the first `num_scale_frames` frames one block (see module docstring)."""
    frame = torch.arange(num_frames, device=device)
    scale = frame < num_scale_frames
    visible = (frame[None, :] <= frame[:, None]) | (scale[:, None] & scale[None, :])
    return visible.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)


def resolve_attention(kind: str, device: torch.device) -> str:
    """The global attention `kind` ("auto": FlexAttention on CUDA, SDPA elsewhere) names.

    SDPA with a dense mask cannot use the flash kernels and computes every masked block;
    compiled FlexAttention skips the blocks the block-causal mask hides entirely (about half at
    long clips). On the CPU compiling costs more than it saves, and FlexAttention uncompiled
    computes the full score matrix as SDPA does."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {kind!r}")
    on_cuda = torch.device(device).type == "cuda"
    if kind == "auto":
        return "flex" if on_cuda else "sdpa"
    if kind == "flex" and not on_cuda and torch.is_grad_enabled():
        raise ValueError("attention 'flex' has no backward pass on the CPU in PyTorch: train there with 'sdpa' "
                         "(or 'auto')")
    return kind


@functools.cache
def _compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=8)
def _block_mask(num_frames: int, num_scale_frames: int, tokens_per_frame: int, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask

    def visible(b, h, q_index, kv_index):  # visibility_mask's rule, token by token
        fq, fk = q_index // tokens_per_frame, kv_index // tokens_per_frame
        return (fk <= fq) | ((fq < num_scale_frames) & (fk < num_scale_frames))

    length = num_frames * tokens_per_frame
    return create_block_mask(visible, None, None, length, length, device=device)


def _masked_attention(kind: str, num_frames: int, scale: int, per_frame: int, device) -> Callable:
    """attend(q, k, v) over [B, heads, S*P, D] with the block-causal visibility."""
    if kind == "flex":
        flex, blocks = _compiled_flex(), _block_mask(num_frames, scale, per_frame, torch.device(device))
        return lambda q, k, v: flex(q, k, v, block_mask=blocks)
    mask = visibility_mask(num_frames, scale, per_frame, device)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def clip_forward(
    model: GCTNetwork,
    images: torch.Tensor,
    *,
    num_scale_frames: int,
    checkpoint_layers: bool = False,
    attention: str = "sdpa",
    dense_autocast: bool = False,
    dense: bool = True,
    keep_layers: bool = False,
) -> dict[str, Any]:
    """The network on whole clips `images` [B, S, 3, H, W] (B independent clips), every frame
    seeing what it sees when streamed (module docstring). Returns pose_enc [B,S,9],
    pose_enc_list (per camera iteration), depth [B,S,H,W,1], depth_conf [B,S,H,W] (and world
    points with a point head), fp32 and differentiable. checkpoint_layers: recompute each
    layer's activations in the backward pass instead of keeping them (memory for time).
    attention: the global layers' attention, "sdpa", "flex" or "auto" (`resolve_attention`);
    both compute the same function. dense_autocast: the depth (and point) head under the
    caller's autocast too, not in fp32 as inference runs it (`GCTNetwork.heads`). dense=False:
    the camera head alone (no depth or points), a step that supervises only the camera.
    keep_layers: also return the aggregator's selected layers [B, S, P, 2C] as "layers" (for
    losses on the tokens themselves).

    Runs PyTorch's own differentiable operations throughout (`plain_pytorch()`): the fused
    kernels of the inference path have no backward."""
    with plain_pytorch():
        return _clip_forward(model, images, num_scale_frames, checkpoint_layers,
                             resolve_attention(attention, images.device), dense_autocast, dense, keep_layers)


def _clip_forward(model: GCTNetwork, images: torch.Tensor, num_scale_frames: int, checkpoint_layers: bool,
                  attention: str, dense_autocast: bool, dense: bool, keep_layers: bool):
    images = check_images(images, model.config.patch_size, check_values=False)
    check_scale_frames(num_scale_frames)
    agg, c = model.aggregator, model.config
    clips, num_frames, _, height, width = images.shape
    scale = min(num_scale_frames, num_frames)
    grid_h, grid_w = height // c.patch_size, width // c.patch_size
    special = agg.special_tokens(num_frames, 0, scale).repeat(clips, 1, 1)  # [B*S, 6, C]
    tokens = agg.embed(images, special)
    per_frame = tokens.shape[1]
    pos2d = patch_positions_2d(grid_h, grid_w, c.num_special_tokens, tokens.device)
    frame_rotary = rope2d(pos2d, c.head_dim, c.rope2d_frequency)
    global_rotary = agg.global_rotary(0, num_frames, grid_h, grid_w, pos2d)
    attend = _masked_attention(attention, num_frames, scale, per_frame, tokens.device)

    def between(i, seq, q, k, v):
        with plain_pytorch():  # again here: a checkpointed layer is recomputed in the backward pass
            return agg.between_layers(i, seq, attend(q, k, v), per_frame, frame_rotary, global_rotary, streams=clips)

    layer = agg.enter_layer(0, tokens, frame_rotary, global_rotary, streams=clips)
    selected: dict[int, torch.Tensor] = {}
    for i in range(c.depth):
        if i + 1 < c.depth:
            args = (i + 1, layer.seq, layer.q, layer.k, layer.v)
            leaving = checkpoint(between, *args, use_reentrant=False) if checkpoint_layers else between(*args)
            out, next_layer = leaving.global_out, leaving.entry
        else:
            out, next_layer = agg.leave_layer(i, layer.seq, attend(layer.q, layer.k, layer.v)), None
        if i in c.selected_layers:
            selected[i] = torch.cat((layer.frame_out, out.view(clips, num_frames, per_frame, -1)), dim=-1)
        layer = next_layer
    layers = [selected[i] for i in c.selected_layers]
    camera_mask = visibility_mask(num_frames, scale, 1, tokens.device)

    def camera(camera_tokens: torch.Tensor) -> list[torch.Tensor]:
        return model.camera_head.refine(
            camera_tokens, lambda layer_index, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=camera_mask)
        )

    out = model.heads(layers, (height, width), c.num_special_tokens, camera, dense_autocast=dense_autocast,
                      dense=dense)
    if keep_layers:
        out["layers"] = layers
    return out
