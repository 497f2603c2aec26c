"""Image loader: bit-exact against the reference golden data, plus listing and error cases."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import DATA, golden_case, golden_images
from mapstream.io.images import (
    list_images,
    load_images,
    pad_to_common_shape,
    pil_to_tensor,
    preprocess_image,
    resized_shape,
)

# --------------------------------------------------------------------------------------------
# Golden groups (shared/golden/preprocess.*)
# --------------------------------------------------------------------------------------------


def _golden_inputs(group: dict, tmp_path: Path) -> list[Path]:
    """The group's input files from shared/data; the rotated one rebuilt as the sidecar says."""
    paths = []
    for rel in group["input_files"]:
        src = DATA / Path(rel).relative_to("example")
        if not src.exists():
            pytest.skip(f"input {rel} is not in {DATA}")
        if group["rotated"] and f"file {rel} rotated" in group["rotated"]:
            rotated = tmp_path / f"rotated_{src.name}"
            Image.open(src).transpose(Image.Transpose.ROTATE_270).save(rotated)
            src = rotated
        paths.append(src)
    return paths


def _loader_args(call: str) -> dict:
    """``load_and_preprocess_images(paths, mode='crop', image_size=518, patch_size=14)`` ->
    kwargs dict."""
    inner = call[call.index("paths,") + len("paths,") : call.rindex(")")]
    kwargs = {}
    for item in inner.split(","):
        key, value = (s.strip() for s in item.split("="))
        kwargs[key] = value.strip("'\"") if key == "mode" else int(value)
    return kwargs


GROUPS = [
    "crop518_courthouse",
    "crop196_courthouse",
    "crop518_portrait",
    "pad196_portrait_and_landscape",
]


@pytest.mark.parametrize("name", GROUPS)
def test_golden_group(name: str, tmp_path: Path) -> None:
    tensors, meta = golden_case("preprocess")
    group = meta["groups"][name]
    out = load_images(_golden_inputs(group, tmp_path), **_loader_args(group["call"]))
    expected = golden_images(tensors, name)
    assert list(out.shape) == group["output_shape"]
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)


def test_golden_mixed_shapes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """courthouse (518x294) + oxford (518x392) at 518 -> courthouse padded white to 392 rows.

    ``example/oxford/000000.png`` is not in shared/data.  Its resize is a no-op
    (518x392 -> 518x392, PIL returns a copy), so the reference output row 1 *is* its pixels:
    we rebuild the file from the golden row and check the whole group, which exercises the
    batch padding of row 0 (49 white rows on top, 49 below) exactly.
    """
    tensors, meta = golden_case("preprocess")
    group = meta["groups"]["crop518_mixed_shapes"]
    assert group["input_sizes_wh"][1] == [518, 392]
    expected = golden_images(tensors, "crop518_mixed_shapes")
    oxford = tmp_path / "oxford_000000.png"
    rgb = tensors["crop518_mixed_shapes"][1].permute(1, 2, 0).numpy()
    Image.fromarray(np.ascontiguousarray(rgb)).save(oxford)

    with caplog.at_level(logging.WARNING, logger="mapstream.io.images"):
        paths = [DATA / "courthouse" / "000000.png", oxford]
        out = load_images(paths, **_loader_args(group["call"]))
    assert torch.equal(out, expected)
    assert "different shapes" in caplog.text and "[(294, 518), (392, 518)]" in caplog.text
    # row 0: the 294-row courthouse frame centred in 392 rows of white
    alone = load_images([DATA / "courthouse" / "000000.png"])
    assert torch.equal(out[0, :, 49:343], alone[0])
    assert bool((out[0, :, :49] == 1).all()) and bool((out[0, :, 343:] == 1).all())


# --------------------------------------------------------------------------------------------
# Size rules and per-image steps, exact values on synthetic images
# --------------------------------------------------------------------------------------------


def _random_rgb(width: int, height: int, seed: int = 0) -> Image.Image:
    array = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(array)


@pytest.mark.parametrize(
    ("wh", "mode", "size", "expected"),
    [
        ((640, 480), "crop", 518, (518, 392)),  # 4:3
        ((1920, 1080), "crop", 518, (518, 294)),  # 16:9
        ((480, 640), "crop", 518, (518, 686)),  # portrait: resized taller, then cropped
        ((480, 640), "pad", 518, (392, 518)),
        ((640, 480), "pad", 196, (196, 140)),  # 10.5 -> 10 (ties to even)
        ((640, 320), "crop", 518, (518, 252)),  # 18.5 -> 18 (ties to even)
        ((640, 960), "crop", 518, (518, 784)),  # 55.5 -> 56 (ties to even)
        # reference order h * (S / w): 159 * (518/106) / 14 = 55.4999.. -> 55
        # (h * S / w / 14 would be exactly 55.5 -> 56)
        ((106, 159), "crop", 518, (518, 770)),
    ],
)
def test_resized_shape(wh, mode, size, expected) -> None:
    assert resized_shape(*wh, mode=mode, image_size=size, patch_size=14) == expected


