"""Deepening a trained network (mapstream.train.deepen): the deeper architecture computes the
trained one's function exactly, streamed past eviction as well as over a clip; the added
blocks are identities that training wakes; mismatched architectures are refused."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import mapstream
from mapstream.config import StreamConfig, get_preset
from mapstream.train.checkpointing import export_weights
from mapstream.train.config import TrainConfig
from mapstream.train.deepen import deepen_state_dict, deepened_layers, placement
from mapstream.train.forward import clip_forward
from mapstream.train.init import init_for_training_
from mapstream.train.trainer import build_training_model, train

TINY = get_preset("tiny").model


def _deeper_tiny() -> mapstream.GCTStream:
    """The tiny preset's weights (drawn for training, gammas at 0.01) and a 3/8/3-deep copy."""
    target = dataclasses.replace(TINY, vit_depth=3, depth=8, camera_trunk_depth=3,
                                 selected_layers=deepened_layers(TINY, 8))
    stream = StreamConfig(num_scale_frames=2, sliding_window=2, trajectory_capacity=4)
    source = init_for_training_(mapstream.GCTStream(TINY, stream), seed=3).eval()
    deep = mapstream.GCTStream(target, stream).eval()
    deep.load_state_dict(deepen_state_dict(source.state_dict(), TINY, target))
    return source, deep


def test_blocks_spread_evenly_and_each_ends_its_group():
    assert placement(6, 12) == [1, 3, 5, 7, 9, 11]
    assert placement(5, 8) == [0, 2, 3, 5, 7]
    assert placement(1, 2) == [1]
    assert placement(4, 4) == [0, 1, 2, 3]
    assert deepened_layers(get_preset("small").model, 12) == get_preset("small-deep").model.selected_layers
    with pytest.raises(ValueError, match="cannot spread 3 blocks over 2"):
        placement(3, 2)


def test_the_deepened_network_streams_exactly_what_the_trained_one_does():
    source, deep = _deeper_tiny()
    frames = torch.rand(1, 7, 3, 28, 42, generator=torch.Generator().manual_seed(0))
    # A window of 2 evicts from the fifth frame on: the trajectory memory and every cache
    # layer, the added ones included, are read.
    want = source.inference_streaming(frames, num_scale_frames=2)
    got = deep.inference_streaming(frames, num_scale_frames=2)
    for key in ("pose_enc", "depth", "depth_conf"):
        assert torch.equal(got[key], want[key]), key
    with torch.no_grad():
        want, got = clip_forward(source, frames, num_scale_frames=2), clip_forward(deep, frames, num_scale_frames=2)
    for key in ("pose_enc", "depth", "depth_conf"):
        assert torch.equal(got[key], want[key]), key


def test_added_blocks_are_copies_of_the_block_they_precede_with_their_gammas_at_zero():
    source, deep = _deeper_tiny()
    src, out = source.state_dict(), deep.state_dict()
    # tiny's 5 aggregator layers go to 0, 2, 3, 5, 7 of 8; 1, 4 and 6 are added.
    for j, i, added in [(0, 0, False), (1, 1, True), (2, 1, False), (4, 3, True), (6, 4, True), (7, 4, False)]:
        for stack in ("frame_blocks", "global_blocks"):
            for name in ("attn.qkv.weight", "mlp.fc2.bias", "norm1.weight"):
                assert torch.equal(out[f"aggregator.{stack}.{j}.{name}"], src[f"aggregator.{stack}.{i}.{name}"])
            for gamma in ("ls1.gamma", "ls2.gamma"):
                want = torch.zeros_like(src[f"aggregator.{stack}.{i}.{gamma}"]) if added else src[f"aggregator.{stack}.{i}.{gamma}"]
                assert torch.equal(out[f"aggregator.{stack}.{j}.{gamma}"], want)
    # 2 patch-embedding blocks and 2 trunk blocks over 3: the first group has two blocks.
    assert placement(2, 3) == [0, 2]
    assert not out["aggregator.patch_embed.blocks.1.ls1.gamma"].any()
    assert torch.equal(out["camera_head.trunk.2.ls2.gamma"], src["camera_head.trunk.1.ls2.gamma"])
    assert not out["camera_head.trunk.1.ls2.gamma"].any()
    shared = [k for k in src if k.startswith(("depth_head.", "aggregator.camera_token", "camera_head.pose_branch"))]
    assert shared and all(out[k] is src[k] or torch.equal(out[k], src[k]) for k in shared)


def test_architectures_that_are_not_a_deepening_are_refused():
    state = mapstream.GCTStream(TINY).state_dict()
    with pytest.raises(ValueError, match="embed_dim"):
        deepen_state_dict(state, TINY, get_preset("small-deep").model)
    with pytest.raises(ValueError, match=r"read layers \(0, 3, 5, 7\)"):
        deepen_state_dict(state, TINY, dataclasses.replace(TINY, depth=8, selected_layers=(0, 2, 3, 7)))
    with pytest.raises(ValueError, match="vit_depth 1 is shallower"):
        deepen_state_dict(state, TINY, dataclasses.replace(TINY, vit_depth=1))


def test_training_grows_a_checkpoint_into_the_deeper_preset_and_wakes_the_added_blocks(tmp_path):
    small = init_for_training_(mapstream.build_model("small"), seed=1)
    source = tmp_path / "small.safetensors"
    export_weights(small.state_dict(), source, {"preset": "small"})
    config = TrainConfig(model=str(source), deepen="small-deep", out=tmp_path / "run", frames=2, image_hw=(28, 28),
                         num_scale_frames=1, batch_size=1, steps=1, warmup_steps=0, log_every=1, tensorboard=False,
                         device="cpu", lr=1e-3)
    model, preset = build_training_model(config)
    assert preset == "small-deep" and model.config == get_preset("small-deep").model
    summary = train(config, progress=False)
    trained = mapstream.load_model(summary.weights, preset="auto")
    assert summary.preset == "small-deep" and trained.config == get_preset("small-deep").model
    # One optimiser step moves the added blocks' gammas off zero (their branches are alive).
    assert trained.state_dict()["aggregator.global_blocks.0.ls1.gamma"].abs().min() > 0
    with pytest.raises(ValueError, match="--deepen grows a trained checkpoint"):
        build_training_model(TrainConfig(model="small", deepen="small-deep"))
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        TrainConfig(model=str(source), deepen="huge")

