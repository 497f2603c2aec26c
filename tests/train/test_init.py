"""The initial weights of training from scratch (mapstream.train.init)."""
from __future__ import annotations

import torch

import mapstream
from mapstream.heads.camera import activate_pose
from mapstream.train.forward import clip_forward
from mapstream.train.init import LAYER_SCALE_INIT, init_for_training_


def _fresh(seed: int = 0):
    return init_for_training_(mapstream.build_model("tiny"), seed)


def test_the_draw_depends_only_on_the_seed():
    a, b, c = _fresh(3).state_dict(), _fresh(3).state_dict(), _fresh(4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["aggregator.frame_blocks.0.attn.qkv.weight"], c["aggregator.frame_blocks.0.attn.qkv.weight"])


def test_layers_start_at_their_rule():
    model = _fresh()
    state = model.state_dict()
    qkv = state["aggregator.global_blocks.0.attn.qkv.weight"]
    assert qkv.abs().max() <= 0.04 and abs(qkv.std().item() - 0.0176) < 0.002  # N(0, 0.02) cut at 2 std
    assert torch.count_nonzero(state["aggregator.global_blocks.0.attn.qkv.bias"]) == 0
    assert torch.all(state["aggregator.frame_blocks.1.ls2.gamma"] == LAYER_SCALE_INIT)
    assert torch.all(state["aggregator.frame_blocks.1.norm1.weight"] == 1)
    assert torch.count_nonzero(state["camera_head.empty_pose_tokens"]) == 0
    n = model.config.camera_num_iterations
    bias = state["camera_head.pose_branch.fc2.bias"]
    expected = torch.zeros(9)
    expected[6], expected[7:9] = 1.0 / n, 1.0 / n
    torch.testing.assert_close(bias, expected, rtol=0, atol=0)


def test_the_first_predictions_sit_where_the_targets_are():
    """Depth near 1 (the normalised clip's scale), cameras near the identity with a field of
    view near 1 rad, and a live (positive) field of view from the first iteration on."""
    model = _fresh().eval()
    images = torch.rand(1, 3, 3, 28, 42, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pred = clip_forward(model, images, num_scale_frames=2)
    depth = pred["depth"]
    assert torch.isfinite(depth).all() and 0.5 < depth.median() < 2.0
    final = pred["pose_enc"]
    assert final[..., :3].abs().max() < 0.2 and (final[..., 6] - 1).abs().max() < 0.2
    assert ((final[..., 7:9] - 1).abs() < 0.3).all()
    assert all((activate_pose(p)[..., 7:9] > 0).all() for p in pred["pose_enc_list"])


def test_a_point_head_added_to_trained_weights_starts_as_from_scratch_and_leaves_the_rest(tmp_path):
    """`mapstream train --model CHECKPOINT --enable-point` on a checkpoint without a point head:
    the head is drawn as a from-scratch model's (last convolution scaled down), every other
    weight is the checkpoint's, and the run exports all of them."""
    import pytest
    from safetensors.torch import save_file

    from mapstream.train.config import TrainConfig
    from mapstream.train.init import init_head_for_training_
    from mapstream.train.trainer import build_training_model

    trained = _fresh(3)
    source = tmp_path / "trained.safetensors"
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, source)
    config = TrainConfig(model=str(source), preset="tiny", enable_point=True, seed=5, device="cpu", out=tmp_path / "run")
    model, preset = build_training_model(config)
    assert preset == "tiny" and model.point_head is not None
    for key, value in trained.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    again = init_head_for_training_(mapstream.build_model("tiny", enable_point=True), "point_head", 5)
    for key, value in model.point_head.state_dict().items():
        assert torch.equal(again.point_head.state_dict()[key], value), key
    last = [m for m in model.point_head.modules() if isinstance(m, torch.nn.Conv2d)][-1]
    assert float(last.weight.detach().abs().max()) < 0.05  # scaled by 0.01 from He's scale: points start near exp(0)
    images = torch.rand(1, 3, 3, 28, 28)
    out = clip_forward(model, images, num_scale_frames=1)
    assert out["world_points"].shape == (1, 3, 28, 28, 3) and torch.isfinite(out["world_points"]).all()
    with pytest.raises(ValueError, match="no camera_head"):
        init_head_for_training_(torch.nn.Module(), "camera_head")


def test_the_matching_initialisation_ties_global_keys_and_writes_positions_as_sines():
    plain = _fresh(5).state_dict()
    model = init_for_training_(mapstream.build_model("tiny"), 5, matching=True)
    state, width = model.state_dict(), model.config.embed_dim
    table = state["aggregator.patch_embed.pos_embed"][0, 1:]  # 37 x 37 patches, 128 channels
    quarter = width // 4
    cols = torch.arange(37.0).repeat(37)
    # the second quarter holds cos(row * f), the fourth cos(col * f): at f = 1, cos of the index
    torch.testing.assert_close(table[:, 3 * quarter], torch.cos(cols))
    torch.testing.assert_close(table[:, quarter], torch.cos(torch.arange(37.0).repeat_interleave(37)))
    assert table.abs().max() <= 1 and torch.equal(state["aggregator.patch_embed.pos_embed"][0, 0],
                                                  plain["aggregator.patch_embed.pos_embed"][0, 0])
    for i in range(model.config.depth):
        qkv = state[f"aggregator.global_blocks.{i}.attn.qkv.weight"]
        assert torch.equal(qkv[:width], qkv[width:2 * width]) and torch.equal(qkv[:width], plain[
            f"aggregator.global_blocks.{i}.attn.qkv.weight"][:width])
        frame = state[f"aggregator.frame_blocks.{i}.attn.qkv.weight"]
        assert not torch.equal(frame[:width], frame[width:2 * width])
    changed = {k for k in plain if not torch.equal(plain[k], state[k])}
    assert changed == {"aggregator.patch_embed.pos_embed"} | {
        f"aggregator.global_blocks.{i}.attn.qkv.weight" for i in range(model.config.depth)}
