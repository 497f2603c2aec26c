"""`mapstream bench`: streaming throughput under a fixed protocol.

Official architecture, synthetic (rule) weights, batch 1, `scale` frames together then
`stream` frames one at a time, bf16 aggregator, fp32 heads. Each step is timed with CUDA
events and a synchronize; a warm-up pass (scale + 10 frames) comes first. Reported:
global FPS (phase 1 + phase 2), steady-state ms/frame and FPS (frames 100..end, window
full), phase-1 ms, peak GPU memory, and a per-stage breakdown from a separate pass.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch

from .attention.fused import plain_pytorch
from .config import DEFAULT_CAMERA_ITERATIONS, StreamConfig
from .gpu_power import PowerLog, open_reader

__all__ = ["BenchConfig", "accuracy_vs_fp32", "run_benchmark", "reference_samples", "compare_samples"]

log = logging.getLogger(__name__)

_STREAM = StreamConfig()  # the protocol streams with the default scale phase and window


@dataclass
class BenchConfig:
    preset: str = "lingbot-map"
    width: int = 504
    height: int = 378
    scale_frames: int = _STREAM.num_scale_frames
    stream_frames: int = 192
    window: int = _STREAM.sliding_window
    camera_iterations: int = DEFAULT_CAMERA_ITERATIONS
    precision: str = "bf16"
    heads_precision: str = "fp32"
    """fp32 (the protocol's default, as the reference) or the aggregator's precision
    (`cast_for_inference(..., heads=True)`)."""
    backend: str = "sdpa"
    trunk_weights: str = "auto"
    """How the trunk's linear weights are stored (`GCTNetwork.quantize_trunk`: auto, int8, fp8)."""
    kv_dtype: str = _STREAM.kv_dtype
    """How the cache stores keys and values (`StreamConfig.kv_dtype`: auto, fp8)."""
    steady_from: int = 100
    warmup_frames: int = 10
    stage_breakdown: bool = True
    device: str = "cuda"
    images: str | None = None
    """Folder of photos to stream (resized to width x height); default: random frames."""
    fast: bool | str = False
    """Single-frame steps through CUDA graphs (`Session(fast=...)`: True for the automatic choice,
    "pieces" or "whole")."""
    dense_chunk_frames: int | None = None
    """Frames the dense heads take at a time in the scale phase (None: the network's own)."""
    check_every: int = 24
    """Keep the predictions of every this-many streaming frames of the timed pass (for the
    correctness check against a reference pass, `reference_samples`)."""


# Distinct random frames a stream cycles through: a long stream (1,000 frames) then holds
# 64 frames on the device rather than all of them, so that its peak memory is the stream's.
RANDOM_POOL = 64


class StreamFrames:
    """The protocol's frames in stream order, indexed like a tensor of frames ([i] one frame,
    [a:b] several stacked) while only a bounded set of distinct frames is held on the device:
    `pool` [M, 3, H, W] and `order(i)`, the pool index of stream frame i."""

    def __init__(self, pool: torch.Tensor, count: int, mirrored: bool) -> None:
        self.pool, self.count, self.mirrored = pool, count, mirrored

    def order(self, i: int) -> int:
        """Photos play forward then backward (no jump where the folder wraps); random frames repeat."""
        m = self.pool.shape[0]
        if not self.mirrored:
            return i % m
        k = i % (2 * m)
        return k if k < m else 2 * m - 1 - k

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int | slice) -> torch.Tensor:
        if isinstance(index, slice):
            return self.pool[[self.order(i) for i in range(*index.indices(self.count))]]
        if not -self.count <= index < self.count:
            raise IndexError(f"frame {index} of a stream of {self.count}")
        return self.pool[self.order(index % self.count)]


