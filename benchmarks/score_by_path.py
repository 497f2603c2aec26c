"""A trained network's held-out camera and depth errors for each kind of camera path, against
the levels of a camera that never turns (`mapstream.train.validate.Validation.references`).

    python3 benchmarks/score_by_path.py --model runs/small_clip8/model.safetensors --preset small \
        --frames 4 --frame-step 3 --hw 112 196 --clips 16 --out by_path.json

Training's validation mixes the path kinds; this tells which of them (pans, orbits, forward
walks, loops) a network has learned to measure and which it still answers with a mean camera.
Clips come from the "val" split, as in training's validation.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    import torch

    import mapstream
    from mapstream.train.forward import clip_forward
    from mapstream.train.render import PATH_KINDS
    from mapstream.train.validate import Validation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="weights file, or a preset name (weights as training from scratch draws them)")
    ap.add_argument("--preset", default="auto")
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--scale-frames", type=int, default=1)
    ap.add_argument("--frame-step", type=int, default=1)
    ap.add_argument("--hw", type=int, nargs=2, default=(112, 196))
    ap.add_argument("--clips", type=int, default=16, help="held-out clips of each path kind")
    ap.add_argument("--kinds", nargs="+", default=list(PATH_KINDS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    if args.model in mapstream.preset_names():  # the untrained start: training's own initialisation
        from mapstream.train.init import init_for_training_
        model = init_for_training_(mapstream.build_model(args.model), seed=0)
    else:
        model = mapstream.load_model(args.model, preset=args.preset)
    model = model.to(device).eval()

    def forward(images):
        return clip_forward(model, images, num_scale_frames=args.scale_frames)

    rows = {}
    for kind in args.kinds:
        validation = Validation(args.clips, args.frames, tuple(args.hw), device, path_kinds=(kind,),
                                frame_step=args.frame_step)
        values = validation(forward)
        still = validation.references()["val_rotation_deg"]
        rows[kind] = {"rotation_deg": values["val_rotation_deg"], "still_rotation_deg": still,
                      "rotation_ratio": values["val_rotation_deg"] / still if still > 0 else float("nan"),
                      "translation_deg": values["val_translation_deg"],
                      "depth_abs_rel": values["val_depth_abs_rel"]}
        print(f"{kind:8s} rotation {values['val_rotation_deg']:6.2f} deg (still {still:6.2f}, "
              f"ratio {rows[kind]['rotation_ratio']:.2f})  centre direction {values['val_translation_deg']:6.1f} deg  "
              f"depth abs_rel {values['val_depth_abs_rel']:.3f}")
    result = {"model": str(args.model), "frames": args.frames, "scale_frames": args.scale_frames,
              "frame_step": args.frame_step, "hw": list(args.hw), "clips": args.clips, "kinds": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
