"""The q/k/v heads kernel (mapstream/layers/_heads_kernel.py) on the trunk's shapes: one
504x378 frame (978 tokens), 16 heads of 64, the frame blocks' 2D RoPE and the global
blocks' 3D RoPE, bf16 as the sessions run it (fp32 between, one rounding). Tokens a program
swept; against a plain copy of the projection (what moving its bytes costs) and the PyTorch
composition. Each variant is checked against the composition first, then replayed from CUDA
graphs of 20 calls, interleaved (µs a call).

Usage (CUDA): python scripts/bench_qkv_heads.py
"""
from __future__ import annotations

import torch
from torch import nn

from _timing import captured, interleaved
from mapstream.layers import patch_positions_2d, rope2d, rope3d
from mapstream.layers.heads import launch_qkv_heads
from mapstream.layers.rope import token_positions_3d


@torch.no_grad()
def main() -> None:
    dev = torch.device("cuda")
    heads, dim, grid_h, grid_w, special = 16, 64, 27, 36, 6
    tokens = special + grid_h * grid_w
    torch.manual_seed(0)
    qkv = torch.randn(1, tokens, 3 * heads * dim, device=dev, dtype=torch.bfloat16)
    norms = [nn.LayerNorm(dim, eps=1e-5).to(dev) for _ in range(2)]
    for m in norms:
        nn.init.normal_(m.weight, 1.0, 0.3)
        nn.init.normal_(m.bias, 0.0, 0.3)
    tables = {
        "2d": rope2d(patch_positions_2d(grid_h, grid_w, special, dev), dim, 100.0),
        "3d": rope3d(token_positions_3d(torch.tensor([70], device=dev), grid_h, grid_w, special), (20, 22, 22)),
    }
    for kind, rot in tables.items():
        args = (qkv, norms[0].weight, norms[0].bias, norms[1].weight, norms[1].bias, rot.cos, rot.sin,
                heads, 1e-5, 1e-5, rot.interleaved, rot.axes, False)

        def composition():
            q, k, v = qkv.float().unflatten(-1, (3, heads, dim)).permute(2, 0, 3, 1, 4).unbind(0)
            q, k = rot.apply(norms[0](q)), rot.apply(norms[1](k))
            return q.bfloat16(), k.bfloat16(), v.bfloat16()

        want = composition()
        variants = {"copy": lambda: qkv.clone(), "pytorch": composition}
        for block_t in (8, 16, 32, 64):
            got = launch_qkv_heads(*args, block_t=block_t)
            for g, w in zip(got, want):
                err = float((g.float() - w.float()).abs().max())
                assert err <= 2 ** -7 * float(w.float().abs().max()), (kind, block_t, err)
            variants[f"block_t={block_t}"] = lambda block_t=block_t: launch_qkv_heads(*args, block_t=block_t)
        # 20 calls a graph: one kernel of a few µs is below the cost of replaying a graph.
        graphs = {name: captured(fn, calls=20) for name, fn in variants.items()}
        interleaved({name: g.replay for name, g in graphs.items()}, rounds=5, label=f"{kind} ", calls=20)


if __name__ == "__main__":
    main()
