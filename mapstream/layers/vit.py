"""DINOv2 ViT with register tokens, used as the patch embedding (`aggregator.patch_embed`).

Only the normalised patch tokens leave this module; its cls and register outputs are
discarded by the model. Parameter names match the DINOv2 checkpoints.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .block import Block

__all__ = ["PatchEmbedViT"]


class _ConvPatchify(nn.Module):
    def __init__(self, patch_size: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """[n, 3, H, W] -> [n, (H/p)*(W/p), dim], patches in row-major order.

        The convolution's stride equals its kernel, so it is one matrix product of the
        flattened patches with the flattened kernel (weights stay in the checkpoint's conv
        layout). cuDNN runs this 14x14/14 convolution as a slow kernel plus layout
        conversions; the product is far shorter."""
        n, c, height, width = images.shape
        p = self.proj.kernel_size[0]
        patches = images.reshape(n, c, height // p, p, width // p, p).permute(0, 2, 4, 1, 3, 5)
        patches = patches.reshape(n, (height // p) * (width // p), c * p * p)
        return F.linear(patches, self.proj.weight.reshape(self.proj.out_channels, -1), self.proj.bias)


class PatchEmbedViT(nn.Module):
    def __init__(
        self,
        *,
        img_size: int,
        patch_size: int,
        dim: int,
        depth: int,
        num_heads: int,
        num_registers: int,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.pos_grid = img_size // patch_size
        self.num_registers = num_registers
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.pos_grid**2, dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, num_registers, dim))
        # Kept for checkpoint compatibility (masked-image training); unused at inference.
        self.mask_token = nn.Parameter(torch.zeros(1, dim))
        self.patch_embed = _ConvPatchify(patch_size, dim)
        self.blocks = nn.ModuleList(
            Block(dim, num_heads, mlp_ratio=mlp_ratio, norm_eps=1e-6) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        # Resized embeddings per (grid, dtype, device), each valid for one value of the stored
        # grid (its storage and version counter): the resize is ~15 kernels that every frame's
        # step would otherwise run. Not a buffer, so not in the state dict; bounded like the
        # DPT head's position embeddings.
        self._resized: dict[tuple, torch.Tensor] = {}

    def position_embedding(self, grid_h: int, grid_w: int, dtype: torch.dtype) -> torch.Tensor:
        """cls + patch positional embedding for a grid_h x grid_w patch grid: [1, 1 + h*w, dim].

        The stored square grid is resized with antialiased bicubic interpolation (PIL-style
        filter), exactly to (grid_h, grid_w); a grid of the stored size is used as is. Without
        autograd the result is kept and served again until the stored grid changes.
        """
        pos = self.pos_embed
        if torch.is_grad_enabled() and pos.requires_grad:
            return self._resize_positions(grid_h, grid_w, dtype)
        key = (grid_h, grid_w, dtype, pos.device, pos.data_ptr(), pos._version)
        kept = self._resized.get(key)
        if kept is None:
            if len(self._resized) >= 8:  # a stream of ever-new sizes must not grow memory
                self._resized.clear()
            kept = self._resized[key] = self._resize_positions(grid_h, grid_w, dtype)
        return kept

    def _resize_positions(self, grid_h: int, grid_w: int, dtype: torch.dtype) -> torch.Tensor:
        pos = self.pos_embed
        if grid_h == self.pos_grid and grid_w == self.pos_grid:
            return pos.to(dtype)
        cls_pos, patch_pos = pos[:, :1], pos[:, 1:]
        dim = pos.shape[-1]
        grid = patch_pos.float().reshape(1, self.pos_grid, self.pos_grid, dim).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(grid_h, grid_w), mode="bicubic", antialias=True, align_corners=False)
        patch_pos = grid.permute(0, 2, 3, 1).reshape(1, grid_h * grid_w, dim)
        return torch.cat((cls_pos.float(), patch_pos), dim=1).to(dtype)

    def forward(self, images: torch.Tensor, *, return_hidden: bool = False):
        """Normalised patch tokens [n, h*w, dim] of images [n, 3, H, W] (ImageNet-normalised).

        With return_hidden=True also returns the list of every block's output
        ([n, 1 + registers + h*w, dim], for parity tests).
        """
        n, _, height, width = images.shape
        p = self.patch_size
        if height % p or width % p:
            raise ValueError(f"image size {height}x{width} is not a multiple of the patch size {p}")
        tokens = self.patch_embed(images)
        tokens = torch.cat((self.cls_token.expand(n, -1, -1), tokens), dim=1)
        tokens = tokens + self.position_embedding(height // p, width // p, tokens.dtype)
        # Registers go right after cls, after the positional embedding (they have none).
        tokens = torch.cat((tokens[:, :1], self.register_tokens.expand(n, -1, -1), tokens[:, 1:]), dim=1)
        if return_hidden:
            hidden = []
            for block in self.blocks:
                tokens = block(tokens)
                hidden.append(tokens)
            return self.norm(tokens)[:, 1 + self.num_registers :], hidden
        return self.run_blocks(tokens)[:, 1 + self.num_registers :]

    def compile_parts(self, compile) -> None:
        """Use a compiled form of `run_blocks` (called once, when the network is built to be
        compiled)."""
        self.run_blocks = compile(self.run_blocks)

    def run_blocks(self, tokens: torch.Tensor) -> torch.Tensor:
        """The blocks and the final norm, as one function: compiled whole (`compile_parts`),
        each block's last residual add fuses with the next block's first norm."""
        for block in self.blocks:
            tokens = block(tokens)
        return self.norm(tokens)
