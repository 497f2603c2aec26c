"""Length-independent attention over the cache (what a CUDA-graph-captured step needs).

The visible keys are a prefix of a fixed-capacity buffer whose length changes every frame.
Candidates, all on one frame's 978 queries against a 77,696-key capacity with 71,184 valid
keys (bf16, 16 heads, head dim 64), median of 30, checked against SDPA on the valid prefix:

  * SDPA with an additive key mask over the whole capacity (cuDNN and the default choice);
  * FlashInfer's cuDNN batch prefill with the KV length read from device memory;
  * FlashInfer's ragged prefill (fa2) planned outside and replayed inside a CUDA graph.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from _timing import Results, timeit


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def main(out_path=None):
    torch.manual_seed(0)
    nq, heads, d = 978, 16, 64
    valid, cap = 72 * 972 + 200 * 6, 73 * 978 + 1024 * 6
    res = Results(nq=nq, valid=valid, capacity=cap)
    kv = torch.randn(2, heads, cap, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, heads, nq, d, device="cuda", dtype=torch.bfloat16)
    k, v = kv[0][None], kv[1][None]
    ref = F.scaled_dot_product_attention(q, k[:, :, :valid], v[:, :, :valid])
    res["sdpa_prefix_us"] = timeit(lambda: F.scaled_dot_product_attention(q, k[:, :, :valid], v[:, :, :valid]))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bias = torch.zeros(1, 1, 1, cap, device="cuda", dtype=torch.bfloat16)
    bias[..., valid:] = float("-inf")
    boolmask = torch.zeros(1, 1, 1, cap, device="cuda", dtype=torch.bool)
    boolmask[..., :valid] = True
    for mname, mask in [("float", bias), ("bool", boolmask), ("float_full", bias.expand(1, heads, nq, cap))]:
        for bname, backend in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
            name = f"sdpa_mask_{mname}_{bname}"
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    res[name + "_relerr"] = rel(fn(), ref)
                    res[name + "_us"] = timeit(fn)
            except Exception as e:  # noqa: BLE001
                res[name] = f"failed: {str(e)[:160]}"
    try:
        import flashinfer
        from flashinfer.cudnn import cudnn_batch_prefill_with_kv_cache

        ws = torch.zeros(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        qn = q[0].transpose(0, 1).contiguous()
        kn = k[0].transpose(0, 1)  # [cap, H, D] strided view
        vn = v[0].transpose(0, 1)
        lens_q = torch.tensor([nq], dtype=torch.int32, device="cuda").view(1, 1, 1, 1)
        lens_kv = torch.tensor([valid], dtype=torch.int32, device="cuda").view(1, 1, 1, 1)
        for layout, (kk, vv) in [("strided", (kn, vn)), ("contig", (kn.contiguous(), vn.contiguous()))]:
            name = f"flashinfer_cudnn_prefill_{layout}"
            try:
                fn = lambda: cudnn_batch_prefill_with_kv_cache(
                    qn, kk, vv, 1.0 / 8.0, ws, max_token_per_sequence=nq, max_sequence_kv=cap,
                    actual_seq_lens_q=lens_q, actual_seq_lens_kv=lens_kv, causal=False, return_lse=False,
                    is_cuda_graph_compatible=True,
                )
                out = fn()
                out = out[0] if isinstance(out, tuple) else out
                res[name + "_relerr"] = rel(out.transpose(0, 1)[None], ref)
                res[name + "_us"] = timeit(fn)
            except Exception as e:  # noqa: BLE001
                res[name] = f"failed: {str(e)[:200]}"
        try:
            wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=True,
                qo_indptr_buf=torch.tensor([0, nq], dtype=torch.int32, device="cuda"),
                kv_indptr_buf=torch.tensor([0, valid], dtype=torch.int32, device="cuda"),
            )
            wrapper.plan(
                torch.tensor([0, nq], dtype=torch.int32), torch.tensor([0, valid], dtype=torch.int32),
                heads, heads, d, causal=False, q_data_type=torch.bfloat16, backend="fa2",
            )
            kc, vc = kn.contiguous(), vn.contiguous()
            out = wrapper.run(qn, kc, vc)
            res["flashinfer_ragged_fa2_relerr"] = rel(out.transpose(0, 1)[None], ref)
            res["flashinfer_ragged_fa2_us"] = timeit(lambda: wrapper.run(qn, kc, vc))
            g = torch.cuda.CUDAGraph()
            static_out = torch.empty_like(qn)
            with torch.cuda.graph(g):
                static_out.copy_(wrapper.run(qn, kc, vc))
            res["flashinfer_ragged_fa2_graph_us"] = timeit(g.replay)
            res["flashinfer_ragged_fa2_graph_relerr"] = rel(static_out.transpose(0, 1)[None], ref)
        except Exception as e:  # noqa: BLE001
            res["flashinfer_ragged"] = f"failed: {str(e)[:200]}"
    except Exception as e:  # noqa: BLE001
        res["flashinfer"] = f"failed: {str(e)[:200]}"
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
