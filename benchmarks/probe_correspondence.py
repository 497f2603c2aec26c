"""What cross-frame signal can a network trained from scratch learn to turn into a camera angle?

Two-frame clips whose second camera is panned by an angle the images encode in one of these
ways; the network (a preset from `init_for_training_`) trains its camera head alone on them
(`clip_forward(dense=False)`), and the mean yaw error on 64 held-out clips is printed every
50 steps next to the error of predicting no rotation:

    bright     the second frame's brightness (one frame tells the angle)
    brightdiff the brightness of the second frame relative to the first's (a global comparison)
    blob       where a bright square sits in the second frame (one frame, spatial)
    blobshift  how far a bright square moved between the frames (a salient landmark followed)
    shift      how far a random texture moved (0-28 px): dense matching of texture
    patchshift the same in whole patches (-28, -14, 0, 14, 28 px)

    python benchmarks/probe_correspondence.py --mode blobshift --steps 400

docs/TRAINING.md ("What the camera can learn from scratch") gives the results.
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

import mapstream
from mapstream.geometry import extri_intri_to_pose_encoding
from mapstream.train.forward import clip_forward
from mapstream.train.init import init_for_training_
from mapstream.train.losses import camera_loss

MODES = ("bright", "brightdiff", "blob", "blobshift", "shift", "patchshift")
H, W, MAX_SHIFT = 56, 112, 28
FX = W / 2  # a 90-degree horizontal field of view


def clips(mode: str, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` two-frame clips [n, 2, 3, H, W] and their pose encodings [n, 2, 9]."""
    wide = W + 4 * MAX_SHIFT
    coarse = torch.rand(n, 3, 8, 24, generator=generator)
    fine = torch.rand(n, 3, 28, 84, generator=generator)
    texture = (0.6 * F.interpolate(coarse, size=(H, wide), mode="bicubic", align_corners=False)
               + 0.4 * F.interpolate(fine, size=(H, wide), mode="bilinear", align_corners=False)).clamp(0, 1)
    if mode == "patchshift":
        shift = 14 * torch.randint(-2, 3, (n,), generator=generator)
    else:
        shift = torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (n,), generator=generator)
    start = MAX_SHIFT * 2
    images = torch.stack([torch.stack([texture[b, :, :, start + s * int(shift[b]): start + s * int(shift[b]) + W]
                                       for s in range(2)]) for b in range(n)])
    fraction = shift.float() / MAX_SHIFT  # in [-1, 1]
    if mode in ("bright", "brightdiff"):
        base = torch.rand(n, generator=generator) * 0.5 + 0.25 if mode == "brightdiff" else torch.full((n,), 0.5)
        images = images * 0.2
        images[:, 0] += base[:, None, None, None]
        images[:, 1] += (base + 0.2 * fraction)[:, None, None, None]
    elif mode in ("blob", "blobshift"):
        images = images * 0.3
        for b in range(n):
            if mode == "blob":
                images[b, 1, :, 20:36, _span(W // 2 + int(fraction[b] * (W // 2 - 10)))] = 1.0
            else:
                first = int(torch.randint(30, W - 30, (), generator=generator))
                images[b, 0, :, 20:36, _span(first)] = 1.0
                images[b, 1, :, 20:36, _span(first + int(fraction[b] * 20))] = 1.0
    K = torch.tensor([[FX, 0, W / 2], [0, FX, H / 2], [0, 0, 1.0]]).expand(2, 3, 3)
    encodings = []
    for b in range(n):
        poses = torch.eye(4).repeat(2, 1, 1)
        angle = math.atan(float(shift[b]) / FX)  # the pan that moves the view by the shift
        poses[1, 0, 0] = poses[1, 2, 2] = math.cos(angle)
        poses[1, 0, 2], poses[1, 2, 0] = math.sin(angle), -math.sin(angle)
        encodings.append(extri_intri_to_pose_encoding(poses, K, (H, W)))
    return images.clamp(0, 1), torch.stack(encodings)


def _span(centre: int) -> slice:
    return slice(max(0, centre - 8), min(W, centre + 8))


def yaw_error_deg(pred: torch.Tensor, gt: torch.Tensor) -> float:
    """Mean |yaw error| of the second frames, from the quaternions' y components."""
    yaw = lambda enc: 2 * torch.asin(enc[:, 1:, 4].clamp(-1, 1))  # noqa: E731
    return float((yaw(pred) - yaw(gt)).abs().rad2deg().mean())


def main(argv: list[str] | None = None) -> list[tuple[int, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES, default="blobshift")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = init_for_training_(mapstream.build_model(args.preset), args.seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05, betas=(0.9, 0.95))
    held_images, held_poses = clips(args.mode, 64, torch.Generator().manual_seed(10_000 + args.seed))
    still = held_poses.clone()
    still[..., 3:7] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    print(f"{args.mode}: predicting no rotation errs {yaw_error_deg(still, held_poses):.2f} deg")
    history = []
    for step in range(args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 50)
        images, poses = clips(args.mode, args.batch_size, generator)
        loss, _ = camera_loss(clip_forward(model, images, num_scale_frames=1, dense=False)["pose_enc_list"], poses)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                pred = clip_forward(model, held_images, num_scale_frames=1, dense=False)["pose_enc"]
            model.train()
            history.append((step, yaw_error_deg(pred, held_poses)))
            print(f"step {step}: loss {loss.item():.4f}, held-out yaw error {history[-1][1]:.2f} deg", flush=True)
    return history


if __name__ == "__main__":
    main()
