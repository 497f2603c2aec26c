"""How a training run spreads over the processes torchrun starts: DDP replicas or FSDP2 shards.

ddp: every process holds the whole model, its gradients and AdamW's moments; DDP averages the
gradients. fsdp: every process holds a 1/N shard of each parameter, gradient and moment
(PyTorch's FSDP2, `fully_shard`); a unit's full weights exist only while it computes, gathered
from the shards and freed after it. Both average the gradients over the processes, so they
train the same function; fsdp trades a gather per unit and step for the memory of the
weights, gradients and moments (16 bytes per parameter in fp32 with AdamW, of which fsdp keeps
1/N), and pays when those, not the activations, are what does not fit.

The units are the ViT's blocks, the ViT, each trunk frame and global block, each camera-head
trunk block, the camera head, the dense heads, and the root (the clip forward), which keeps
the rest (the special tokens). The training forward calls the global and camera blocks through
their `attention_inputs` / `attention_output` halves and the camera head through `refine`,
not through `forward`, so those methods are registered with FSDP to gather their unit's
weights as a forward would.

Checkpoints of a sharded run hold the full tensors, gathered to rank 0 on the CPU, under the
same keys as an unsharded run's (the optimizer's state keyed by parameter name), so that
`mapstream.load_model` reads the exported weights and a run resumes with any process count
or mode.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
from torch import nn

__all__ = ["DISTRIBUTED_MODES", "Parallel"]

DISTRIBUTED_MODES = ("ddp", "fsdp")
_HALVES = ("attention_inputs", "attention_output")


def _shard_units(model: nn.Module) -> list[tuple[nn.Module, tuple[str, ...]]]:
    """(module, methods the training forward calls instead of forward), innermost first."""
    agg = model.aggregator
    units: list[tuple[nn.Module, tuple[str, ...]]] = [(b, ()) for b in agg.patch_embed.blocks]
    units.append((agg.patch_embed, ()))
    units += [(b, ()) for b in agg.frame_blocks]
    units += [(b, _HALVES) for b in agg.global_blocks]
    if model.camera_head is not None:
        units += [(b, _HALVES) for b in model.camera_head.trunk]
        units.append((model.camera_head, ("refine",)))
    units += [(head, ()) for head in (model.depth_head, getattr(model, "point_head", None)) if head is not None]
    return units


def _full(value: Any) -> Any:
    """A DTensor's full tensor (a collective: every rank calls it), anything else as it is."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


@dataclasses.dataclass(frozen=True)
class Parallel:
    """The run's mode ("ddp" or "fsdp") over `world` processes; with one process both are the
    plain single-process run."""

    mode: str
    world: int
    rank: int
    device: torch.device

    def __post_init__(self) -> None:
        if self.mode not in DISTRIBUTED_MODES:
            raise ValueError(f"distributed must be one of {DISTRIBUTED_MODES}, got {self.mode!r}")

    @property
    def sharded(self) -> bool:
        return self.mode == "fsdp" and self.world > 1

    def wrap(self, forward: nn.Module, model: nn.Module, *, some_unused: bool = False) -> nn.Module:
        """The module to call: `forward` (whose submodule `model` is the network) as a DDP
        replica or sharded in place with FSDP2. Call before building the optimizer: sharding
        replaces the parameters. some_unused: some steps leave parameters out of the forward
        (DDP then looks for them each step)."""
        if self.world <= 1:
            return forward
        if self.mode == "ddp":
            return nn.parallel.DistributedDataParallel(
                forward, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=some_unused)
        if some_unused:
            raise ValueError("--dense-every above 1 leaves the dense heads out of some steps, which "
                             "--distributed fsdp does not support: use --distributed ddp")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
        from torch.nn.utils import parametrize

        if any(parametrize.is_parametrized(m) for m in model.modules()):
            raise ValueError("--distributed fsdp does not shard LoRA adapters (parametrized weights): "
                             "use --distributed ddp, whose replicas of a LoRA run are small anyway")
        # FSDP warns of every unit that returns a view (an in-place op on it would skip the
        # gather for the backward); the training forward changes no unit's output in place.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        mesh = init_device_mesh(self.device.type, (self.world,))
        for unit, methods in _shard_units(model):
            fully_shard(unit, mesh=mesh)
            for name in methods:
                register_fsdp_forward_method(unit, name)
        # The root's weights are gathered for the whole step (FSDP keeps them for the backward).
        fully_shard(forward, mesh=mesh)
        return forward

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict of `model` (on the CPU when sharded; empty on ranks other than 0
        then). A collective when sharded: every rank calls it."""
        if not self.sharded:
            return model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state (sharded: full, keyed by parameter name, on rank 0's CPU; a collective)."""
        if not self.sharded:
            return optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a checkpoint's optimizer state, written by either mode (every rank reads the file)."""
        by_name = any(isinstance(k, str) for k in state["state"]) or any(
            isinstance(p, str) for g in state["param_groups"] for p in g["params"])
        if not by_name and not self.sharded:
            optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if not by_name:  # an unsharded run's state, keyed by position in the same parameter groups
            names = {id(p): n for n, p in model.named_parameters()}
            order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
            state = {"state": {order[i]: v for i, v in state["state"].items()},
                     "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]}
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def ema_state(self, ema) -> dict[str, Any]:
        """The EMA's state with full tensors (a collective when sharded)."""
        state = ema.state_dict()
        if not self.sharded:
            return state
        return {**state, "shadow": {n: _full(v).cpu() for n, v in state["shadow"].items()}}

    def load_ema_state(self, ema, state: dict[str, Any]) -> None:
        """Load a checkpoint's EMA (full tensors) into `ema`, whose averages are shards when sharded."""
        if not self.sharded:
            ema.load_state_dict(state)
            return
        from torch.distributed.tensor import DTensor, distribute_tensor

        shadow = {}
        for name, value in state["shadow"].items():
            mine = ema.shadow.get(name)
            shadow[name] = distribute_tensor(value.to(self.device, mine.dtype), mine.device_mesh, mine.placements) \
                if isinstance(mine, DTensor) else value
        ema.load_state_dict({**state, "shadow": shadow})

    @staticmethod
    def full(value: torch.Tensor) -> torch.Tensor:
        """`value` as a plain tensor (the gradient norm of sharded gradients is a DTensor)."""
        return _full(value)
