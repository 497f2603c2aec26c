"""Patch flow: where each patch's centre is seen in the clip's other frames.

A network trained from scratch has to learn to match image content between frames before its
camera head can measure motion; supervised on the camera alone, a small one does not start in
thousands of steps (docs/TRAINING.md, "What the camera can learn from scratch"). Patch flow
asks every patch token for its match directly: the displacement, in patches, from the patch's
centre to where the same surface point lies in the first frame and in the previous frame,
computed from the clip's depth and poses. `PatchFlowHead` reads it off the aggregator's last
selected layer during training only; the exported weights do not hold it.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..geometry import project_points, transform_points

__all__ = ["FLOW_REFERENCES", "PatchFlowHead", "patch_flow_targets"]

FLOW_REFERENCES = ("first", "previous")
"""The frames each patch's flow points to, in the order of the flow's channel pairs."""


class PatchFlowHead(nn.Module):
    """A linear read-out of the patch tokens [..., P, 2C] to their flow [..., P, 2 * len(FLOW_REFERENCES)]
    (dx, dy in patches per reference frame)."""

    def __init__(self, token_width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(token_width, 2 * len(FLOW_REFERENCES))

    def forward(self, patch_tokens: Tensor) -> Tensor:
        return self.proj(patch_tokens)


@torch.no_grad()
def patch_flow_targets(
    depth: Tensor, valid: Tensor, T_world_cam: Tensor, K: Tensor, patch: int, *, occlusion: float = 0.05
) -> tuple[Tensor, Tensor]:
    """The true patch flow of clips: depth [B,S,H,W] (camera z), valid [B,S,H,W], camera-to-world
    poses [B,S,4,4], intrinsics [B,S,3,3] of the H x W frames, patch size `patch`.

    For the centre pixel (patch * c + patch // 2, patch * r + patch // 2) of every patch, its
    surface point (from its depth) is projected into each reference frame of FLOW_REFERENCES.
    Returns (flow [B, S, P, 2R] float32, the displacement (du, dv) / patch to each reference,
    0 where unknown; known [B, S, P, R] bool). A flow is known where the centre's depth is
    valid, the point lands inside the reference frame in front of it, and the reference frame
    sees that point there (its own depth within `occlusion` of the point's, relative): not for
    frame 0, whose references are itself.
    """
    B, S, H, W = depth.shape
    device = depth.device
    rows = torch.arange(H // patch, device=device) * patch + patch // 2
    cols = torch.arange(W // patch, device=device) * patch + patch // 2
    depth, K, T = depth.float(), K.float(), T_world_cam.float()

    def centres(x: Tensor) -> Tensor:  # [B, S, H, W] -> [B, S, P]
        return x[:, :, rows][:, :, :, cols].flatten(2)

    z = centres(depth)
    ok = centres(valid) & (z > 0)
    v, u = (g.flatten().float() for g in torch.meshgrid(rows, cols, indexing="ij"))
    rays = torch.einsum("bsij,pj->bspi", torch.linalg.inv(K), torch.stack((u, v, torch.ones_like(u)), dim=-1))
    world = transform_points(T, rays * z[..., None])  # [B, S, P, 3]

    flows, known = [], []
    frame = torch.arange(S, device=device)
    for name in FLOW_REFERENCES:
        ref = torch.zeros_like(frame) if name == "first" else (frame - 1).clamp(min=0)
        uv, z_ref = project_points(world, K[:, ref], T[:, ref])
        ahead = z_ref > 1e-6
        uv = torch.where(ahead[..., None], uv, torch.zeros_like(uv))
        col, row = uv[..., 0].round(), uv[..., 1].round()
        inside = ahead & (col >= 0) & (col <= W - 1) & (row >= 0) & (row <= H - 1)
        index = (row.clamp(0, H - 1) * W + col.clamp(0, W - 1)).long()  # [B, S, P]
        ref_depth = depth[:, ref].flatten(2).gather(2, index)
        seen = valid[:, ref].flatten(2).gather(2, index) & ((ref_depth - z_ref).abs() <= occlusion * z_ref)
        flows.append(torch.stack(((uv[..., 0] - u) / patch, (uv[..., 1] - v) / patch), dim=-1))
        known.append(ok & inside & seen & (frame > 0)[None, :, None])
    flow, known_all = torch.cat(flows, dim=-1), torch.stack(known, dim=-1)
    return torch.where(known_all.repeat_interleave(2, dim=-1), flow, torch.zeros_like(flow)), known_all
