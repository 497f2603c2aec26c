"""Run the q/k/v heads kernel (mapstream/layers/_heads_kernel.py) under Triton's CPU
interpreter against the PyTorch composition with the same rounding points, and print the
largest errors as JSON. Started by test_layers_fast_forms.py in a fresh process with
TRITON_INTERPRET=1."""
from __future__ import annotations

import dataclasses
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _to_bf16(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, tl.load(X + offs).to(tl.bfloat16))


def _interpreter_truncates() -> bool:
    """Whether the interpreter rounds fp32 to bf16 toward zero (Triton 3.6–3.9 do; the GPU
    rounds to nearest even, as PyTorch does, and tests/gpu compares with PyTorch there)."""
    x = torch.tensor([1.0 + 2.0**-8 + 2.0**-10] * 16)
    y = torch.empty(16, dtype=torch.bfloat16)
    _to_bf16[(1,)](x, y, N=16)
    return float(y[0]) == 1.0


def to_interpreted(t: torch.Tensor, dtype: torch.dtype, truncates: bool) -> torch.Tensor:
    """t rounded to dtype as the interpreter rounds it, then back to fp32."""
    if dtype != torch.bfloat16 or not truncates:
        return t.to(dtype).float()
    return (t.float().contiguous().view(torch.int32) & -65536).view(torch.float32)


def reference(qkv, heads, q_norm, k_norm, rotary, round_intermediates=True, truncates=True):
    """Rounded where the modules round: the LayerNorm's result and the rotation table to the
    tensor's dtype (unless round_intermediates is False: autocast keeps them fp32); the
    rotation in fp32, rounded once."""
    dtype = qkv.dtype
    mid = dtype if round_intermediates else torch.float32
    dim = qkv.shape[-1] // (3 * heads)
    q, k, v = qkv.float().unflatten(-1, (3, heads, dim)).permute(2, 0, 3, 1, 4).unbind(0)
    if q_norm is not None:
        q = to_interpreted(F.layer_norm(q, (dim,), q_norm.weight.float(), q_norm.bias.float(), q_norm.eps), mid, truncates)
        k = to_interpreted(F.layer_norm(k, (dim,), k_norm.weight.float(), k_norm.bias.float(), k_norm.eps), mid, truncates)
    if rotary is not None:
        table = dataclasses.replace(rotary, cos=to_interpreted(rotary.cos, mid, truncates), sin=to_interpreted(rotary.sin, mid, truncates))
    # Per row, the largest value the rotation mixes: one unit of it bounds what a LayerNorm
    # result rounded the other way (statistics differing in fp32's last bits) can change.
    scales = [t.abs().amax(-1, keepdim=True) for t in (q, k, v)]
    if rotary is not None:
        q, k = table.apply(q), table.apply(k)
    return [to_interpreted(t, dtype, truncates).to(dtype) for t in (q, k, v)], scales


@torch.no_grad()
def main() -> None:
    from mapstream.layers import rope2d, rope3d
    from mapstream.layers.heads import launch_qkv_heads
    from mapstream.layers.rope import patch_positions_2d, token_positions_3d

    torch.manual_seed(0)
    truncates = _interpreter_truncates()
    report = {}
    cases = [
        # name, batch, tokens, heads, head dim, norm, rope kind
        ("2d_norm", 3, 37, 2, 16, True, "2d"),
        ("3d_norm", 1, 70, 2, 16, True, "3d"),
        ("3d_norm_stacked", 2, 70, 2, 16, True, "3d_stacked"),
        ("3d_norm_one_table_two_rows", 2, 70, 2, 16, True, "3d_one_stacked"),
        ("norm_only", 2, 9, 3, 16, True, None),
        ("rope_only", 1, 70, 2, 16, False, "3d"),
        ("2d_norm_d64", 1, 130, 3, 64, True, "2d"),
        ("3d_norm_d64", 1, 130, 2, 64, True, "3d"),
        ("2d_norm_d32", 2, 37, 3, 32, True, "2d"),
        ("3d_norm_d128", 1, 40, 2, 128, True, "3d"),
    ]
    for name, batch, tokens, heads, dim, norm, kind in cases:
        for dtype, rounding in ((torch.float32, True), (torch.bfloat16, True), (torch.bfloat16, False)):
            qkv = (torch.randn(batch, tokens, 3 * heads * dim) * 2 + 0.5).to(dtype)
            q_norm = k_norm = None
            if norm:
                q_norm, k_norm = nn.LayerNorm(dim, eps=1e-5), nn.LayerNorm(dim, eps=1e-6)
                for m in (q_norm, k_norm):
                    nn.init.normal_(m.weight, 1.0, 0.3)
                    nn.init.normal_(m.bias, 0.0, 0.3)
                    m.to(dtype)
            rotary = None
            if kind == "2d":
                side = int(tokens ** 0.5)
                pos = patch_positions_2d(side, (tokens - 1) // side, 1, "cpu")[:tokens]
                pos = torch.cat((pos, torch.zeros(tokens - len(pos), 2, dtype=pos.dtype)))
                rotary = rope2d(pos * 3, dim, 100.0)
            elif kind in ("3d", "3d_stacked", "3d_one_stacked"):
                dims = (dim // 4, 3 * dim // 8, 3 * dim // 8)
                pos = token_positions_3d(torch.arange(5, 5 + -(-tokens // 35)), 5, 6, 5)[:tokens]  # 35 tokens a frame
                rotary = rope3d(pos * 7, dims, 10000.0)
                if kind == "3d_one_stacked":  # [1, 1, N, D/2]: one table for both batch rows
                    rotary = dataclasses.replace(rotary, cos=rotary.cos[None, None], sin=rotary.sin[None, None])
                if kind == "3d_stacked":
                    other = rope3d(pos * 11 + 1, dims, 10000.0)
                    rotary = dataclasses.replace(
                        rotary, cos=torch.stack((rotary.cos, other.cos)).unsqueeze(1),
                        sin=torch.stack((rotary.sin, other.sin)).unsqueeze(1),
                    )
            got = launch_qkv_heads(
                qkv,
                None if q_norm is None else q_norm.weight, None if q_norm is None else q_norm.bias,
                None if k_norm is None else k_norm.weight, None if k_norm is None else k_norm.bias,
                None if rotary is None else rotary.cos, None if rotary is None else rotary.sin,
                heads, 1e-5 if norm else 0.0, 1e-6 if norm else 0.0,
                rotary is not None and rotary.interleaved, 1 if rotary is None else rotary.axes, rounding,
            )
            want, scales = reference(qkv, heads, q_norm, k_norm, rotary, rounding, truncates)
            row = {}
            for label, g, w, scale in zip("qkv", got, want, scales):
                diff = (g.float() - w.float()).abs()
                # bf16: units of the row's largest mixed value (2^-7 relative); and the share
                # of elements off by more than one unit of their own value.
                bf16 = dtype == torch.bfloat16
                row[label] = {
                    "max_abs": float(diff.max()),
                    "max_units_of_row": float((diff / (scale * 2.0**-7 + 1e-30)).max()) if bf16 else 0.0,
                    "beyond_own_unit": float((diff > w.float().abs() * 2.0**-7).float().mean()) if bf16 else 0.0,
                    "shape_ok": list(g.shape) == [batch, heads, tokens, dim] and g.is_contiguous(),
                    "dtype_ok": g.dtype == dtype,
                }
            report[f"{name}/{str(dtype)[6:]}{'' if rounding else '/fp32_between'}"] = row
    print(json.dumps(report))


if __name__ == "__main__":
    main()
