"""Deepen a trained network: the same weights in an architecture with more blocks.

Every residual block of this network adds `gamma * branch(x)` to its input (LayerScale), so a
block whose two gammas are zero is the identity. A deeper architecture of the same width
starts from a trained one exactly: each stack of blocks (the patch embedding's, the
aggregator's frame and global blocks, the camera head's trunk) keeps its trained blocks in
their order, spread over the deeper stack, and the blocks between them start as copies of the
trained block that follows, with their gammas at zero. The deeper network computes the trained
one's function until its first optimiser step; the gammas then receive gradients at once
(the branch they scale is alive) and the copied weights follow.

The heads read the aggregator's [frame, global] outputs at `selected_layers`. A trained block
at position i moves to `placement(n, m)[i]`, the last of its group, so the outputs the heads
read are the same tensors when the deeper preset's `selected_layers` are the moved ones
(`deepened_layers`); anything else is refused, since the heads would read other features.
"""
from __future__ import annotations

import dataclasses

import torch

from ..config import ModelConfig

__all__ = ["deepen_state_dict", "deepened_layers", "placement"]

# (state_dict prefix of a stack of blocks, the ModelConfig field that counts them)
_STACKS = (
    ("aggregator.patch_embed.blocks.", "vit_depth"),
    ("aggregator.frame_blocks.", "depth"),
    ("aggregator.global_blocks.", "depth"),
    ("camera_head.trunk.", "camera_trunk_depth"),
)
_DEPTH_FIELDS = {"vit_depth", "depth", "camera_trunk_depth", "selected_layers"}


def placement(n: int, m: int) -> list[int]:
    """Where each of n trained blocks goes in a stack of m >= n: block i ends the i-th of n
    groups of (nearly) equal size, so the identities before it are the rest of its group."""
    if not 1 <= n <= m:
        raise ValueError(f"cannot spread {n} blocks over {m}: need 1 <= {n} <= {m}")
    return [(i + 1) * m // n - 1 for i in range(n)]


def deepened_layers(source: ModelConfig, depth: int) -> tuple[int, ...]:
    """The `selected_layers` of `source` deepened to `depth` aggregator layers."""
    where = placement(source.depth, depth)
    return tuple(where[i] for i in source.selected_layers)


def _check(source: ModelConfig, target: ModelConfig) -> None:
    differ = [f.name for f in dataclasses.fields(ModelConfig)
              if f.name not in _DEPTH_FIELDS and getattr(source, f.name) != getattr(target, f.name)]
    if differ:
        raise ValueError(f"deepening keeps everything but the depths, and these settings differ: {', '.join(differ)}; "
                         "choose a deeper preset of the checkpoint's width and heads")
    for _, field in _STACKS:
        if getattr(target, field) < getattr(source, field):
            raise ValueError(f"{field} {getattr(target, field)} is shallower than the checkpoint's "
                             f"{getattr(source, field)}: deepening only adds blocks")
    expected = deepened_layers(source, target.depth)
    if tuple(target.selected_layers) != expected:
        raise ValueError(f"the heads of a {target.depth}-layer deepening of this checkpoint read layers {expected}, "
                         f"but the target's selected_layers are {tuple(target.selected_layers)}")


@torch.no_grad()
def deepen_state_dict(state: dict[str, torch.Tensor], source: ModelConfig,
                      target: ModelConfig) -> dict[str, torch.Tensor]:
    """`state` (weights of the `source` architecture) as weights of the deeper `target`
    architecture that compute the same function (the module docstring). Tensors outside the
    block stacks are shared, not copied."""
    _check(source, target)
    out: dict[str, torch.Tensor] = {}
    stacked = {prefix for prefix, _ in _STACKS}
    for key, value in state.items():
        if not any(key.startswith(prefix) for prefix in stacked):
            out[key] = value
    for prefix, field in _STACKS:
        n, m = getattr(source, field), getattr(target, field)
        if field == "camera_trunk_depth" and not target.enable_camera:
            continue
        where = placement(n, m)
        first = 0
        for i, last in enumerate(where):
            block = {key[len(f"{prefix}{i}."):]: value for key, value in state.items()
                     if key.startswith(f"{prefix}{i}.")}
            if not block:
                raise ValueError(f"the checkpoint has no weights under {prefix}{i}.")
            for j in range(first, last + 1):
                for name, value in block.items():
                    identity = j < last and name.rsplit(".", 1)[-1] == "gamma"
                    out[f"{prefix}{j}.{name}"] = torch.zeros_like(value) if identity else value.clone()
            first = last + 1
    return out
