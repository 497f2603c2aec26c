"""Run mapstream's Triton attention kernel under Triton's CPU interpreter and print, as JSON,
its relative error against float64 attention for a grid of key ranges and kernel variants.

Started by test_attention_backends.py in a fresh process with TRITON_INTERPRET=1 (the
variable must be set before Triton is imported).
"""
from __future__ import annotations

import json

import numpy as np
import torch
import triton.runtime.interpreter as interpreter


def _numpy_compat() -> None:
    # Triton 3.6's interpreter converts its one-element scalar arrays with int(array), which
    # NumPy >= 2.4 refuses for 1-d arrays; loop bounds read from memory hit this.
    if tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 4):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def main() -> None:
    _numpy_compat()
    from mapstream.attention.triton_flash import KernelConfig, flash_attention

    torch.manual_seed(0)
    heads, total, dim, n_q = 2, 200, 32, 21
    storage = torch.randn(2, heads, total + 7, dim)[:, :, 3 : 3 + total]  # strided, offset views
    qkv = torch.randn(1, n_q, 3, heads, dim)
    q = qkv[0, :, 0].transpose(0, 1)  # [H, Nq, D] as a block produces it
    configs = {
        "plain": KernelConfig(block_m=16, block_n=32, num_warps=4),
        "tma": KernelConfig(block_m=16, block_n=32, tma=True),
        # Key shares merged by a second kernel; (40, 41) and (0, 32) leave shares empty.
        "split3": KernelConfig(block_m=16, block_n=32, splits=3),
        "tma_split4": KernelConfig(block_m=16, block_n=32, tma=True, splits=4),
        # Spare resident slots take the row blocks' key tails (4 row blocks x heads here):
        # one spare walks all four tails, three take two each, eight one each; with no
        # spare slot the plain grid runs. Tails may be empty (short ranges).
        "balanced_1_spare": KernelConfig(block_m=16, block_n=32, balance=True, slots=5),
        "tma_balanced_3_spare": KernelConfig(block_m=16, block_n=32, tma=True, balance=True, slots=7),
        "balanced_8_spare": KernelConfig(block_m=16, block_n=32, balance=True, slots=12),
        "balanced_no_spare": KernelConfig(block_m=16, block_n=32, balance=True, slots=4),
        # 8 warps with capped registers (two such programs a multiprocessor on an H200).
        "balanced_capped_registers": KernelConfig(block_m=32, block_n=32, num_warps=8, maxnreg=128, balance=True,
                                                  slots=3),
    }
    report = {}
    for lo, hi in [(0, total), (13, 150), (40, 41), (0, 32), (5, 69), (31, 200)]:
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.double(), storage[0, :, lo:hi].double(), storage[1, :, lo:hi].double()
        )
        for name, config in configs.items():
            for how, kv_range in (("ints", (lo, hi)), ("tensor", torch.tensor([lo, hi], dtype=torch.int32))):
                out = flash_attention(q, storage[0], storage[1], kv_range=kv_range, config=config)
                token_major = out.transpose(0, 1).is_contiguous()
                err = float((out.double() - ref).norm() / ref.norm())
                report[f"{name}/{how}/{lo}-{hi}"] = {"err": err, "token_major": token_major,
                                                      "shape": list(out.shape)}
    # The hook torch.compile's custom op uses (`launch=wrap_triton`): every kernel goes
    # through it, and the result is the plain call's.
    wrapped = []

    def launch(kernel):
        wrapped.append(kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__)
        return kernel

    for name in ("plain", "split3", "balanced_8_spare"):
        plain = flash_attention(q, storage[0], storage[1], config=configs[name])
        hooked = flash_attention(q, storage[0], storage[1], config=configs[name], launch=launch)
        report[f"launch_hook/{name}"] = {"equal": bool(torch.equal(plain, hooked))}
    report["launch_hook/wrapped"] = wrapped
    print(json.dumps({"flash": report, "wide": wide_range_report(q, storage), "fixed": fixed_report(q, storage),
                      "rows": rows_report(storage)}))


