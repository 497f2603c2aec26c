"""The initial weights of a network trained from scratch.

A vision transformer of this kind trains best from small residual branches: linear layers
drawn from a truncated normal of standard deviation 0.02, LayerScale factors at 0.01 so that
every block starts close to the identity, normalisations at the identity, convolutions at
He's scale for their ReLU activations. The camera head's last layer starts at the pose
encoding of a camera that sits at the origin, looks forward and sees about one radian: its
bias spreads that encoding over the head's iterations (the head adds up its deltas), so the
very first iteration already has a live field of view (a ReLU'd output that starts at or below
0 receives no gradient).

`matching=True` adds two choices that let a network from scratch learn to match image content
between frames (docs/TRAINING.md, "What the camera can learn from scratch"): the patch
embedding's position table as 2-D sines and cosines of unit amplitude, so that a token's value
tells where it is, and the global blocks' key projections equal to their query projections, so
that with the q/k normalisation every token attends most to tokens of like content, in its own
frame and the others, from the first step.
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["LAYER_SCALE_INIT", "init_for_training_", "init_head_for_training_", "sincos_positions_",
           "tie_global_keys_"]

LAYER_SCALE_INIT = 0.01
_LINEAR_STD = 0.02
_TOKEN_STD = 0.02
_FOV_RADIANS = 1.0


def _trunc_normal_(tensor: torch.Tensor, std: float, generator: torch.Generator) -> None:
    values = torch.empty(tensor.shape, dtype=torch.float32)
    nn.init.trunc_normal_(values, std=std, a=-2 * std, b=2 * std, generator=generator)
    tensor.copy_(values.to(tensor.dtype))


def _he_normal_(tensor: torch.Tensor, generator: torch.Generator) -> None:
    values = torch.empty(tensor.shape, dtype=torch.float32)
    nn.init.kaiming_normal_(values, nonlinearity="relu", generator=generator)
    tensor.copy_(values.to(tensor.dtype))


@torch.no_grad()
def init_for_training_(model: nn.Module, seed: int = 0, *, matching: bool = False) -> nn.Module:
    """Draw `model`'s weights for training from scratch (deterministic given `seed`); returns it.

    The draws follow the modules' order, so the same architecture and seed give the same
    weights on every machine. matching: position table and global keys as the module docstring
    says (`sincos_positions_`, `tie_global_keys_`).
    """
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            _trunc_normal_(module.weight, _LINEAR_STD, generator)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
            _he_normal_(module.weight, generator)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm2d)):
            if module.weight is not None:
                module.weight.fill_(1.0)
            if module.bias is not None:
                module.bias.zero_()
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma":
            param.fill_(LAYER_SCALE_INIT)
        elif "token" in leaf or leaf == "pos_embed":
            if "empty_pose" in leaf:
                param.zero_()  # the camera head's first input: no pose estimate yet
            else:
                _trunc_normal_(param, _TOKEN_STD, generator)
    if getattr(model, "camera_head", None) is not None:
        _start_camera_head(model.camera_head, int(model.config.camera_num_iterations))
    for name in ("depth_head", "point_head"):
        if getattr(model, name, None) is not None:
            _start_dense_head(getattr(model, name))
    if matching:
        sincos_positions_(model)
        tie_global_keys_(model)
    return model


@torch.no_grad()
def sincos_positions_(model: nn.Module) -> nn.Module:
    """Set the patch embedding's position table [1, 1 + n*n, C] (after its class token) to 2-D
    sines and cosines of the n x n grid: a quarter of the channels each for sin and cos of the
    row and of the column, at frequencies from 1 down to 1/100 a patch. Returns `model`."""
    table = model.aggregator.patch_embed.pos_embed
    n, width = math.isqrt(table.shape[1] - 1), table.shape[2]
    if n * n != table.shape[1] - 1 or width % 4:
        raise ValueError(f"a position table of shape {list(table.shape)} is not a square grid with 4k channels")
    rows, cols = torch.meshgrid(torch.arange(n, dtype=torch.float32), torch.arange(n, dtype=torch.float32),
                                indexing="ij")
    freq = 100.0 ** -(torch.arange(width // 4, dtype=torch.float32) / (width // 4))
    parts = [f(axis.flatten()[:, None] * freq) for axis in (rows, cols) for f in (torch.sin, torch.cos)]
    table[0, 1:] = torch.cat(parts, dim=1).to(table.dtype)
    return model


@torch.no_grad()
def tie_global_keys_(model: nn.Module) -> nn.Module:
    """Copy each global block's query projection (weights and bias) onto its key projection,
    and the query normalisation onto the key normalisation. Returns `model`."""
    for block in model.aggregator.global_blocks:
        attn = block.attn
        width = attn.qkv.weight.shape[1]
        attn.qkv.weight[width:2 * width] = attn.qkv.weight[:width]
        if attn.qkv.bias is not None:
            attn.qkv.bias[width:2 * width] = attn.qkv.bias[:width]
        if isinstance(getattr(attn, "k_norm", None), nn.LayerNorm):
            attn.k_norm.load_state_dict(attn.q_norm.state_dict())
    return model


@torch.no_grad()
def init_head_for_training_(model: nn.Module, name: str, seed: int = 0) -> nn.Module:
    """Draw only `model`'s head `name` ("depth_head", "point_head", "camera_head") as
    `init_for_training_` would for a model trained from scratch, leaving every other weight as
    it is: a head added to trained weights. Returns `model`."""
    head = getattr(model, name, None)
    if head is None:
        raise ValueError(f"the model has no {name}")
    init_for_training_(head, seed)  # the head's own layers, norms and tokens
    if name == "camera_head":
        _start_camera_head(head, int(model.config.camera_num_iterations))
    else:
        _start_dense_head(head)
    return model


def _start_dense_head(head: nn.Module) -> None:
    # A DPT head's outputs go through exp (depth, points) and 1 + exp (confidence): its last
    # convolution starts near 0 so that depth starts near 1, the clip's normalised mean distance,
    # instead of the exp of a He-scaled sum, which overflows.
    last = [m for m in head.modules() if isinstance(m, nn.Conv2d)][-1]
    last.weight.mul_(0.01)


def _start_camera_head(head: nn.Module, iterations: int) -> None:
    last = head.pose_branch.fc2
    last.weight.mul_(0.1)  # small deltas at first: the head starts from the bias's camera
    bias = torch.zeros_like(last.bias)
    bias[6] = 1.0 / iterations  # quaternion (x, y, z, w): the identity rotation
    bias[7:9] = _FOV_RADIANS / iterations
    last.bias.copy_(bias)