def _frames(cfg: BenchConfig, device: torch.device) -> StreamFrames:
    n = cfg.scale_frames + cfg.stream_frames
    if cfg.images:
        from .io.images import list_images, load_images

        paths = list_images(cfg.images)
        x = load_images(paths[: min(len(paths), n)], image_size=cfg.width)
        x = torch.nn.functional.interpolate(x, size=(cfg.height, cfg.width), mode="bilinear", align_corners=False)
        return StreamFrames(x.clamp(0, 1).to(device), n, mirrored=True)
    g = torch.Generator().manual_seed(0)
    return StreamFrames(torch.rand(min(n, RANDOM_POOL), 3, cfg.height, cfg.width, generator=g).to(device), n,
                        mirrored=False)


class _StageTimer:
    """Records a CUDA event at trace points and turns them into per-stage milliseconds."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, torch.cuda.Event]] = []

    def start(self) -> None:
        self.marks = [("start", self._event())]

    @staticmethod
    def _event() -> torch.cuda.Event:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def __call__(self, name: str, tensor: torch.Tensor) -> None:
        if name == "agg.patch_tokens" or name.startswith("agg.frame_blocks.") or name.startswith("agg.global_blocks."):
            self.marks.append((name, self._event()))
        elif name.startswith("cam.pose_enc.it"):
            self.marks.append(("camera", self._event()))
        elif name == "dpt.output_conv2_logits":
            self.marks.append(("depth", self._event()))

    @contextlib.contextmanager
    def watching(self, frame_blocks) -> Iterator[None]:
        """Mark where each frame block starts and ends. The trunk's trace points come after
        whole layers (a step runs a global block's tail and the next frame block as one
        piece), so these marks are what separates the frame blocks' time from the rest."""
        hooks = []
        for block in frame_blocks:
            hooks.append(block.register_forward_pre_hook(lambda *_: self.marks.append(("frame_start", self._event()))))
            hooks.append(block.register_forward_hook(lambda *_: self.marks.append(("frame_end", self._event()))))
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def stages(self) -> dict[str, float]:
        """Milliseconds per stage; an interval counts for the stage of the mark that ends it.
        Inside the trunk, the time between frame blocks is the global blocks' (their
        projections, MLPs and cache attention)."""
        out = {"patch_embed": 0.0, "frame_blocks": 0.0, "global_blocks": 0.0, "camera_head": 0.0, "depth_head": 0.0}
        for (prev, e0), (name, e1) in zip(self.marks, self.marks[1:]):
            ms = e0.elapsed_time(e1)
            if name == "agg.patch_tokens":
                out["patch_embed"] += ms
            elif name == "frame_end":
                out["frame_blocks"] += ms
            elif name == "frame_start" or name.startswith(("agg.frame_blocks.", "agg.global_blocks.")):
                out["global_blocks"] += ms
            elif name == "camera":
                out["camera_head"] += ms
            elif name == "depth":
                out["depth_head"] += ms
        return out


def windowed_means(per_frame: list[float], half_width: int = 30) -> dict[str, float]:
    """The reference profiler's windowed averages: the mean step time within ±`half_width`
    frames of 10% (at least frame 10), 50% and 90% of the stream, keyed "10%", "50%", "90%"
    (frames counted from the first streamed one; fewer frames than that: the nearest ones)."""
    n = len(per_frame)
    out = {}
    for label, share in (("10%", 0.1), ("50%", 0.5), ("90%", 0.9)):
        centre = min(max(int(n * share), 10 if share == 0.1 else 0), n - 1)
        window = per_frame[max(centre - half_width, 0) : centre + half_width + 1]
        out[label] = sum(window) / len(window)
    return out


def build_bench_model(cfg: BenchConfig, device: torch.device, *, compile=False):
    """The protocol's model with rule weights (`compile`: True or a `CompileOptions` to build
    it with its static parts compiled)."""
    import mapstream

    model = mapstream.build_model(
        cfg.preset,
        kv_cache_sliding_window=cfg.window,
        kv_cache_scale_frames=cfg.scale_frames,
        camera_num_iterations=cfg.camera_iterations,
        backend=cfg.backend,
        compile=compile,
    )
    mapstream.fill_synthetic_(model)
    model = model.to(device).eval()
    if cfg.precision in ("bf16", "fp16"):
        model.cast_for_inference(cfg.precision, heads=cfg.heads_precision == cfg.precision)
    return model.quantize_trunk(cfg.trunk_weights)


