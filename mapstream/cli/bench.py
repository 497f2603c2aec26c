"""`mapstream bench`: GPU streaming throughput (see mapstream.bench)."""
from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ..bench import (BenchConfig, accuracy_vs_fp32, build_bench_model, compare_samples, reference_samples,
                     run_benchmark, write_result)

_PROTOCOL = BenchConfig()  # the flags' defaults are the protocol's


_VARIANT_ORDER = (
    "eager", "fast", "compiled", "pieces", "whole", "bf16-heads", "pieces-bf16-heads", "whole-bf16-heads",
)
# Largest relative error against the eager SDPA pass that a bf16 variant may show: well
# above what bf16's rounding gives the fast paths, so that only a wrong result fails.
_TOLERANCE = {"pose_enc": 1e-1, "depth": 5e-2}


def _step_mode(variant: str) -> bool | str:
    """`Session(fast=...)` of a graphed variant: its named step mode, or the automatic one."""
    for mode in ("pieces", "whole"):
        if variant.startswith(mode):
            return mode
    return True


@dataclass
class Bench:
    """Time streaming inference on a CUDA GPU: the official architecture, 8 scale frames then one frame at a time."""

    resolutions: tuple[str, ...] = ("504x378", "518x378")
    """Frame sizes WxH to measure."""
    backends: tuple[str, ...] = ("sdpa", "flashinfer", "triton")
    """Attention backends to measure (unavailable ones are reported and skipped)."""
    precision: Literal["bf16", "fp16", "fp32"] = _PROTOCOL.precision
    """The trunk's precision (the heads stay fp32 except in the bf16-heads variants)."""
    stream_frames: int = _PROTOCOL.stream_frames
    """Frames streamed one at a time after the scale frames."""
    scale_frames: int = _PROTOCOL.scale_frames
    """Frames of the scale phase (processed together first)."""
    kv_dtypes: tuple[str, ...] = (_PROTOCOL.kv_dtype,)
    """How the cache stores keys and values, each measured (auto: in --precision; fp8: e4m3 with a scale per token and head)."""
    trunk_weights: tuple[str, ...] = (_PROTOCOL.trunk_weights,)
    """How the trunk's linear weights are stored, each measured (auto: in --precision; int8: weight-only; fp8: e4m3 weights and activations, torchao)."""
    window: int = _PROTOCOL.window
    """The cache's sliding window in stored frames."""
    gpu_memory: str | None = None
    """Fit each measurement to this GPU memory budget as `mapstream run --gpu-memory` does (the plan may store the cache in FP8 and shrink the window, over --kv-dtypes and --window; a plan that needs the heads in bf16 is only taken by the bf16-heads variants); the plan is printed and recorded."""
    camera_iterations: int = _PROTOCOL.camera_iterations
    """Refinement passes of the camera head (the protocol's 4; 1 is faster)."""
    images: str | None = None
    """Folder of photos to stream instead of random frames."""
    out: Path = Path("bench.json")
    """Where the JSON results go."""
    stages: bool = True
    """Also measure the per-stage breakdown (an extra pass, eager path)."""
    check: bool = True
    """Check every variant's predictions against an eager SDPA pass over the same frames."""
    variants: tuple[str, ...] = ("eager", "fast", "compiled")
    """eager: plain PyTorch; fast: single-frame steps replayed from CUDA graphs
    (`Session(fast=True)`: the whole step as one graph with backends that read key ranges on
    the device, such as triton, else in pieces around the cache attentions); compiled: fast
    with the blocks compiled by torch.compile; pieces / whole: compiled, with the step in
    pieces / as one graph whatever the backend; bf16-heads: compiled, with the heads in bf16
    too (the protocol keeps them fp32; a model of its own); pieces-bf16-heads /
    whole-bf16-heads: both. Compiled variants run last: compiling changes the model in
    place."""

    def main(self) -> int:
        from ..attention import available_backends
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                "mapstream bench times steps on a CUDA GPU with CUDA events "
                "and this PyTorch sees none; on a CPU, `mapstream run --demo` "
                "runs the same model, slower"
            )
        unknown = set(self.variants) - set(_VARIANT_ORDER)
        if unknown:
            raise SystemExit(f"unknown variant(s) {sorted(unknown)}; valid: {', '.join(_VARIANT_ORDER)}")
        results = []
        model = None
        backends = []
        for backend in self.backends:
            reasons = available_backends(torch.device("cuda"), torch.bfloat16).get(backend)
            if reasons is None or reasons:
                print(f"skipping backend {backend}: {'; '.join(reasons or ['unknown backend'])}")
            else:
                backends.append(backend)
        variants = sorted(set(self.variants), key=_VARIANT_ORDER.index)
        runs = [(v, b, r, d, q) for v in variants for q in self.trunk_weights for b in backends
                for r in self.resolutions for d in self.kv_dtypes]
        references: dict[str, dict] = {}
        fp32_references: dict[str, dict] = {}
        failed, skipped = [], []
        for variant, backend, res, kv_dtype, trunk_weights in runs:
            width, height = (int(v) for v in res.lower().split("x"))
            cfg = BenchConfig(
                width=width, height=height, backend=backend, precision=self.precision,
                stream_frames=self.stream_frames, scale_frames=self.scale_frames, window=self.window,
                camera_iterations=self.camera_iterations, kv_dtype=kv_dtype, trunk_weights=trunk_weights,
                images=self.images, stage_breakdown=self.stages and variant == "eager",
                fast=False if variant == "eager" else _step_mode(variant),
                heads_precision=self.precision if variant.endswith("bf16-heads") else "fp32",
            )
            plan = None
            if self.gpu_memory is not None:
                cfg, plan = _fitted(cfg, self.gpu_memory)
                if plan is None:
                    skipped.append(f"{backend}/{variant}/{res}/{kv_dtype}/{trunk_weights}")
                    continue
            if model is None:
                if self.check and self.precision != "fp32":
                    fp32_references = _fp32_references(cfg, self.resolutions, torch.device("cuda"))
                # fp32 heads first, whatever the variant: the reference pass is the protocol's.
                model = build_bench_model(replace(cfg, heads_precision="fp32", trunk_weights="auto"), torch.device("cuda"))
                if self.check:  # before any compilation changes the model
                    for size in self.resolutions:
                        w, h = (int(v) for v in size.lower().split("x"))
                        references[size] = reference_samples(replace(cfg, width=w, height=h), model)
            compiled = variant not in ("eager", "fast")
            if (cfg.heads_precision != "fp32" and model.head_dtype == torch.float32) or (
                compiled and model.compile_options is None
            ) or model.trunk_weights != cfg.trunk_weights:
                # A model of its own, built compiled and cast (casting a compiled model in
                # place leaves its compiled pieces to recompile); same rule weights.
                del model
                torch._dynamo.reset()  # compiled pieces of the old model hold it (and its memory)
                gc.collect()
                torch.cuda.empty_cache()
                model = build_bench_model(cfg, torch.device("cuda"), compile=compiled)
            model.set_backend(backend)
            result = run_benchmark(cfg, model)
            samples = result.pop("_samples")
            result["variant"] = variant
            if plan is not None:
                result["memory_plan"] = {"budget_bytes": plan.budget, "changes": list(plan.changes),
                                         "estimate_bytes": plan.estimate.total}
                print(f"   {plan.describe()}")
            check = ""
            if res in references:
                errors = compare_samples(samples, references[res])
                ok = all(errors[k] <= _TOLERANCE[k] for k in _TOLERANCE)
                result["check_vs_sdpa_eager"] = {"max_rel_err": errors, "tolerance": _TOLERANCE, "passed": ok}
                check = f" | vs SDPA: pose {errors['pose_enc']:.1e} depth {errors['depth']:.1e}" + ("" if ok else " FAILED")
                if not ok:
                    failed.append(f"{backend}/{variant}/{res}/{kv_dtype}/{trunk_weights}")
            if res in fp32_references:
                accuracy = result["accuracy_vs_fp32"] = accuracy_vs_fp32(samples, fp32_references[res], references[res])
                err, bound = accuracy["max_rel_err"], accuracy["bound"]
                check += (f" | vs fp32: pose {err['pose_enc']:.1e} depth {err['depth']:.1e} "
                          + ("within" if accuracy["within"] else "ABOVE") + f" twice the {self.precision} pass's "
                          f"({bound['pose_enc']:.1e} / {bound['depth']:.1e})")
            results.append(result)
            print(
                f"{backend:10s} {variant:10s} {res:8s} kv {cfg.kv_dtype:4s} trunk {trunk_weights:4s} global {result['global_fps']:6.1f} FPS | steady "
                f"{result['steady_ms']:6.2f} ms = {result['steady_fps']:6.1f} FPS | phase-1 "
                f"{result['phase1_ms']:7.1f} ms | peak {result['peak_memory_gib']:.1f} GiB | cache "
                f"{result['cache_bytes_per_frame'] / 2**20:.1f} MiB a frame{check}"
            )
            if result.get("gpu_power"):
                print("   " + _power_line(result["gpu_power"]))
            if "stages_ms" in result:
                print("   stages (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in result["stages_ms"].items()))
        write_result({"results": results}, self.out)
        print(f"wrote {self.out}")
        if skipped:
            print(f"not measured (their plan within {self.gpu_memory} needs other heads): {', '.join(skipped)}")
        if failed:
            print(f"correctness check FAILED for {', '.join(failed)}")
            return 1
        return 0


def _fp32_references(cfg: BenchConfig, sizes: list[str], device) -> dict[str, dict]:
    """The reference pass of an fp32 model (same rule weights, fp32 throughout) at each size,
    built on `device` and dropped before the measured models: what each variant's accuracy is
    given against."""
    import torch

    fp32 = replace(cfg, precision="fp32", heads_precision="fp32", trunk_weights="auto", kv_dtype="auto")
    model = build_bench_model(fp32, device)
    try:
        references = {}
        for size in sizes:
            width, height = (int(v) for v in size.lower().split("x"))
            references[size] = reference_samples(replace(fp32, width=width, height=height), model)
        return references
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _fitted(cfg: BenchConfig, budget: str):
    """`cfg` with the settings `mapstream.gpu_memory.plan_memory` fits into `budget`, and the
    plan; (cfg, None) where the plan needs heads in another precision than cfg's."""
    import torch

    import mapstream
    from ..config import StreamConfig
    from ..gpu_memory import parse_memory, plan_memory

    with torch.device("meta"):  # sizes only, nothing allocated
        sizes = mapstream.build_model(cfg.preset, camera_num_iterations=cfg.camera_iterations)
    stream = StreamConfig(num_scale_frames=cfg.scale_frames, sliding_window=cfg.window, kv_dtype=cfg.kv_dtype)
    low_heads = cfg.heads_precision == cfg.precision
    plan = plan_memory(parse_memory(budget), sizes, (cfg.height, cfg.width), stream, precision=cfg.precision,
                       low_precision_heads=low_heads, trunk_weights=cfg.trunk_weights)
    if plan.low_precision_heads != low_heads:
        print(f"   {plan.describe()}: not this variant's fp32 heads; skipped")
        return cfg, None
    return replace(cfg, kv_dtype=plan.stream.kv_dtype, window=plan.stream.sliding_window,
                   dense_chunk_frames=plan.dense_chunk_frames), plan


def _power_line(power: dict) -> str:
    """The GPU's power over the steady frames in one line (`mapstream.gpu_power`)."""
    mhz = power["sm_mhz"]
    capped = f"capped on {power['capped_frames']:.0%} of the frames ({', '.join(power['cap_reasons'])})" \
        if power["cap_reasons"] else "never capped"
    return (f"GPU over the steady frames: {power['mean_W']:.0f} W of {power['power_limit_W']:.0f}, "
            f"SM {mhz['mean']:.0f} MHz ({mhz['min']}-{mhz['max']}), {capped}, {power['J_per_frame']:.2f} J a frame")
