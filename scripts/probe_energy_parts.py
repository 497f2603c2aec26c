"""Where the cache attention's energy goes, and what the trunk's products cost beside it.

Under the protocol the H200 sits at its 700 W cap (docs/BENCHMARKS.md, session 22), so the
step's time follows its energy; the cache attention is ≈ 10 of a step's ≈ 15 J. Which part of
it is worth attacking depends on where those joules go: moving K/V (HBM, L2, the crossbar into
shared memory) or the arithmetic (the two products, the exponential, the sums). This probe runs
one simplified kernel (the step's fixed-reference-point loop over a plain grid, TMA tiles) with
parts switched off, each at the protocol's shape, and meters each with NVML's energy counter:

- `full`: the loop as the step runs it;
- `same_head`: every head reads head 0's K/V (HBM traffic /16, L2 traffic unchanged);
- `load_once`: each program loads one K/V tile before the loop and reuses it (no K/V traffic
  in the loop at all);
- `no_exp`: the scores' affine map only, no exponential (the special function unit idle);
- `no_pv`: no P.V product (the weights' sum still consumes the exponentials).

The differences against `full` bound each part's share (the parts interact: the clock each
load runs at moves with its power). `--gemms` meters the trunk's four products a block
(bf16, 978 tokens: qkv, proj, fc1, fc2) for the 72 blocks of a step (24 patch-embed, 24 frame,
24 global).

Usage (device, from scripts/): python3 probe_energy_parts.py [--attention] [--gemms] [--out F]
"""
from __future__ import annotations

import argparse
import math

import torch
import triton
import triton.language as tl

from _probe import energy, energy_reader, report
from _timing import captured, timeit

from mapstream.attention.triton_flash import KernelConfig, _bound_reference, flash_attention

HEADS, KEYS, DIM, QUERIES = 16, 71_232, 64, 978
BLOCK_M, BLOCK_N = 64, 128
VARIANTS = {
    "full": {},
    "same_head": {"SAME_HEAD": True},
    "load_once": {"LOAD_ONCE": True},
    "no_exp": {"EXP": False},
    "no_pv": {"PV": False},
}


