"""The trunk's linear layers in 8 bits (torchao): which layers, their bytes, the function kept
within the trunk's own rounding, our fused kernels stepping aside, and fp8 refused where there
are no FP8 tensor cores. (Speed, energy and error on a GPU: `mapstream bench --trunk-weights`.)"""
from __future__ import annotations

import pytest
import torch

import mapstream
from mapstream.gpu_memory import estimate_memory
from mapstream.layers.quantized import MIN_FEATURES, eligible_linears, is_quantized, quantized_bytes, tensor_bytes

pytest.importorskip("torchao")

FRAMES = torch.rand(4, 3, 28, 42, generator=torch.Generator().manual_seed(0))


def _net():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


def _run(net, precision):
    with net.session(num_scale_frames=2, precision=precision) as session:
        return session.run_frames(FRAMES)


def _worst(got, want, key):
    return max(float((getattr(a, key) - getattr(b, key)).norm() / getattr(b, key).norm()) for a, b in zip(got, want))


def test_int8_weights_quantize_the_large_linear_layers_of_the_trunk_only():
    net = _net()
    eligible = eligible_linears(net.aggregator)
    assert eligible and all(min(m.in_features, m.out_features) >= MIN_FEATURES for m in eligible)
    small = [m for m in net.aggregator.modules() if isinstance(m, torch.nn.Linear) and m not in eligible]
    want = {id(m): quantized_bytes(m, "int8") for m in eligible}
    estimated = estimate_memory(net, (28, 42), net.stream_config, precision="fp32", trunk_weights="int8").weights
    net.quantize_trunk("int8")
    assert net.trunk_weights == "int8"
    assert all(is_quantized(m.weight) and tensor_bytes(m.weight) == want[id(m)] for m in eligible)
    assert not any(is_quantized(m.weight) for m in small)
    heads = [p for h in (net.camera_head, net.depth_head) for p in h.parameters()]
    assert not any(is_quantized(p) for p in heads)
    # the estimate counted exactly what the quantized network holds
    assert estimate_memory(net, (28, 42), net.stream_config, precision="fp32").weights == estimated
    net.quantize_trunk("int8")  # again: nothing left to quantize, nothing changes
    assert all(tensor_bytes(m.weight) == want[id(m)] for m in eligible)


def test_int8_weights_compute_the_network_with_each_weight_row_rounded_to_127_steps():
    """The quantized forward is the network whose weights are rounded to int8 with a scale per
    output row (each within half a step, the step the row's largest magnitude over 127), run
    in the same precision: in fp32 the two agree to float rounding, far closer than either is
    to the unrounded network."""
    import copy

    net = _net()
    exact = _run(net, "fp32")
    rounded = copy.deepcopy(net)
    before = {id(m): m.weight.detach().clone() for m in eligible_linears(net.aggregator)}
    net.quantize_trunk("int8")
    quantized = _run(net, "fp32")
    for mine, theirs in zip(eligible_linears(net.aggregator), eligible_linears(rounded.aggregator)):
        w = before[id(mine)]
        step = w.abs().amax(dim=1, keepdim=True) / 127
        dequantized = mine.weight.dequantize()
        assert (dequantized - w).abs().le(step / 2 * (1 + 1e-5) + 1e-12).all()
        theirs.weight.data = dequantized
    plain = _run(rounded, "fp32")
    for key in ("depth", "pose_enc"):
        assert _worst(quantized, plain, key) < 1e-3 * _worst(quantized, exact, key), key
    net.cast_for_inference("bf16")  # a later cast leaves quantized weights as they are
    assert all(is_quantized(m.weight) for m in eligible_linears(net.aggregator))


def test_fused_linear_kernels_leave_quantized_layers_to_their_own_forward():
    from mapstream.layers.linear_gelu import half_product_dtype
    from mapstream.layers.row_linear import _kernel_takes

    net = _net().quantize_trunk("int8")
    fc1 = net.aggregator.frame_blocks[0].mlp.fc1
    x = torch.randn(1, fc1.in_features)
    assert is_quantized(fc1.weight)
    assert not _kernel_takes(x, fc1, None)
    assert half_product_dtype(x, fc1) is None


def test_fp8_weights_are_refused_without_fp8_tensor_cores():
    with pytest.raises(ValueError, match="FP8 tensor cores.*use 'int8'"):
        _net().quantize_trunk("fp8")
    with pytest.raises(ValueError, match="trunk weights must be one of"):
        _net().quantize_trunk("int4")