def _hinted(q, k, v, config, key_norm: float | None, kv_range=None) -> dict:
    """One call with a key-norm hint (none for None): error against float64, row blocks
    computed again."""
    from mapstream.attention.triton_flash import flash_attention

    lo, hi = (0, k.shape[1]) if kv_range is None else kv_range
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k[:, lo:hi].double(), v[:, lo:hi].double())
    repairs = torch.zeros(1, dtype=torch.int32)
    hint = {} if key_norm is None else dict(key_norm=key_norm, repairs=repairs)
    rng = None if kv_range is None else torch.tensor(kv_range, dtype=torch.int32)
    out = flash_attention(q, k, v, kv_range=rng, config=config, **hint)
    return {"err": float((out.double() - ref).norm() / ref.norm()), "repairs": int(repairs) if hint else None}


_BALANCED = {
    "balanced_3_spare": dict(block_m=16, block_n=32, balance=True, slots=7),
    "tma_balanced_8_spare": dict(block_m=16, block_n=32, tma=True, balance=True, slots=12),
}


def fixed_report(q: torch.Tensor, storage: torch.Tensor) -> dict:
    """The balanced grid with a fixed reference point (`key_norm`): error against float64
    and row blocks recomputed, for a right estimate of the longest key, a far too large one
    (every weight underflows: all recomputed), and keys 30x longer than a far too small
    estimate (the weights overflow: recomputed), over several key ranges. fp16 K/V ignore
    the hint (their P could not hold the weights' range): nothing recomputed."""
    from mapstream.attention.triton_flash import KernelConfig

    report = {}
    for keys, k in (("plain", storage[0]), ("long", storage[0] * 30.0)):
        longest = float(k.norm(dim=-1).max())
        estimates = {"right": longest, "too_large": 1e4} if keys == "plain" else {"too_small": 1.0}
        for lo, hi in [(0, 200), (13, 150), (40, 41), (5, 69)]:
            for name, options in _BALANCED.items():
                for estimate, key_norm in estimates.items():
                    report[f"{keys}/{name}/{estimate}/{lo}-{hi}"] = _hinted(
                        q, k, storage[1], KernelConfig(**options), key_norm, (lo, hi))
    half = storage.half()
    report["half/balanced_3_spare/too_large/13-150"] = _hinted(
        q.half(), half[0], half[1], KernelConfig(**_BALANCED["balanced_3_spare"]), 1e4, (13, 150))
    return report


def wide_range_report(q: torch.Tensor, storage: torch.Tensor) -> dict:
    """Scores that rise by far more than fp32's range of exponentials from tile to tile (and,
    reversed, fall): the running max must rescale many times, and a fixed reference point
    from the right key-norm bound must hold every weight that counts in range (the rest of
    each row's keys weigh 2^-40 or less). Error against float64 and row blocks recomputed."""
    from mapstream.attention.triton_flash import KernelConfig

    report = {}
    ramp = torch.linspace(0.2, 12.0, storage.shape[2])[None, :, None]
    for order, scale in (("rising", ramp), ("falling", ramp.flip(1))):
        k = storage[0] * scale
        report[f"{order}/plain"] = _hinted(q, k, storage[1], KernelConfig(block_m=16, block_n=32), None)
        for name, options in _BALANCED.items():
            report[f"{order}/{name}"] = _hinted(q, k, storage[1], KernelConfig(**options), float(k.norm(dim=-1).max()))
    return report


def rows_report(storage: torch.Tensor) -> dict:
    """The rows kernel (a few queries, fp32 arithmetic) over the same strided views, for
    fp32 and bf16 storage, ranges as ints and as a tensor."""
    from mapstream.attention.triton_rows import rows_attention

    report = {}
    q = torch.randn(2, 3, storage.shape[-1])
    for dtype in (torch.float32, torch.bfloat16):
        k, v = storage[0].to(dtype), storage[1].to(dtype)
        for lo, hi in [(0, 200), (13, 150), (40, 41), (5, 69)]:
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.double(), k[:, lo:hi].double(), v[:, lo:hi].double()
            )
            for how, kv_range in (("ints", (lo, hi)), ("tensor", torch.tensor([lo, hi], dtype=torch.int32))):
                # None: the default for 200 keys (4 shares); 1: one program; 16: more shares
                # than the short ranges have keys (empty shares weigh nothing).
                for splits in (None, 1, 16):
                    out = rows_attention(q, k, v, kv_range=kv_range, splits=splits)
                    err = float((out.double() - ref).norm() / ref.norm())
                    report[f"{dtype}/{how}/{lo}-{hi}/splits{splits}"] = {
                        "err": err, "shape": list(out.shape), "dtype": str(out.dtype),
                    }
    return report


if __name__ == "__main__":
    main()