@triton.jit
def _parts(Q, k_desc, v_desc, O, n_q, n_keys, qk_scale, key_norm,
           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           SAME_HEAD: tl.constexpr = False, LOAD_ONCE: tl.constexpr = False,
           EXP: tl.constexpr = True, PV: tl.constexpr = True):
    """Rows of program_id(0)'s block of head program_id(1) over the first whole tiles of
    n_keys keys, with the fixed reference point; O [H, Nq, D] fp32."""
    head = tl.program_id(1)
    kv_head = 0 if SAME_HEAD else head
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_q
    offs_d = tl.arange(0, HEAD_DIM)
    rows = head * n_q + offs_m
    q = tl.load(Q + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = _bound_reference(q, key_norm, qk_scale)
    q = q.to(k_desc.dtype)
    qk_scale = tl.cast(qk_scale, tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k0 = k_desc.load([kv_head, 0, 0]).reshape(BLOCK_N, HEAD_DIM)
    v0 = v_desc.load([kv_head, 0, 0]).reshape(BLOCK_N, HEAD_DIM)
    for start in tl.range(0, (n_keys // BLOCK_N) * BLOCK_N, BLOCK_N):
        if LOAD_ONCE:
            k = k0
            v = v0
        else:
            k = k_desc.load([kv_head, start, 0]).reshape(BLOCK_N, HEAD_DIM)
            v = v_desc.load([kv_head, start, 0]).reshape(BLOCK_N, HEAD_DIM)
        p = tl.dot(q, tl.trans(k)) * qk_scale - m_i[:, None]
        if EXP:
            p = tl.math.exp2(p)
        l_i += tl.sum(p, 1)
        if PV:
            acc = tl.dot(p.to(v.dtype), v, acc)
    out = acc / tl.where(l_i != 0, l_i, 1.0)[:, None]
    tl.store(O + rows[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None])


def _parts_call(q, k, v, out, key_norm: float, flags: dict) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    block = [1, BLOCK_N, DIM]
    k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), block)
    v_desc = TensorDescriptor(v, list(v.shape), list(v.stride()), block)
    grid = (triton.cdiv(q.shape[1], BLOCK_M), q.shape[0])
    _parts[grid](q, k_desc, v_desc, out, q.shape[1], k.shape[1], 1.4426950408889634 / math.sqrt(DIM), key_norm,
                 HEAD_DIM=DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4, num_stages=3, **flags)


def _metered(nvml, fn, calls: int = 10) -> dict:
    """µs a call (graph of `calls` calls, CUDA events) and J a call (NVML, ≈ 2 s back to back)."""
    graph = captured(fn, calls)
    us = timeit(graph.replay, reps=20) / calls
    e = energy(nvml, graph.replay)
    return {"us": round(us, 1), "J": round(e["J_per_call"] / calls, 5), "W": e["mean_W"],
            "sm_mhz_at_end": e["sm_mhz_at_end"]}


def attention_parts(nvml) -> dict:
    torch.manual_seed(0)
    k = torch.nn.functional.layer_norm(torch.randn(HEADS, KEYS, DIM, device="cuda"), (DIM,)).to(torch.bfloat16)
    v = torch.randn(HEADS, KEYS, DIM, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(HEADS, QUERIES, DIM, device="cuda", dtype=torch.bfloat16)
    key_norm = float(k.float().norm(dim=-1).max()) * 1.01
    out = torch.empty(HEADS, QUERIES, DIM, device="cuda")
    _parts_call(q, k, v, out, key_norm, {})
    keys = (KEYS // BLOCK_N) * BLOCK_N
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k[:, :keys].float(), v[:, :keys].float())
    res: dict = {"full_max_abs_err_vs_fp32": float((out - want).abs().max())}
    works = {name: (lambda flags=flags: _parts_call(q, k, v, out, key_norm, flags)) for name, flags in VARIANTS.items()}
    works["library kernel (the step's)"] = lambda: flash_attention(q, k, v, config=KernelConfig(tma=True, balance=True),
                                                                  key_norm=key_norm)
    for rnd in range(2):  # interleaved rounds: the clock drifts with the GPU's heat
        for name, fn in works.items():
            res.setdefault(name, []).append(row := _metered(nvml, fn))
            print(rnd, name, row, flush=True)
    return res


def trunk_gemms(nvml) -> dict:
    """The four bf16 products of one block at 978 tokens, 72 times (a step's blocks)."""
    torch.manual_seed(0)
    x = torch.randn(QUERIES, 1024, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(QUERIES, 4096, device="cuda", dtype=torch.bfloat16)
    shapes = {"qkv": (3072, 1024), "proj": (1024, 1024), "fc1": (4096, 1024), "fc2": (1024, 4096)}
    weights = {n: (torch.randn(o, i, device="cuda", dtype=torch.bfloat16) * 0.02,
                   torch.zeros(o, device="cuda", dtype=torch.bfloat16)) for n, (o, i) in shapes.items()}
    inputs = {"qkv": x, "proj": x, "fc1": x, "fc2": h}

    def block(names):
        for _ in range(72):
            for n in names:
                torch.nn.functional.linear(inputs[n], *weights[n])

    res = {}
    for names in (tuple(shapes), *((n,) for n in shapes)):
        res["+".join(names) + " x72"] = row = _metered(nvml, lambda names=names: block(names), calls=1)
        print(names, row, flush=True)
    return res


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attention", action="store_true")
    parser.add_argument("--gemms", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    nvml = energy_reader()
    res: dict = {}
    if args.attention:
        res["attention"] = attention_parts(nvml)
    if args.gemms:
        res["gemms"] = trunk_gemms(nvml)
    report(res, args.out)


if __name__ == "__main__":
    main()
