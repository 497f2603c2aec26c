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
from mapstream.train.init import init_for_training_, sincos_positions_, tie_global_keys_
from mapstream.train.losses import camera_loss

MODES = ("bright", "brightdiff", "blob", "blobshift", "shift", "patchshift")
H, W, MAX_SHIFT = 56, 112, 28
FX = W / 2  # a 90-degree horizontal field of view


def clips(mode: str, n: int, generator: torch.Generator,
          max_shift: int = MAX_SHIFT) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` two-frame clips [n, 2, 3, H, W], their pose encodings [n, 2, 9] and the second
    frames' shifts in pixels [n]; `shift` moves the texture by up to `max_shift` pixels."""
    if not 1 <= max_shift <= MAX_SHIFT:
        raise ValueError(f"max_shift must be in [1, {MAX_SHIFT}], got {max_shift}")
    wide = W + 4 * MAX_SHIFT
    coarse = torch.rand(n, 3, 8, 24, generator=generator)
    fine = torch.rand(n, 3, 28, 84, generator=generator)
    texture = (0.6 * F.interpolate(coarse, size=(H, wide), mode="bicubic", align_corners=False)
               + 0.4 * F.interpolate(fine, size=(H, wide), mode="bilinear", align_corners=False)).clamp(0, 1)
    if mode == "patchshift":
        shift = 14 * torch.randint(-2, 3, (n,), generator=generator)
    else:
        shift = torch.randint(-max_shift, max_shift + 1, (n,), generator=generator)
    start = MAX_SHIFT * 2
    images = torch.stack([torch.stack([texture[b, :, :, start + s * int(shift[b]): start + s * int(shift[b]) + W]
                                       for s in range(2)]) for b in range(n)])
    fraction = shift.float() / (MAX_SHIFT if mode == "patchshift" else max_shift)  # in [-1, 1]
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
    return images.clamp(0, 1), torch.stack(encodings), shift


def _span(centre: int) -> slice:
    return slice(max(0, centre - 8), min(W, centre + 8))


def yaw_error_deg(pred: torch.Tensor, gt: torch.Tensor) -> float:
    """Mean |yaw error| of the second frames, from the quaternions' y components."""
    yaw = lambda enc: 2 * torch.asin(enc[:, 1:, 4].clamp(-1, 1))  # noqa: E731
    return float((yaw(pred) - yaw(gt)).abs().rad2deg().mean())


def patch_targets(shift: torch.Tensor, patch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each patch of the second frame [n, h*w]: the index of the first frame's patch
    holding its centre, and whether that centre lies inside the first frame."""
    gh, gw = H // patch, W // patch
    col = torch.arange(gw, device=shift.device) * patch + patch // 2
    seen = col[None, :] + shift[:, None]  # the first frame's pixel column of each centre
    inside = (seen >= 0) & (seen < W)
    target_col = (seen.clamp(0, W - 1) // patch)
    rows = torch.arange(gh, device=shift.device)[None, :, None]
    target = rows * gw + target_col[:, None, :]  # [n, gh, gw]
    return target.flatten(1), inside[:, None, :].expand(-1, gh, -1).flatten(1)


def auxiliary_loss(kind: str, head: torch.nn.Module, layers: list[torch.Tensor], shift: torch.Tensor,
                   patch: int, first_patch: int) -> torch.Tensor:
    """A dense cross-frame loss on the aggregator's last selected layer: "match" scores each
    second-frame patch against the first frame's (InfoNCE on the true patch); "flow" regresses
    each second-frame patch's displacement to the first frame in patches."""
    tokens = layers[-1][:, :, first_patch:]  # [n, 2, P, 2C]
    target, inside = patch_targets(shift, patch)
    if kind == "match":
        desc = F.normalize(head(tokens), dim=-1)
        logits = desc[:, 1] @ desc[:, 0].transpose(1, 2) / 0.1  # [n, P, P]
        ce = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none")
        return (ce * inside.flatten()).sum() / inside.sum().clamp(min=1)
    flow = head(tokens[:, 1]).squeeze(-1)  # [n, P]
    return F.smooth_l1_loss(flow, (shift.float() / patch)[:, None].expand_as(flow))


def main(argv: list[str] | None = None) -> list[tuple[int, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES, default="blobshift")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--aux", choices=("none", "match", "flow"), default="none",
                    help="a dense cross-frame loss on the tokens next to the camera loss")
    ap.add_argument("--aux-weight", type=float, default=1.0)
    ap.add_argument("--init", nargs="*", choices=("sincos", "tied"), default=[],
                    help="initialisations meant to make matching easier to learn (mapstream.train.init)")
    ap.add_argument("--max-shift", type=int, default=MAX_SHIFT, help="the largest shift in pixels (shift mode)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--eval-every", type=int, default=50)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = init_for_training_(mapstream.build_model(args.preset), args.seed)
    if "sincos" in args.init:
        sincos_positions_(model)
    if "tied" in args.init:
        tie_global_keys_(model)
    device = torch.device(args.device)
    model.to(device).train()
    width = 2 * model.config.embed_dim
    head = torch.nn.Linear(width, 64 if args.aux == "match" else 1).to(device)
    optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=args.lr, weight_decay=0.05, betas=(0.9, 0.95))
    held_images, held_poses, _ = clips(args.mode, 64, torch.Generator().manual_seed(10_000 + args.seed),
                                       args.max_shift)
    held_images = held_images.to(device)
    still = held_poses.clone()
    still[..., 3:7] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    print(f"{args.mode}: predicting no rotation errs {yaw_error_deg(still, held_poses):.2f} deg")
    history = []
    for step in range(args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 50)
        images, poses, shift = (t.to(device) for t in clips(args.mode, args.batch_size, generator, args.max_shift))
        out = clip_forward(model, images, num_scale_frames=1, dense=False, keep_layers=args.aux != "none")
        loss, _ = camera_loss(out["pose_enc_list"], poses)
        if args.aux != "none":
            aux = auxiliary_loss(args.aux, head, out["layers"], shift, model.config.patch_size,
                                 model.config.num_special_tokens)
            loss = loss + args.aux_weight * aux
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                pred = clip_forward(model, held_images, num_scale_frames=1, dense=False)["pose_enc"]
            model.train()
            history.append((step, yaw_error_deg(pred.cpu(), held_poses)))
            extra = f" (aux {aux.item():.4f})" if args.aux != "none" else ""
            print(f"step {step}: loss {loss.item():.4f}{extra}, held-out yaw error {history[-1][1]:.2f} deg", flush=True)
    return history


if __name__ == "__main__":
    main()
