"""CUDA-only checks of training (skipped without a GPU): a bf16 step has gradients through the
whole network, and the clip forward on CUDA equals the CPU's."""
from __future__ import annotations

import pytest
import torch

import mapstream
from mapstream.train.config import TrainConfig
from mapstream.train.forward import clip_forward
from mapstream.train.trainer import train

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_bf16_steps_train_every_weight_on_cuda(tmp_path):
    config = TrainConfig(model="tiny", device="cuda", precision="bf16", frames=4, num_scale_frames=2,
                         image_hw=(28, 42), more_image_hw=((42, 56),), batch_size=2, steps=3, warmup_steps=1,
                         checkpoint_layers=True, out=tmp_path, tensorboard=False, log_every=1)
    summary = train(config, progress=False)
    assert summary.steps == 3 and all(torch.isfinite(torch.tensor(summary.losses)))
    trained = mapstream.load_model(summary.weights, preset="tiny")
    from mapstream.train.init import init_for_training_
    start = init_for_training_(mapstream.build_model("tiny"), config.seed).state_dict()
    unchanged = [k for k, v in trained.state_dict().items() if v.is_floating_point() and torch.equal(v, start[k])]
    # Every parameter moves; the only tensors left are those no loss reaches (the unused mask token).
    assert set(unchanged) <= {"aggregator.patch_embed.mask_token"}, unchanged


@pytest.fixture
def no_tf32():
    # cuDNN convolutions run in TF32 by default (10-bit mantissa): fp32 on both sides here.
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_clip_forward_on_cuda_equals_the_cpu(no_tf32):
    model = mapstream.build_model("tiny")
    mapstream.fill_synthetic_(model)
    images = torch.rand(2, 5, 3, 28, 42, generator=torch.Generator().manual_seed(0))
    cpu = clip_forward(model, images, num_scale_frames=2)
    gpu = clip_forward(model.cuda(), images.cuda(), num_scale_frames=2)
    for key in ("pose_enc", "depth", "depth_conf"):
        torch.testing.assert_close(gpu[key].cpu(), cpu[key], atol=2e-4, rtol=2e-4)


def test_compiled_flex_attention_equals_masked_sdpa_on_cuda_with_its_gradients(no_tf32):
    model = mapstream.build_model("tiny").cuda()
    mapstream.fill_synthetic_(model)
    images = torch.rand(2, 6, 3, 42, 56, generator=torch.Generator().manual_seed(1)).cuda()
    results = {}
    for kind in ("sdpa", "flex"):
        model.zero_grad(set_to_none=True)
        out = clip_forward(model, images, num_scale_frames=2, attention=kind)
        (out["depth"].square().mean() + out["pose_enc"].square().mean()).backward()
        results[kind] = out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    (sdpa, sdpa_grads), (flex, flex_grads) = results["sdpa"], results["flex"]
    for key in ("pose_enc", "depth", "depth_conf"):
        torch.testing.assert_close(flex[key], sdpa[key], atol=2e-4, rtol=2e-4)
    assert sdpa_grads.keys() == flex_grads.keys() and len(sdpa_grads) > 10
    for name, grad in sdpa_grads.items():
        torch.testing.assert_close(flex_grads[name], grad, atol=1e-4, rtol=1e-3, msg=name)