def test_crop_takes_centre_rows() -> None:
    image = _random_rgb(518, 700)  # resize is a no-op (700 = 50 * 14): crop rows 91..608
    out = preprocess_image(image, "crop", 518, 14)
    assert torch.equal(out, pil_to_tensor(image)[:, 91:609])


def test_pad_centres_with_white() -> None:
    image = _random_rgb(294, 518)  # portrait, no-op resize; 224 columns of padding
    out = preprocess_image(image, "pad", 518, 14)
    assert out.shape == (3, 518, 518)
    assert torch.equal(out[:, :, 112:406], pil_to_tensor(image))
    assert bool((out[:, :, :112] == 1).all()) and bool((out[:, :, 406:] == 1).all())


def test_pad_to_common_shape_puts_floor_half_top_left() -> None:
    small = torch.zeros(3, 1, 1)
    out = pad_to_common_shape([small, torch.zeros(3, 4, 3)])
    expected = torch.ones(3, 4, 3)
    expected[:, 1, 1] = 0  # dh = 3 -> 1 top, 2 bottom; dw = 2 -> 1 left, 1 right
    assert torch.equal(out[0], expected)


def test_rgba_composited_over_white() -> None:
    rgba = np.zeros((28, 28, 4), dtype=np.uint8)
    rgba[..., :3] = (10, 20, 30)
    rgba[:14, :, 3] = 255  # top half opaque, bottom half fully transparent
    out = preprocess_image(Image.fromarray(rgba, "RGBA"), "crop", 28, 14)
    colour = torch.tensor([10, 20, 30], dtype=torch.float32).div(255).view(3, 1, 1)
    assert torch.equal(out[:, :14], colour.expand(3, 14, 28))
    assert bool((out[:, 14:] == 1).all())


def test_exif_orientation_applied(tmp_path: Path) -> None:
    stored = _random_rgb(28, 42)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    path = tmp_path / "phone.png"
    stored.save(path, exif=exif.tobytes())
    out = load_images([path], image_size=42)  # displayed 42x28, no-op resize
    assert torch.equal(out[0], pil_to_tensor(stored.transpose(Image.Transpose.ROTATE_270)))


def test_grayscale_becomes_three_equal_channels() -> None:
    gray = Image.fromarray(np.arange(28 * 28, dtype=np.uint8).reshape(28, 28), "L")
    out = preprocess_image(gray, "crop", 28, 14)
    assert out.shape == (3, 28, 28)
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    assert torch.equal(out[0], torch.from_numpy(np.array(gray)).float() / 255)


@pytest.mark.parametrize("kind", ["png16", "tiff-float01", "tiff-float255", "tiff-int32"])
def test_grayscale_wider_than_8_bits_is_scaled_not_clipped(tmp_path: Path, kind: str) -> None:
    """16-bit PNGs and integer or float TIFFs read as the 8-bit image they encode (PIL's own
    conversion clips at 255: a 16-bit image came out nearly white, a float one in [0, 1]
    black)."""
    rng = np.random.default_rng(5)
    levels = rng.integers(0, 256, size=(28, 42)).astype(np.uint8)
    if kind == "png16":
        wide, name = levels.astype(np.uint16) * 257, "g.png"  # 0..255 -> 0..65535
    elif kind == "tiff-int32":
        wide, name = levels.astype(np.int32) * 257, "g.tif"
    elif kind == "tiff-float01":
        wide, name = levels.astype(np.float32) / 255, "g.tif"
    else:
        wide, name = levels.astype(np.float32), "g.tif"
    Image.fromarray(wide).save(tmp_path / name)
    Image.fromarray(levels).save(tmp_path / "g8.png")
    got = load_images([tmp_path / name], image_size=42)
    assert torch.equal(got, load_images([tmp_path / "g8.png"], image_size=42))
    assert torch.equal(got[0, 0], torch.from_numpy(levels).float() / 255)


def test_threads_keep_order_and_values(tmp_path: Path) -> None:
    paths = []
    for i in range(6):
        paths.append(tmp_path / f"{i}.png")
        _random_rgb(70, 56, seed=i).save(paths[-1])
    serial = load_images(paths, image_size=140, num_workers=1)
    threaded = load_images(paths, image_size=140, num_workers=4)
    assert torch.equal(serial, threaded)
    assert torch.equal(threaded[3], preprocess_image(Image.open(paths[3]), "crop", 140, 14))


