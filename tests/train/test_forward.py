"""The training forward computes what streaming computes, with gradients."""
from __future__ import annotations

import pytest
import torch

import mapstream
from conftest import trim_process_memory
from mapstream.train.forward import clip_forward, visibility_mask


def _frames(n, seed, hw=(28, 42)):
    return torch.rand(n, 3, *hw, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def tiny():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


def test_visibility_is_block_causal_with_the_scale_frames_as_one_block():
    want = torch.tensor([
        [1, 1, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(visibility_mask(4, 2, 1, "cpu"), want)
    assert torch.equal(visibility_mask(4, 2, 3, "cpu"), want.repeat_interleave(3, 0).repeat_interleave(3, 1))
    assert torch.equal(visibility_mask(3, 1, 1, "cpu"), torch.ones(3, 3, dtype=torch.bool).tril())


@pytest.mark.parametrize("frames, scale", [(5, 2), (4, 1), (3, 3), (6, 4)])
def test_a_clip_gives_what_streaming_gives(tiny, frames, scale):
    x = _frames(frames, seed=frames + scale)
    with torch.no_grad():
        want = tiny.inference_streaming(x, num_scale_frames=scale, keyframe_interval=1)
        got = clip_forward(tiny, x[None], num_scale_frames=scale)
    for key in ("pose_enc", "depth", "depth_conf"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)
    assert len(got["pose_enc_list"]) == tiny.config.camera_num_iterations


def test_clips_of_a_batch_are_independent(tiny):
    a, b = _frames(4, seed=1), _frames(4, seed=2)
    with torch.no_grad():
        together = clip_forward(tiny, torch.stack([a, b]), num_scale_frames=2)
        alone = clip_forward(tiny, b[None], num_scale_frames=2)
    torch.testing.assert_close(together["depth"][1:], alone["depth"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(together["pose_enc"][1:], alone["pose_enc"], rtol=1e-5, atol=1e-5)


def test_every_weight_of_the_streaming_path_gets_a_gradient_and_checkpointing_changes_none():
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny", enable_point=True)).train()
    x = _frames(4, seed=3)[None]

    def grads(checkpoint_layers):
        model.zero_grad()
        out = clip_forward(model, x, num_scale_frames=2, checkpoint_layers=checkpoint_layers)
        loss = sum(p.square().mean() for p in out["pose_enc_list"]) + out["depth"].mean() + out["world_points"].mean()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads(False)
    # Only the ViT's mask token (a pretraining leftover the checkpoint carries) takes no part.
    missing = {n for n, _ in model.named_parameters()} - set(plain)
    assert missing == {"aggregator.patch_embed.mask_token"}
    assert all(torch.isfinite(g).all() for g in plain.values())
    recomputed = grads(True)
    assert plain.keys() == recomputed.keys()
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_official_architecture_clip_gives_what_streaming_gives():
    # The suite's memory: the freed heap of earlier tests handed back first, and a cache that
    # grows with these three frames instead of reserving 1,024 frames' trajectory (1 GB in fp32).
    trim_process_memory()
    model = mapstream.build_model("lingbot-map", trajectory_capacity=None)
    mapstream.fill_synthetic_(model).requires_grad_(False).eval()
    x = _frames(3, seed=5, hw=(28, 28))
    with torch.no_grad():
        want = model.inference_streaming(x, num_scale_frames=2, keyframe_interval=1)
        got = clip_forward(model, x[None], num_scale_frames=2)
    for key in ("pose_enc", "depth", "depth_conf"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-4)
    del model, want, got
    trim_process_memory()


def test_the_network_learns_a_procedural_clip():
    """End to end on the CPU: rendered clips, their normalised ground truth, the clip forward
    and the losses. Fitting one batch for 40 AdamW steps more than halves the camera and the
    depth loss (gradients reach the predictions through the whole chain)."""
    from mapstream.train.data import ProceduralClips
    from mapstream.train.losses import LossWeights, total_loss

    torch.manual_seed(0)
    batch = next(iter(ProceduralClips(batch_size=2, num_frames=3, image_hw=(28, 42), split="train", num_batches=1)))
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history = []
    for _ in range(40):
        loss, parts = total_loss(clip_forward(model, batch["images"], num_scale_frames=2), batch, LossWeights())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append({k: float(v) for k, v in parts.items()})
    first, last = history[0], history[-1]
    assert last["camera"] < 0.5 * first["camera"], (first, last)
    assert last["depth"] < first["depth"] - 0.5 * abs(first["depth"]), (first, last)


def test_the_small_preset_fits_its_budget_and_loads_what_training_exports(tmp_path):
    """The architecture trained as mapstream's own model ships in half precision under 25 MB;
    its state dict round-trips through safetensors into `load_model` by preset."""
    from safetensors.torch import save_file

    model = mapstream.fill_synthetic_(mapstream.build_model("small")).eval()
    assert sum(p.numel() for p in model.parameters()) * 2 < 25e6
    path = tmp_path / "small.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    loaded = mapstream.load_model(str(path), preset="auto")
    assert loaded.config == mapstream.get_preset("small").model
    x = _frames(3, seed=9)
    with torch.no_grad():
        torch.testing.assert_close(loaded.inference_streaming(x, num_scale_frames=2)["depth"],
                                   model.inference_streaming(x, num_scale_frames=2)["depth"])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_computes_the_masked_sdpa_function(tiny, monkeypatch):
    # Uncompiled FlexAttention runs the same block mask eagerly (compiled, and with gradients,
    # on CUDA: tests/gpu/test_train_cuda.py).
    from torch.nn.attention.flex_attention import flex_attention

    import mapstream.train.forward as forward

    monkeypatch.setattr(forward, "_compiled_flex", lambda: flex_attention)
    x = torch.stack([_frames(5, seed=3), _frames(5, seed=4)])
    with torch.no_grad():
        sdpa = clip_forward(tiny, x, num_scale_frames=2, attention="sdpa")
        flex = clip_forward(tiny, x, num_scale_frames=2, attention="flex")
    for key in ("pose_enc", "depth", "depth_conf"):
        torch.testing.assert_close(flex[key], sdpa[key], rtol=1e-5, atol=1e-5)


def test_auto_attention_is_flex_on_cuda_only_and_unknown_kinds_are_refused():
    from mapstream.train.forward import resolve_attention

    assert resolve_attention("auto", torch.device("cuda", 0)) == "flex"
    assert resolve_attention("auto", torch.device("cpu")) == "sdpa"
    assert resolve_attention("sdpa", torch.device("cuda")) == "sdpa"
    with pytest.raises(ValueError, match="attention must be one of"):
        resolve_attention("flash", torch.device("cpu"))
    with pytest.raises(ValueError, match="no backward pass on the CPU"):
        resolve_attention("flex", torch.device("cpu"))
    with torch.no_grad():
        assert resolve_attention("flex", torch.device("cpu")) == "flex"


def test_dense_autocast_runs_only_the_depth_head_in_the_callers_precision(tiny):
    x = _frames(4, seed=9)[None]
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        fp32_heads = clip_forward(tiny, x, num_scale_frames=2)
        bf16_depth = clip_forward(tiny, x, num_scale_frames=2, dense_autocast=True)
    assert torch.equal(bf16_depth["pose_enc"], fp32_heads["pose_enc"])  # the camera head stays in fp32
    assert bf16_depth["depth"].dtype == torch.float32
    assert not torch.equal(bf16_depth["depth"], fp32_heads["depth"])  # the DPT did run in bf16
    torch.testing.assert_close(bf16_depth["depth"], fp32_heads["depth"], rtol=0.05, atol=0.05)


def test_without_the_dense_heads_the_clip_forward_gives_the_same_cameras(tiny):
    images = torch.rand(2, 3, 3, 28, 42)
    full = clip_forward(tiny, images, num_scale_frames=2)
    camera = clip_forward(tiny, images, num_scale_frames=2, dense=False)
    assert set(camera) == {"pose_enc", "pose_enc_list"} and "depth" in full
    torch.testing.assert_close(camera["pose_enc"], full["pose_enc"], rtol=0, atol=0)


def test_the_clip_forward_can_return_the_layers_its_heads_read(tiny):
    images = torch.rand(2, 3, 3, 28, 42)
    full = clip_forward(tiny, images, num_scale_frames=2)
    kept = clip_forward(tiny, images, num_scale_frames=2, keep_layers=True)
    layers, c = kept.pop("layers"), tiny.config
    per_frame = c.num_special_tokens + (28 // c.patch_size) * (42 // c.patch_size)
    assert [t.shape for t in layers] == [(2, 3, per_frame, 2 * c.embed_dim)] * len(c.selected_layers)
    assert set(kept) == set(full) and "layers" not in full
    dense = tiny.dense_heads(layers, (28, 42), c.num_special_tokens)  # the heads' inputs, unchanged
    torch.testing.assert_close(dense["depth"], full["depth"], rtol=0, atol=0)
    torch.testing.assert_close(kept["pose_enc"], full["pose_enc"], rtol=0, atol=0)
