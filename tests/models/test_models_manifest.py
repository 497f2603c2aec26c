"""The state dict is the contract with the official checkpoints: keys, order and shapes."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import mapstream
from mapstream.models import fill_synthetic_, synthetic_tensor

from conftest import GOLDEN


def _manifest(name: str) -> list[tuple[str, list[int]]]:
    path = GOLDEN / name
    if not path.exists():
        pytest.skip(f"{path} not found")
    return [(e["key"], e["shape"]) for e in json.loads(path.read_text())["state_dict"]]


@pytest.mark.parametrize(
    "preset, overrides, manifest",
    [
        ("lingbot-map", {}, "manifest_gctstream.json"),
        ("lingbot-map", {"enable_point": True}, "manifest_gctstream_window_v2.json"),
        ("tiny", {}, "manifest_tiny.json"),
    ],
)
def test_state_dict_matches_manifest(preset, overrides, manifest):
    with torch.device("meta"):
        model = mapstream.build_model(preset, **overrides)
    got = [(k, list(v.shape)) for k, v in model.state_dict().items()]
    assert got == _manifest(manifest)


def test_full_model_parameter_count():
    with torch.device("meta"):
        model = mapstream.build_model("lingbot-map")
    assert sum(p.numel() for p in model.state_dict().values()) == 1_157_943_540


def test_derived_tables_are_not_in_the_state_dict():
    model = mapstream.build_model("tiny")
    keys = set(model.state_dict())
    assert "aggregator._resnet_mean" not in keys and "aggregator._resnet_std" not in keys
    assert not any("rope" in k for k in keys)


def test_weight_rule_reproduces_tiny_weights_bit_for_bit():
    path = GOLDEN / "tiny_weights.safetensors"
    if not path.exists():
        pytest.skip("tiny_weights.safetensors not found")
    reference = load_file(str(path))
    model = fill_synthetic_(mapstream.build_model("tiny"))
    state = model.state_dict()
    assert set(state) == set(reference)
    for key, value in reference.items():
        assert torch.equal(state[key], value), key


def test_weight_rule_fov_special_case():
    w = synthetic_tensor("camera_head.pose_branch.fc2.weight", (9, 16))
    plain = synthetic_tensor("camera_head.pose_branch.fc2.weightX", (9, 16))  # other key: other seed
    assert w.shape == plain.shape
    b = synthetic_tensor("camera_head.pose_branch.fc2.bias", (9,))
    g = torch.Generator().manual_seed(__import__("zlib").crc32(b"camera_head.pose_branch.fc2.bias"))
    z = torch.randn((9,), generator=g) * 0.02
    assert torch.equal(b[:7], z[:7]) and torch.equal(b[7:], z[7:] + 0.3125)


def test_reference_constructor_arguments_port_unchanged():
    """Code written for the reference builds the same model by changing the import."""
    import json as _json

    kwargs = _json.loads((GOLDEN / "manifest_gctstream.json").read_text())["constructor_kwargs"]
    with torch.device("meta"):
        model = mapstream.GCTStream(**kwargs)
    assert [(k, list(v.shape)) for k, v in model.state_dict().items()] == _manifest("manifest_gctstream.json")
    assert model.backend_name == "sdpa"  # use_sdpa=True
    assert model.stream_config.sliding_window == kwargs["kv_cache_sliding_window"]
    with pytest.raises(ValueError, match="Unknown model argument 'kv_cache_sliding_windw'"):
        mapstream.GCTStream(kv_cache_sliding_windw=3)


@pytest.mark.parametrize("argument, value, official", [
    ("patch_embed", "dinov2_vits14_reg", "dinov2_vitl14_reg"),
    ("enable_camera_3d_rope", True, False),
    ("enable_local_point", True, False),
    ("pred_normalization", True, False),
])
def test_reference_arguments_that_would_build_another_network_are_refused(argument, value, official, caplog):
    """These reference arguments change the network (another ViT, a camera RoPE, a local point
    head) or crash the reference (prediction normalisation). Only their official value is
    accepted, as a no-op; any other is an error instead of the official network built anyway."""
    with pytest.raises(ValueError, match=f"{argument}={value!r} is not supported, only {official!r}"):
        mapstream.build_model("tiny", **{argument: value})
    with caplog.at_level("INFO", logger="mapstream.models.gct"):
        model = mapstream.build_model("tiny", **{argument: official})
    assert argument in caplog.text  # told it has no effect
    keys = [(k, v.shape) for k, v in model.state_dict().items()]
    assert keys == [(k, v.shape) for k, v in mapstream.build_model("tiny").state_dict().items()]


@pytest.mark.parametrize("override, message", [
    ({"num_heads": 0}, "num_heads must be >= 1, got 0"),
    ({"vit_num_heads": 0}, "vit_num_heads must be >= 1, got 0"),
    ({"embed_dim": -128}, "embed_dim must be >= 1, got -128"),
    ({"patch_size": 0}, "patch_size must be >= 1, got 0"),
    ({"num_register_tokens": -1}, "num_register_tokens must be >= 0, got -1"),
    ({"vit_depth": 0}, "vit_depth must be >= 1, got 0"),
    ({"camera_trunk_depth": 0}, "camera_trunk_depth must be >= 1, got 0"),
    ({"dpt_chunk_frames": 0}, "dpt_chunk_frames must be >= 1, got 0"),
    ({"depth": 2.0}, "depth must be an integer >= 1, got 2.0"),
    ({"mlp_ratio": 0}, "mlp_ratio must be > 0, got 0"),
    ({"dpt_out_channels": (64, 64, 64)}, r"dpt_out_channels must be 4 positive integers, got \(64, 64, 64\)"),
    ({"vit_num_heads": 3}, "embed_dim 128 is not divisible by vit_num_heads 3"),
])
def test_an_impossible_architecture_is_refused_when_configured_not_at_the_first_forward(override, message):
    """Counts that would divide by zero, build an empty stack or fail only inside a forward
    pass are refused by the configuration, naming the field."""
    with pytest.raises(ValueError, match=message):
        mapstream.build_model("tiny", **override)


@pytest.mark.parametrize("override, message", [
    ({"kv_cache_sliding_window": 2.5}, "sliding_window must be an integer >= 1, got 2.5"),
    ({"kv_cache_scale_frames": -1}, "num_scale_frames must be >= 1, got -1"),
    ({"trajectory_capacity": 1.5}, r"trajectory_capacity must be >= 2 or None \(unbounded\), got 1.5"),
])
def test_a_cache_policy_that_cannot_be_kept_is_refused_when_configured(override, message):
    with pytest.raises(ValueError, match=message):
        mapstream.build_model("tiny", **override)


def test_cast_for_inference_refuses_a_dtype_the_kernels_do_not_run_in():
    model = mapstream.build_model("tiny")
    with pytest.raises(ValueError, match="takes bf16, fp16 or fp32 .* got torch.int8"):
        model.cast_for_inference(torch.int8)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # left as it was
