"""The benchmark's correctness check (the timing itself needs CUDA: tests/gpu and the device)."""
from __future__ import annotations

import math

import pytest
import torch

import mapstream
from mapstream.bench import BenchConfig, compare_samples, reference_samples


def _sample(pose, depth):
    return torch.tensor(pose, dtype=torch.float32), torch.tensor(depth, dtype=torch.float32)


def test_compare_samples_reports_the_largest_relative_error():
    want = {8: _sample([3.0, 4.0], [[1.0, 0.0]]), 32: _sample([0.0, 1.0], [[2.0, 0.0]])}
    assert compare_samples(want, want) == {"pose_enc": 0.0, "depth": 0.0}
    got = {8: _sample([3.0, 4.5], [[1.0, 0.0]]), 32: _sample([0.0, 1.0], [[2.0, 1.0]])}
    errors = compare_samples(got, want)
    assert errors["pose_enc"] == pytest.approx(0.5 / 5.0)  # frame 8: |(0, .5)| / |(3, 4)|
    assert errors["depth"] == pytest.approx(1.0 / 2.0)  # frame 32
    nan = {8: _sample([float("nan"), 4.0], [[1.0, 0.0]]), 32: want[32]}
    assert compare_samples(nan, want)["pose_enc"] == math.inf
    with pytest.raises(ValueError, match="sampled frames differ"):
        compare_samples({8: want[8]}, want)


def test_a_variants_accuracy_is_bounded_by_twice_the_low_precision_passs_error_against_fp32():
    from mapstream.bench import accuracy_vs_fp32

    fp32 = {8: _sample([3.0, 4.0], [[2.0, 0.0]])}
    bf16 = {8: _sample([3.0, 4.1], [[2.0, 0.02]])}  # pose 0.1 / 5 = 2e-2, depth 0.02 / 2 = 1e-2
    close = {8: _sample([3.0, 4.15], [[2.0, 0.039]])}
    got = accuracy_vs_fp32(close, fp32, bf16)
    assert got["bound"]["pose_enc"] == pytest.approx(4e-2) and got["bound"]["depth"] == pytest.approx(2e-2)
    assert got["max_rel_err"]["pose_enc"] == pytest.approx(3e-2) and got["within"]
    far = {8: _sample([3.0, 4.0], [[2.0, 0.041]])}  # pose exact, depth just past twice bf16's
    assert not accuracy_vs_fp32(far, fp32, bf16)["within"]


def test_reference_samples_are_an_eager_sdpa_pass_over_the_bench_frames():
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    model.set_backend("auto")
    cfg = BenchConfig(
        preset="tiny", width=42, height=28, scale_frames=2, stream_frames=7, window=3,
        precision="fp32", device="cpu", check_every=3,
    )
    samples = reference_samples(cfg, model)
    assert sorted(samples) == [2, 5, 8]  # streaming frames 0, 3, 6 after the 2 scale frames
    assert model.backend_name == "auto"  # restored
    g = torch.Generator().manual_seed(0)  # the bench's frames
    frames = torch.rand(9, 3, 28, 42, generator=g)
    with model.session(num_scale_frames=2) as session:
        preds = session.run_frames(frames)
    for i, (pose, depth) in samples.items():
        torch.testing.assert_close(pose, preds[i].pose_enc)
        torch.testing.assert_close(depth, preds[i].depth)


def test_the_fp32_references_are_an_fp32_models_reference_pass_at_each_size():
    from mapstream.bench import build_bench_model
    from mapstream.cli.bench import _fp32_references

    cfg = BenchConfig(preset="tiny", scale_frames=2, stream_frames=4, window=3, precision="bf16",
                      heads_precision="bf16", kv_dtype="fp8", trunk_weights="int8", device="cpu", check_every=2)
    got = _fp32_references(cfg, ["42x28", "56x28"], torch.device("cpu"))
    fp32 = BenchConfig(preset="tiny", scale_frames=2, stream_frames=4, window=3, precision="fp32", device="cpu",
                       check_every=2)
    model = build_bench_model(fp32, torch.device("cpu"))
    assert next(model.parameters()).dtype == torch.float32
    for size, (w, h) in (("42x28", (42, 28)), ("56x28", (56, 28))):
        want = reference_samples(BenchConfig(**{**fp32.__dict__, "width": w, "height": h}), model)
        assert sorted(got[size]) == sorted(want) == [2, 4]
        for i in want:
            torch.testing.assert_close(got[size][i], want[i], rtol=0, atol=0)


def test_reference_samples_keep_our_fused_kernels_out(monkeypatch):
    """The reference pass runs every block with our fused kernels turned off (on CUDA they
    would otherwise serve it too, and the check would compare them with themselves)."""
    import mapstream.layers.block as block
    from mapstream.attention.fused import fused_kernels_allowed

    seen = []
    heads, attention = block.qkv_heads, block.dense_attention

    def spy_heads(*args, **kwargs):
        seen.append(fused_kernels_allowed())
        return heads(*args, **kwargs)

    def spy_attention(*args, **kwargs):
        seen.append(fused_kernels_allowed())
        return attention(*args, **kwargs)

    monkeypatch.setattr(block, "qkv_heads", spy_heads)
    monkeypatch.setattr(block, "dense_attention", spy_attention)
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    cfg = BenchConfig(preset="tiny", width=42, height=28, scale_frames=2, stream_frames=2, window=3,
                      precision="fp32", device="cpu", check_every=1)
    reference_samples(cfg, model)
    assert seen and not any(seen)
    assert fused_kernels_allowed()  # restored after the pass