@torch.no_grad()
def run_benchmark(cfg: BenchConfig, model=None) -> dict:
    device = torch.device(cfg.device)
    if device.type != "cuda":
        raise ValueError("mapstream bench times CUDA kernels; run it on a CUDA device")
    model = model if model is not None else build_bench_model(cfg, device)
    # Cache pages an earlier measurement left in the shared pools (another resolution or
    # storage type) are released, so that the peak below is this variant's own.
    from .cache import shared_pools

    shared_pools().trim()
    torch.cuda.empty_cache()
    frames = _frames(cfg, device)
    own_chunk = model.dense_chunk_frames
    model.dense_chunk_frames = cfg.dense_chunk_frames or own_chunk
    try:
        return _run(cfg, model, frames, device)
    finally:
        model.dense_chunk_frames = own_chunk


def _run(cfg: BenchConfig, model, frames: StreamFrames, device: torch.device) -> dict:
    session = model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=cfg.fast,
                            kv_dtype=cfg.kv_dtype, sliding_window=cfg.window)

    samples: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    power = PowerLog(reader) if (reader := open_reader(device)) is not None else None
    steady_start = _steady_start(cfg)

    def one_pass(n_stream: int, power: PowerLog | None = None) -> tuple[float, list[float]]:
        session.reset()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for i in range(cfg.scale_frames - 1):
            session.step(frames[i])
        preds = session.step(frames[cfg.scale_frames - 1])
        end.record()
        torch.cuda.synchronize()
        phase1 = start.elapsed_time(end)
        if not all(torch.isfinite(p.pose_enc).all() and torch.isfinite(p.depth).all() for p in preds):
            raise RuntimeError("non-finite prediction in the scale phase")
        per_frame = []
        for i in range(cfg.scale_frames, cfg.scale_frames + n_stream):
            if power is not None and i == steady_start:
                power.start()
            start.record()
            (pred,) = session.step(frames[i])
            end.record()
            torch.cuda.synchronize()
            per_frame.append(start.elapsed_time(end))
            if power is not None and i >= steady_start:
                power.after_frame()
            _keep_sample(cfg, samples, i, pred)
            if not (torch.isfinite(pred.pose_enc).all() and torch.isfinite(pred.depth).all()):
                raise RuntimeError(f"non-finite prediction at frame {i}")
        return phase1, per_frame

    one_pass(cfg.warmup_frames)
    torch.cuda.reset_peak_memory_stats(device)
    phase1, per_frame = one_pass(cfg.stream_frames, power)
    peak = torch.cuda.max_memory_allocated(device)
    steady = per_frame[steady_start - cfg.scale_frames :]
    steady_ms = sum(steady) / len(steady)
    total_ms = phase1 + sum(per_frame)
    result = {
        "config": asdict(cfg),
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "head_dtype": str(model.head_dtype).removeprefix("torch."),
        "backend": type(model.attention_backend(device, torch.bfloat16 if cfg.precision != "fp32" else torch.float32)).__name__,
        "frames": cfg.scale_frames + cfg.stream_frames,
        "global_fps": 1000.0 * (cfg.scale_frames + cfg.stream_frames) / total_ms,
        "steady_ms": steady_ms,
        "steady_fps": 1000.0 / steady_ms,
        "steady_ms_min": min(steady),
        "steady_ms_max": max(steady),
        "windowed_ms": windowed_means(per_frame),
        "per_frame_ms": [round(ms, 4) for ms in per_frame],
        "phase1_ms": phase1,
        "peak_memory_gib": peak / 2**30,
        # One stored frame's keys and values over every global layer (the aggregator's cache).
        "cache_bytes_per_frame": session.state.aggregator.pool.bytes_per_page,
        # Energy, power and SM clock over the steady frames (None without NVML): under a
        # power cap the clock, and so the step, follow the step's energy.
        "gpu_power": power.summary() if power is not None else None,
        # Row blocks the fixed-reference attention had to compute again, per global block
        # (`KeyNormHints`): all zero when the key-norm bounds are tight.
        "key_norm_repairs": model.aggregator.key_norm_hints.repaired_blocks(),
    }
    if cfg.stage_breakdown and not cfg.fast:  # stages are timed on the eager path only
        timer = _StageTimer()
        session.reset()
        for i in range(cfg.scale_frames):
            session.step(frames[i])
        stages = []
        for i in range(cfg.scale_frames, cfg.scale_frames + min(cfg.stream_frames, 40)):
            timer.start()
            frame = frames[i][None, None]
            # The session's own precision (an fp16 cache refuses bf16 frames).
            half = torch.float16 if cfg.precision == "fp16" else torch.bfloat16
            with torch.autocast("cuda", dtype=half, enabled=cfg.precision != "fp32"), \
                    timer.watching(model.aggregator.frame_blocks):
                model(frame, num_frame_for_scale=cfg.scale_frames, state=session.state, trace=timer, validate=False)
            torch.cuda.synchronize()
            stages.append(timer.stages())
        tail = stages[len(stages) // 2 :]
        result["stages_ms"] = {k: sum(s[k] for s in tail) / len(tail) for k in tail[0]}
    session.close()
    result["_samples"] = samples  # tensors: popped by the caller before writing JSON
    return result


def _steady_start(cfg: BenchConfig) -> int:
    """The first frame of the steady-state figures: `steady_from` when the stream has more
    frames than that (the protocol's 192 > 100), else the first streaming frame (every
    streaming frame counts)."""
    return cfg.steady_from if cfg.stream_frames > cfg.steady_from else cfg.scale_frames


def _keep_sample(cfg: BenchConfig, samples: dict, index: int, pred) -> None:
    """Keep frame `index`'s pose and depth (on the CPU) if it is one of the checked frames."""
    if (index - cfg.scale_frames) % cfg.check_every == 0:
        samples[index] = (pred.pose_enc.float().cpu(), pred.depth.float().cpu())


@torch.no_grad()
def reference_samples(cfg: BenchConfig, model) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The predictions `run_benchmark` keeps, from an eager pass with PyTorch's SDPA (the
    reference backend), with every other kernel of ours off (`plain_pytorch`), over the
    same frames and weights: a reference that shares none of our kernels with the variants
    it checks."""
    device = torch.device(cfg.device)
    frames = _frames(cfg, device)
    saved = model.backend_name
    model.set_backend("sdpa")
    samples: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    try:
        with plain_pytorch(), model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=False) as session:
            session.run_frames(frames[: cfg.scale_frames])
            for i in range(cfg.scale_frames, cfg.scale_frames + cfg.stream_frames):
                (pred,) = session.step(frames[i])
                _keep_sample(cfg, samples, i, pred)
    finally:
        model.set_backend(saved)
    return samples


def compare_samples(got: dict, want: dict) -> dict[str, float]:
    """Largest relative L2 error over the sampled frames: {"pose_enc": ..., "depth": ...}."""
    if set(got) != set(want):
        raise ValueError(f"sampled frames differ: {sorted(got)} vs {sorted(want)}")

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm().clamp_min(1e-12)) if torch.isfinite(a).all() else math.inf

    return {
        "pose_enc": max(rel(got[i][0], want[i][0]) for i in want),
        "depth": max(rel(got[i][1], want[i][1]) for i in want),
    }


def accuracy_vs_fp32(samples: dict, fp32: dict, low_precision: dict) -> dict:
    """A variant's largest relative error against the fp32 pass (`reference_samples` of an fp32
    model) beside its bound: twice the error of the eager pass in the bench's precision
    (`low_precision`, the same reference pass in bf16) against the same fp32 pass. A variant
    above it is not accurate enough to be a default."""
    errors = compare_samples(samples, fp32)
    bound = {key: 2 * value for key, value in compare_samples(low_precision, fp32).items()}
    return {"max_rel_err": errors, "bound": bound, "within": all(errors[k] <= bound[k] for k in errors)}


def write_result(result: dict, path: str | Path) -> None:
    from .io.atomic import atomic_write_text

    atomic_write_text(Path(path), json.dumps(result, indent=2, sort_keys=True))
