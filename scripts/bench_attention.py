"""Attention over the cache, alone: one frame's queries against a full window (CUDA).

Times the kernels available for the global-attention shape of the benchmark protocol
(978 queries, 16 heads, head dim 64, ~71k keys, bf16) with CUDA events, median of many
calls, on K/V as the cache stores them (views of [2, H, T, D] storage) and contiguous.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from _timing import Results, timeit


def main(out_path=None):
    torch.manual_seed(0)
    nq, heads, d = 978, 16, 64
    nk = 72 * 972 + 200 * 6
    flops = 4 * nq * nk * heads * d
    storage = torch.randn(2, heads, nk + 978, d, device="cuda", dtype=torch.bfloat16)
    k, v = storage[0, :, :nk][None], storage[1, :, :nk][None]
    kc, vc = k.contiguous(), v.contiguous()
    q = torch.randn(1, heads, nq, d, device="cuda", dtype=torch.bfloat16)
    res = Results(nq=nq, nk=nk, tflop=flops / 1e12)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        for layout, (kk, vv) in [("view", (k, v)), ("contig", (kc, vc))]:
            try:
                with sdpa_kernel(backend):
                    us = timeit(lambda: F.scaled_dot_product_attention(q, kk, vv))
                res[f"sdpa_{name}_{layout}_us"] = us
                res[f"sdpa_{name}_{layout}_tflops"] = flops / us / 1e6
            except Exception as e:  # noqa: BLE001
                res[f"sdpa_{name}_{layout}"] = f"unavailable: {str(e)[:120]}"
    us = timeit(lambda: F.scaled_dot_product_attention(q, k, v))
    res["sdpa_default_view_us"] = us
    try:
        import torch.nn.attention as tna

        res["torch_has_activate_flash_attention_impl"] = hasattr(tna, "activate_flash_attention_impl")
        if hasattr(tna, "list_flash_attention_impls"):
            res["flash_impls"] = list(tna.list_flash_attention_impls())
        if hasattr(tna, "activate_flash_attention_impl"):
            try:
                tna.activate_flash_attention_impl("FA3")
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    us = timeit(lambda: F.scaled_dot_product_attention(q, k, v))
                res["sdpa_fa3_view_us"] = us
                res["sdpa_fa3_view_tflops"] = flops / us / 1e6
            except Exception as e:  # noqa: BLE001
                res["sdpa_fa3"] = f"unavailable: {str(e)[:200]}"
            finally:
                try:
                    tna.restore_flash_attention_impl()
                except Exception:  # noqa: BLE001
                    pass
    except Exception as e:  # noqa: BLE001
        res["fa3_probe"] = str(e)[:200]
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    us = timeit(lambda: a @ a, reps=10)
    res["matmul_8192_tflops"] = 2 * 8192**3 / us / 1e6
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    try:
        import flashinfer

        qn = q[0].transpose(0, 1).contiguous()
        for layout, (kk, vv) in [("contig", (kc, vc)), ("view", (k, v))]:
            for backend in ("fa2", "fa3"):
                name = f"flashinfer_single_{backend}_{layout}"
                try:
                    fn = lambda: flashinfer.single_prefill_with_kv_cache(
                        qn, kk[0], vv[0], causal=False, kv_layout="HND", backend=backend
                    )
                    out = fn()
                    ref = F.scaled_dot_product_attention(q, kk, vv)[0].transpose(0, 1)
                    res[name + "_relerr"] = float((out.float() - ref.float()).norm() / ref.float().norm())
                    us = timeit(fn)
                    res[name + "_us"] = us
                    res[name + "_tflops"] = flops / us / 1e6
                except Exception as e:  # noqa: BLE001
                    res[name] = f"failed: {str(e)[:200]}"
    except Exception as e:  # noqa: BLE001
        res["flashinfer"] = f"import failed: {str(e)[:200]}"
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