def test_bench_without_a_cuda_gpu_says_so(monkeypatch, capsys):
    """The protocol times CUDA steps; without a GPU the command says what it needs and
    what runs on a CPU instead (it used to end in PyTorch's AssertionError)."""
    from mapstream.cli.main import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--out", "never.json"]) != 0
    err = capsys.readouterr().err
    assert "this PyTorch sees none" in err and "mapstream run --demo" in err


def test_stage_times_separate_the_frame_blocks_from_the_global_blocks(monkeypatch):
    """The trunk's trace points come after whole layers, so the breakdown once counted every
    layer as frame-block time and left the global blocks near zero. With the frame blocks'
    own start and end marks, each mark one tick after the last (a fake clock on the CPU):
    the tiny model's 5 frame blocks take one tick each, and the 15 intervals between them
    and the layer marks are the global blocks'."""
    import itertools

    from mapstream.bench import _StageTimer

    clock = itertools.count()

    class Tick:
        def __init__(self) -> None:
            self.t = next(clock)

        def elapsed_time(self, other: "Tick") -> float:
            return float(other.t - self.t)

    monkeypatch.setattr(_StageTimer, "_event", staticmethod(Tick))
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    x = torch.rand(3, 3, 28, 42, generator=torch.Generator().manual_seed(0))
    timer = _StageTimer()
    with model.session(num_scale_frames=2) as session:
        session.run_frames(x[:2])
        timer.start()
        with timer.watching(model.aggregator.frame_blocks):
            model(x[None, 2:3], num_frame_for_scale=2, state=session.state, trace=timer, validate=False)
    stages = timer.stages()
    assert stages["patch_embed"] == 1.0 and stages["frame_blocks"] == 5.0 and stages["global_blocks"] == 15.0
    assert stages["camera_head"] >= 1.0 and stages["depth_head"] == 1.0
    assert all(not block._forward_hooks and not block._forward_pre_hooks for block in model.aggregator.frame_blocks)


def test_windowed_means_average_thirty_frames_either_side_of_10_50_and_90_percent():
    """The reference profiler's windowed averages (APP.md §8), on step times equal to their
    frame index: each is its window's centre (where the window fits) or the mean of what fits."""
    from mapstream.bench import windowed_means

    steps = [float(i) for i in range(192)]
    # 10% of 192 is frame 19: the window [0, 49] is cut at the start, its mean 24.5.
    assert windowed_means(steps) == {"10%": 24.5, "50%": 96.0, "90%": pytest.approx((142 + 191) / 2)}
    assert windowed_means([5.0] * 12)["10%"] == 5.0  # "at least frame 10", clamped to the stream


def test_the_bench_holds_a_bounded_pool_of_frames_and_indexes_it_in_stream_order(tmp_path):
    from mapstream.bench import RANDOM_POOL, _frames

    cfg = BenchConfig(preset="tiny", width=28, height=14, scale_frames=2, stream_frames=RANDOM_POOL + 30, device="cpu")
    frames = _frames(cfg, torch.device("cpu"))
    assert len(frames) == RANDOM_POOL + 32 and frames.pool.shape[0] == RANDOM_POOL
    g = torch.Generator().manual_seed(0)
    want = torch.rand(RANDOM_POOL, 3, 14, 28, generator=g)
    assert torch.equal(frames[5], want[5]) and torch.equal(frames[RANDOM_POOL + 5], want[5])
    assert torch.equal(frames[-1], want[31])
    assert torch.equal(frames[RANDOM_POOL - 1 : RANDOM_POOL + 2], want[[RANDOM_POOL - 1, 0, 1]])
    with pytest.raises(IndexError):
        frames[RANDOM_POOL + 32]

    from PIL import Image

    for i in range(3):  # three photos, each one flat grey level
        Image.new("RGB", (28, 14), (60 * (i + 1),) * 3).save(tmp_path / f"{i}.png")
    photos = _frames(BenchConfig(preset="tiny", width=28, height=14, scale_frames=2, stream_frames=6,
                                 device="cpu", images=str(tmp_path)), torch.device("cpu"))
    levels = [round(float(photos[i].mean()) * 255 / 60) for i in range(len(photos))]
    assert levels == [1, 2, 3, 3, 2, 1, 1, 2]  # forward, backward, forward


def test_bench_fits_each_measurement_to_a_memory_budget_as_a_run_does():
    from mapstream.cli.bench import _fitted
    from mapstream.config import StreamConfig
    from mapstream.gpu_memory import estimate_memory, parse_memory

    cfg = BenchConfig(width=518, height=378)
    with torch.device("meta"):  # sizes only
        sizes = mapstream.build_model(cfg.preset)
    stream = StreamConfig(num_scale_frames=cfg.scale_frames, sliding_window=cfg.window)
    fitted, plan = _fitted(cfg, "8GB")
    assert plan.estimate.total <= parse_memory("8GB")
    assert (fitted.kv_dtype, fitted.window, fitted.dense_chunk_frames) == (
        plan.stream.kv_dtype, plan.stream.sliding_window, plan.dense_chunk_frames)
    assert plan.estimate == estimate_memory(sizes, (378, 518), stream.with_settings(
        kv_dtype=fitted.kv_dtype, sliding_window=fitted.window), precision="bf16",
        dense_chunk_frames=fitted.dense_chunk_frames)
    need_bf16_heads = estimate_memory(sizes, (378, 518), stream.with_settings(kv_dtype="fp8", sliding_window=8),
                                      precision="bf16", dense_chunk_frames=1).total - 1
    skipped, none = _fitted(cfg, str(need_bf16_heads / 2**30))
    assert none is None and skipped is cfg  # fp32 heads asked: the variant is not run