def test_pil_images_accepted() -> None:
    image = _random_rgb(60, 40)
    assert torch.equal(load_images([image], image_size=56)[0], preprocess_image(image, "crop", 56))


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def test_loader_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        load_images([])
    with pytest.raises(ValueError, match="'crop' or 'pad'"):
        load_images([_random_rgb(28, 28)], mode="square")
    with pytest.raises(ValueError, match="multiple of patch_size"):
        load_images([_random_rgb(28, 28)], image_size=500)
    with pytest.raises(FileNotFoundError, match="missing.png"):
        load_images([tmp_path / "missing.png"])
    with pytest.raises(ValueError, match="too extreme"):
        preprocess_image(_random_rgb(2000, 10), "crop", 518)


def test_corrupt_and_truncated_images_named(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"this is not a png")
    with pytest.raises(ValueError, match=r"garbage\.png.*corrupt"):
        load_images([garbage])
    good = tmp_path / "good.png"
    _random_rgb(64, 64).save(good)
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:400])
    with pytest.raises(ValueError, match=r"truncated\.png"):
        load_images([good, truncated])


def test_one_path_is_one_frame_and_other_types_are_told(tmp_path: Path) -> None:
    path = tmp_path / "one.png"
    _random_rgb(60, 40).save(path)
    one = load_images(path, image_size=56)
    assert one.shape[0] == 1 and torch.equal(one, load_images([str(path)], image_size=56))
    assert torch.equal(load_images(str(path), image_size=56), one)
    with pytest.raises(TypeError, match="takes image paths .* got a Tensor; frames already in memory"):
        load_images(torch.rand(2, 3, 28, 28))
    with pytest.raises(TypeError, match="got a ndarray among them"):
        load_images([path, np.zeros((28, 28, 3))])


def test_an_image_too_large_to_open_is_named_with_what_to_do(tmp_path: Path, monkeypatch) -> None:
    """Past Pillow's decompression-bomb limit (twice MAX_IMAGE_PIXELS) an image is refused by
    name, from its header already, with a way out."""
    from PIL import Image

    from mapstream.io.images import oriented_size

    path = tmp_path / "huge.png"
    _random_rgb(60, 40).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 2400 pixels: over twice the limit
    for read in (lambda: oriented_size(path), lambda: load_images([path])):
        with pytest.raises(ValueError, match=r"huge\.png is too large to open.*Downscale it first"):
            read()


# --------------------------------------------------------------------------------------------
# list_images
# --------------------------------------------------------------------------------------------


def _touch(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).write_bytes(b"")


def test_list_images_natural_order_and_extensions(tmp_path: Path) -> None:
    _touch(tmp_path, "10.png", "2.png", "1.JPG", "3.jpeg", "11.PNG", "4.webp", "notes.txt",
           ".hidden.png", "frame_9.tif")
    (tmp_path / "sub.png").mkdir()  # a folder named like an image is not a file
    names = [p.name for p in list_images(tmp_path)]
    assert names == ["1.JPG", "2.png", "3.jpeg", "4.webp", "10.png", "11.PNG", "frame_9.tif"]
    only_png = list_images(tmp_path, extensions=("png",))  # dot optional, case-insensitive
    assert [p.name for p in only_png] == ["2.png", "10.png", "11.PNG"]


def test_list_images_stride_then_first_k(tmp_path: Path) -> None:
    _touch(tmp_path, *(f"{i}.png" for i in range(10)))
    assert [p.stem for p in list_images(tmp_path, stride=2, first_k=3)] == ["0", "2", "4"]
    assert [p.stem for p in list_images(tmp_path, stride=3)] == ["0", "3", "6", "9"]
    assert [p.stem for p in list_images(tmp_path, first_k=2)] == ["0", "1"]
    assert len(list_images(tmp_path, first_k=50)) == 10


def test_list_images_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        list_images(tmp_path / "nope")
    _touch(tmp_path, "a.txt")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        list_images(tmp_path / "a.txt")
    with pytest.raises(ValueError, match=r"no images in .*\.jpeg.*\.png"):
        list_images(tmp_path)
    with pytest.raises(ValueError, match="stride"):
        list_images(tmp_path, stride=0)
    with pytest.raises(ValueError, match="first_k"):
        list_images(tmp_path, first_k=0)


def test_list_images_real_data() -> None:
    folder = DATA / "courthouse"
    if not folder.is_dir():
        pytest.skip(f"{folder} not available")
    files = list_images(folder, stride=10, first_k=4)
    assert [p.name for p in files] == ["000000.png", "000010.png", "000020.png", "000030.png"]
