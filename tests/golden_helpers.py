"""Building models for golden cases and comparing outputs at the golden tolerances."""
from __future__ import annotations

import torch

import mapstream

# Golden README section 7.
POSE_TOL = dict(rtol=1e-4, atol=1e-4)
DENSE_TOL = dict(rtol=1e-4, atol=1e-5)
OUTPUT_TOL = {
    "pose_enc": POSE_TOL,
    "depth": DENSE_TOL,
    "depth_conf": DENSE_TOL,
    "world_points": DENSE_TOL,
    "world_points_conf": DENSE_TOL,
}


def cache_config_of(meta: dict) -> dict:
    """The stream settings (keywords of a session) of the golden case's cache."""
    kw = meta["constructor_kwargs"]
    return dict(
        cache_scale_frames=kw["kv_cache_scale_frames"],
        sliding_window=kw["kv_cache_sliding_window"],
        cross_frame_special=kw.get("kv_cache_cross_frame_special", True),
        include_scale_frames=kw.get("kv_cache_include_scale_frames", True),
    )


def keyframe_interval_of(meta: dict) -> int:
    calls = " ".join(meta["calls"])
    return 2 if "keyframe_interval=2" in calls else 1


def assert_outputs_close(out: dict, ref: dict, keys=("pose_enc", "depth", "depth_conf"), prefix: str = "") -> None:
    for key in keys:
        got, want = out[key], ref[prefix + key]
        assert got.shape == want.shape, f"{key}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert torch.isfinite(got).all(), f"{key}: non-finite values"
        torch.testing.assert_close(got, want, **OUTPUT_TOL[key], msg=lambda m: f"{prefix}{key}: {m}")


def assert_intermediate_close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    atol = 1e-4 * float(want.abs().max()) if want.numel() else 0.0
    torch.testing.assert_close(got.to(want.dtype), want, rtol=1e-4, atol=atol, msg=lambda m: f"{name}: {m}")


def forward_sequence(model: mapstream.GCTStream, images: torch.Tensor, scale: int) -> dict:
    """The reference's low-level protocol: scale frames as one block, then one frame per call."""
    x = images.unsqueeze(0)
    outs = [model(x[:, :scale], num_frame_for_scale=scale, num_frame_per_block=scale)]
    for i in range(scale, x.shape[1]):
        outs.append(model(x[:, i : i + 1], num_frame_for_scale=scale, num_frame_per_block=1))
    return {k: torch.cat([o[k] for o in outs], dim=1) for k in ("pose_enc", "depth", "depth_conf")}
