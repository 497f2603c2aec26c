"""Pictures of predictions from untrained weights or mapstream's small model say so:
summary.png and the flythrough carry a visible caption when the run folder's records name the
tiny preset's synthetic weights or the shipped small weights."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mapstream.export import export_all
from mapstream.export.summary import SMALL_CAPTION, UNTRAINED_CAPTION, summary_figure, weights_caption
from mapstream.render import RenderOptions, render_flythrough
from mapstream.weights import SMALL_MODEL

pytest.importorskip("av")

from render_synthetic import decode, plane_run  # noqa: E402

TINY = "tiny (synthetic weights)"
TRAINED = "robbyant/lingbot-map (lingbot-map-long.pt)"


def record(folder: Path, name: str, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data))
    return folder


def caption_red(image: np.ndarray, rows: slice) -> float:
    """The fraction of pixels of ``rows`` that are the caption's red."""
    band = image[rows].astype(int)
    return float(((band[..., 0] > 140) & (band[..., 1] < 80) & (band[..., 2] < 80)).mean())


def test_the_caption_follows_the_run_that_wrote_the_folder(tmp_path: Path) -> None:
    assert weights_caption(record(tmp_path / "tiny", "run.json", {"config": {"model": TINY}})) == UNTRAINED_CAPTION
    assert weights_caption(record(tmp_path / "trained", "run.json", {"config": {"model": TRAINED}})) is None
    assert weights_caption(record(tmp_path / "small", "run.json", {"config": {"model": SMALL_MODEL}})) == SMALL_CAPTION
    assert weights_caption(tmp_path / "nothing") is None
    # A run being written over an earlier one: the writing run's settings count, not the earlier's.
    over = {"config": {"model": TRAINED}, "state": "being replaced", "replaced_by": [{"settings": {"model": TINY}}]}
    assert weights_caption(record(tmp_path / "over", "run.json", over)) == UNTRAINED_CAPTION
    back = {"config": {"model": TINY}, "state": "being replaced", "replaced_by": [{"settings": {"model": TRAINED}}]}
    assert weights_caption(record(tmp_path / "back", "run.json", back)) is None
    # Frames kept, no run.json yet.
    assert weights_caption(record(tmp_path / "kept", "progress.json", {"config": {"model": TINY}})) == UNTRAINED_CAPTION
    assert weights_caption(record(tmp_path / "bad", "run.json", {"config": "not a dict"})) is None


def test_summary_png_of_an_untrained_run_carries_the_caption(tmp_path: Path) -> None:
    recon = plane_run(n=4)
    assert summary_figure(recon, caption=UNTRAINED_CAPTION).get_suptitle() == UNTRAINED_CAPTION
    assert summary_figure(recon).get_suptitle() == ""
    tiny = record(tmp_path / "tiny", "run.json", {"config": {"model": TINY}})
    trained = record(tmp_path / "trained", "run.json", {"config": {"model": TRAINED}})
    for folder in (tiny, trained):
        export_all(recon, folder, formats=["summary"])  # as `mapstream run` and `mapstream export` write it
    top = slice(0, 30)
    captioned = np.asarray(Image.open(tiny / "summary.png").convert("RGB"))
    plain = np.asarray(Image.open(trained / "summary.png").convert("RGB"))
    assert caption_red(captioned, top) > 0.01 and caption_red(plain, top) == 0.0


def test_the_depth_previews_of_an_untrained_or_small_run_carry_the_caption(tmp_path: Path) -> None:
    """As summary.png: the previews are pictures shared on their own. The 16-bit maps are data
    and stay as they are."""
    recon = plane_run(n=2)
    folders = {model: record(tmp_path / name, "run.json", {"config": {"model": model}})
               for name, model in (("tiny", TINY), ("small", SMALL_MODEL), ("trained", TRAINED))}
    for folder in folders.values():
        export_all(recon, folder, formats=["depth"])
    stem = recon.file_stems()[0]
    previews = {m: np.asarray(Image.open(f / "depth_preview" / f"{stem}.png").convert("RGB")) for m, f in folders.items()}
    top = slice(0, 3)
    assert caption_red(previews[TINY], top) > 0.9 and caption_red(previews[SMALL_MODEL], top) > 0.9
    assert caption_red(previews[TRAINED], top) == 0.0
    depth = {m: np.asarray(Image.open(f / "depth" / f"{stem}.png")) for m, f in folders.items()}
    assert np.array_equal(depth[TINY], depth[TRAINED])


def test_the_flythrough_of_an_untrained_run_carries_the_caption(tmp_path: Path) -> None:
    recon = plane_run(n=3)
    options = RenderOptions(mode="static", height=96, inset=False, background="white")
    plain = decode(render_flythrough(recon, tmp_path / "plain.mp4", options, device="cpu", progress=False))
    captioned = decode(render_flythrough(recon, tmp_path / "captioned.mp4", RenderOptions(
        mode="static", height=96, inset=False, background="white", caption=UNTRAINED_CAPTION), device="cpu",
        progress=False))
    band = slice(0, 3)  # the top rows: red on every frame of the captioned video, white without
    assert all(caption_red(frame, band) > 0.9 for frame in captioned)
    assert all(caption_red(frame, band) < 0.1 for frame in plain)


def test_mapstream_render_captions_a_run_on_untrained_weights(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mapstream.cli.main import main

    for name, model in (("tiny", TINY), ("trained", TRAINED)):
        run = record(tmp_path / name, "run.json", {"config": {"model": model}})
        plane_run(n=3).save_npz(run / "predictions.npz")
        args = ["render", str(run), "--height", "64", "--quiet", "--device", "cpu", "--background", "white",
                "--no-inset"]
        assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"with the caption {UNTRAINED_CAPTION!r}") and out[1].endswith("(3 frames at 10 FPS)")
    assert caption_red(decode(tmp_path / "tiny" / "flythrough.mp4")[0], slice(0, 3)) > 0.9
    assert caption_red(decode(tmp_path / "trained" / "flythrough.mp4")[0], slice(0, 3)) < 0.1


def test_a_tiny_run_writes_a_captioned_summary(tmp_path: Path) -> None:
    """End to end: `mapstream run --model tiny` records its model where the summary reads it."""
    from mapstream.cli.main import main

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (42, 56, 3), dtype=np.uint8)).save(photos / f"{i}.png")
    out = tmp_path / "out"
    assert main(["run", str(photos), "--out", str(out), "--model", "tiny", "--image-size", "56",
                 "--num-scale-frames", "2", "--formats", "npz", "summary", "--quiet"]) == 0
    assert caption_red(np.asarray(Image.open(out / "summary.png").convert("RGB")), slice(0, 30)) > 0.01
