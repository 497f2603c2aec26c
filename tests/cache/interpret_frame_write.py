"""Run the frame-write kernel (mapstream/cache/_frame_write_kernel.py) under Triton's CPU
interpreter against PyTorch's copies; prints a JSON report (see test_cache_frame_write.py).
Must start with TRITON_INTERPRET=1 set (tests/conftest.py::run_interpreted does)."""
from __future__ import annotations

import json

import torch


def main() -> None:
    from mapstream.cache.frame_write import _launch

    torch.manual_seed(0)
    report = {}
    cases = [
        # name, heads, tokens written, total tokens, head dim, start, storage dtype, source dtype
        ("frame", 3, 37, 120, 16, 41, torch.float32, torch.float32),
        ("one_token", 4, 1, 9, 32, 5, torch.float32, torch.float32),
        ("start_1", 2, 1, 9, 32, 1, torch.float32, torch.float32),  # Triton passes 1 as a constant
        ("first_slot", 2, 70, 70, 8, 0, torch.float32, torch.float32),
        ("bf16", 2, 65, 200, 64, 130, torch.bfloat16, torch.bfloat16),
        ("fp32_into_bf16", 2, 9, 30, 16, 11, torch.bfloat16, torch.float32),
    ]
    for name, heads, tokens, total, dim, start, kv_dtype, dtype in cases:
        for on_device in (False, True):
            storage = torch.randn(3, 2, heads, total, dim).to(kv_dtype)
            kv = storage[1]  # one layer of a stack, as the cache hands it out
            # Strided sources: k, v as views of one q/k/v projection [P, 3, H, D].
            qkv = torch.randn(tokens, 3, heads, dim).to(dtype)
            k, v = qkv[:, 1].transpose(0, 1), qkv[:, 2].transpose(0, 1)
            want = kv.clone()
            want[0, :, start : start + tokens] = k
            want[1, :, start : start + tokens] = v
            where = torch.arange(start, start + tokens) if on_device else start
            before = storage.clone()
            _launch(kv, k, v, where)
            others = torch.cat((storage[0].flatten(), storage[2].flatten()))
            # A dtype change rounds: the interpreter toward zero, PyTorch to nearest (one unit apart).
            units = ((kv.float() - want.float()).abs() / (want.float().abs() * 2.0**-7 + 1e-30)).max()
            report[f"{name}/{'tensor' if on_device else 'int'}"] = {
                "equal": bool(torch.equal(kv, want)),
                "max_units": float(units),
                "rounds": kv_dtype != dtype,
                "other_layers_untouched": bool(torch.equal(others, torch.cat((before[0].flatten(), before[2].flatten())))),
            }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
