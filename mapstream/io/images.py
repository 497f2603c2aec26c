"""Image files -> model input tensors, bit-exact with the reference loader.

The reference is ``lingbot_map.utils.load_fn.load_and_preprocess_images`` (spec: APP.md 2.1).
Per image:

1. apply the EXIF orientation, composite RGBA over white, convert to RGB;
2. ``crop`` mode: width -> ``image_size``, height -> ``round(h * (image_size / w) / p) * p``;
   ``pad`` mode: the longer side -> ``image_size``, the other side scaled the same way;
3. resize with PIL BICUBIC, convert to float32 CHW in [0, 1] (``uint8 / 255``);
4. ``crop``: centre-crop the rows to ``image_size`` when taller;
   ``pad``: pad to ``image_size x image_size`` with white (1.0), ``floor(pad / 2)`` on top/left.

A batch whose images end up with different shapes is padded (white, centred the same way) to
the largest height and width, with a logged warning.

``round`` is Python's (ties to even) and the operation order ``h * (image_size / w)`` is the
reference's; ``h * image_size / w`` would round differently for some sizes (e.g. 106x159).
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps, UnidentifiedImageError

from mapstream.config import DEFAULT_IMAGE_SIZE

logger = logging.getLogger(__name__)

Mode = Literal["crop", "pad"]
ImageInput = Union[str, os.PathLike, Image.Image]

#: Extensions :func:`list_images` picks up (compared case-insensitively).
IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")


# --------------------------------------------------------------------------------------------
# Listing
# --------------------------------------------------------------------------------------------

def natural_sort_key(name: str) -> tuple[list, str]:
    """Sort key that orders digit runs by value: ``"2.png" < "10.png"``; case-insensitive."""
    parts = re.split(r"(\d+)", name)
    key = [int(p) if i % 2 else p.lower() for i, p in enumerate(parts)]
    return key, name  # raw name breaks ties ("010" vs "10", "A" vs "a") deterministically


def check_selection(stride: int, first_k: int | None) -> None:
    """ValueError for a frame selection that keeps nothing (every input kind shares it)."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if first_k is not None and first_k < 1:
        raise ValueError(f"first_k must be >= 1 or None, got {first_k}")


def list_images(
    folder: str | os.PathLike,
    *,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
    first_k: int | None = None,
    stride: int = 1,
) -> list[Path]:
    """The image files of ``folder`` in natural order, subsampled.

    Only the folder itself is searched (not sub-folders); hidden files (name starting with
    ``.``) are skipped, and so are links that lead to no file (a loop, a missing target),
    with a warning naming them.  ``extensions`` are matched case-insensitively, with or without the dot.

    Order of the limits: **stride first, then first_k** -- ``stride=2, first_k=3`` on
    ``0..9`` gives ``0, 2, 4``.  (The reference demo applies first_k before stride; with this
    order ``first_k`` is the number of frames you get.)

    Raises:
        FileNotFoundError: ``folder`` does not exist or is not a directory.
        ValueError: no file with one of ``extensions`` in it, or bad ``first_k``/``stride``.
    """
    check_selection(stride, first_k)
    root = Path(folder)
    if not root.exists():
        raise FileNotFoundError(f"image folder not found: {root}")
    if not root.is_dir():
        raise FileNotFoundError(f"not a folder: {root} (pass a folder of images)")
    exts = {e.lower() if e.startswith(".") else "." + e.lower() for e in extensions}
    named = [p for p in root.iterdir() if not p.name.startswith(".") and p.suffix.lower() in exts]
    files = [p for p in named if p.is_file()]
    dangling = sorted((p.name for p in named if p.is_symlink() and not p.exists()), key=natural_sort_key)
    if dangling:  # a link in a loop, or to nothing: no picture behind it
        shown = ", ".join(dangling[:3]) + (", ..." if len(dangling) > 3 else "")
        logger.warning(
            "%s: skipped %d image link%s that lead nowhere (a loop of links, or a missing target): %s",
            root, len(dangling), "" if len(dangling) == 1 else "s", shown,
        )
    if not files:
        raise ValueError(
            f"no images in {root}: looked for files ending in {', '.join(sorted(exts))} "
            "(case-insensitive); convert images of other types (or, in Python, pass extensions=... to list_images)"
        )
    files.sort(key=lambda p: natural_sort_key(p.name))
    files = files[::stride]
    return files[:first_k] if first_k is not None else files


# --------------------------------------------------------------------------------------------
# One image
# --------------------------------------------------------------------------------------------

def open_image(path: str | os.PathLike) -> Image.Image:
    """Open and fully decode an image file (pixels read now, file closed).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a readable image (names the file).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"image file not found: {p}")
    try:
        with Image.open(p) as im:
            im.load()
            # exif_transpose returns a new image even without an orientation tag; do it
            # here while the EXIF data is at hand, then the result no longer needs the file.
            return ImageOps.exif_transpose(im)
    except Image.DecompressionBombError as exc:
        raise _too_large(p, exc) from exc
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise _unreadable_image(p, exc) from exc


def _too_large(path: Path, exc: Exception) -> ValueError:
    return ValueError(
        f"image {path} is too large to open: {exc}. Downscale it first (the model reads frames "
        f"about {DEFAULT_IMAGE_SIZE} pixels wide), e.g. with an image editor or PIL's Image.reduce"
    )


def _unreadable_image(path: Path, exc: Exception) -> ValueError:
    return ValueError(
        f"cannot read image {path}: {exc}. The file is corrupt, truncated or not an image; "
        "re-export or delete it, or leave it out of the input list"
    )


def to_rgb(image: Image.Image) -> Image.Image:
    """EXIF orientation applied, RGBA composited over white, converted to RGB.

    Only mode ``RGBA`` is composited (as in the reference); other modes with transparency
    (``LA``, ``P`` with a transparent colour) go through a plain ``convert("RGB")``.
    Grayscale images of more than 8 bits (16-bit PNG/TIFF, 32-bit integer or float TIFF) are
    first scaled to 8 bits (`_wide_gray_to_8bit`): PIL's own conversion clips their values
    at 255, which turns a 16-bit image nearly white and a float one in [0, 1] black.
    """
    image = ImageOps.exif_transpose(image)
    if image.mode in _WIDE_GRAY_MODES:
        image = _wide_gray_to_8bit(image)
    if image.mode == "RGBA":
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image)
    return image.convert("RGB")


_WIDE_GRAY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def _wide_gray_to_8bit(image: Image.Image) -> Image.Image:
    """Mode "L" from a grayscale image of wider samples: integer samples are taken as 16-bit
    (0..65535, what PNG and TIFF store in these modes); float samples as [0, 1] when they all
    lie there, else as 0..255. NaN becomes 0; values outside the range are clipped."""
    values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0)
    if image.mode == "F":
        scale = 255.0 if values.size and values.max() <= 1.0 else 1.0
    else:
        scale = 255.0 / 65535.0
    return Image.fromarray(np.clip(np.rint(values * scale), 0, 255).astype(np.uint8))


def resized_shape(
    width: int, height: int, mode: Mode = "crop", image_size: int = DEFAULT_IMAGE_SIZE, patch_size: int = 14
) -> tuple[int, int]:
    """``(new_width, new_height)`` the image is resized to before cropping/padding."""
    if mode == "pad" and width < height:
        new_h = image_size
        new_w = round(width * (new_h / height) / patch_size) * patch_size
    else:
        new_w = image_size
        new_h = round(height * (new_w / width) / patch_size) * patch_size
    return new_w, new_h


def preprocessed_height(
    width: int, height: int, mode: Mode = "crop", image_size: int = DEFAULT_IMAGE_SIZE, patch_size: int = 14
) -> int:
    """Height of :func:`preprocess_image`'s output for a ``width x height`` image (after EXIF
    orientation); its width is always ``image_size``."""
    if mode == "pad":
        return image_size
    return min(image_size, resized_shape(width, height, mode, image_size, patch_size)[1])


def oriented_size(path: str | os.PathLike) -> tuple[int, int]:
    """``(width, height)`` of an image file as :func:`open_image` returns it (EXIF orientation
    applied), from its header: no pixel is decoded. Raises as :func:`open_image` does."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"image file not found: {p}")
    try:
        with Image.open(p) as im:
            width, height = im.size
            # Orientations 5-8 turn the image a quarter: exif_transpose swaps the sides.
            if im.getexif().get(0x0112, 1) in (5, 6, 7, 8):
                width, height = height, width
    except Image.DecompressionBombError as exc:
        raise _too_large(p, exc) from exc
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise _unreadable_image(p, exc) from exc
    return width, height


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image -> float32 ``[3, H, W]`` equal to ``uint8 / 255``."""
    array = np.array(image.convert("RGB"), dtype=np.uint8, copy=True)  # [H, W, 3]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous().to(torch.float32).div(255)


def pad_white(img: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Pad ``[3, h, w]`` to ``[3, height, width]`` with 1.0, ``floor(pad / 2)`` top/left."""
    dh, dw = height - img.shape[1], width - img.shape[2]
    if dh <= 0 and dw <= 0:
        return img
    top, left = dh // 2, dw // 2
    return F.pad(img, (left, dw - left, top, dh - top), mode="constant", value=1.0)


def check_preprocess_args(mode: str, image_size: int, patch_size: int) -> None:
    """ValueError unless `mode` is crop/pad and `image_size` a positive multiple of `patch_size`."""
    if mode not in ("crop", "pad"):
        raise ValueError(f"mode must be 'crop' or 'pad', got {mode!r}")
    if patch_size < 1 or image_size < patch_size or image_size % patch_size:
        raise ValueError(
            f"image_size ({image_size}) must be a positive multiple of patch_size ({patch_size}), "
            f"e.g. {DEFAULT_IMAGE_SIZE} for patch 14"
        )


def preprocess_pixel_map(
    width: int, height: int, mode: Mode = "crop", image_size: int = DEFAULT_IMAGE_SIZE, patch_size: int = 14
) -> np.ndarray:
    """[3, 3] map from a ``width x height`` image's continuous pixel coordinates (pixel centres
    at +0.5) to those of :func:`preprocess_image`'s output: the resize's scale, then the crop's
    or the padding's shift."""
    new_w, new_h = resized_shape(width, height, mode, image_size, patch_size)
    shift_x = shift_y = 0.0
    if mode == "crop" and new_h > image_size:
        shift_y = -float((new_h - image_size) // 2)
    if mode == "pad":
        shift_x, shift_y = float((image_size - new_w) // 2), float((image_size - new_h) // 2)
    return np.array([[new_w / width, 0.0, shift_x], [0.0, new_h / height, shift_y], [0.0, 0.0, 1.0]])


def preprocess_image(
    image: Image.Image, mode: Mode = "crop", image_size: int = DEFAULT_IMAGE_SIZE, patch_size: int = 14
) -> torch.Tensor:
    """One decoded image -> model input ``[3, H, W]`` float32 in [0, 1].

    ``crop``: ``W = image_size``, ``H = min(image_size, round(h*(image_size/w)/p)*p)``.
    ``pad``: ``H = W = image_size``.  Identical to one image of :func:`load_images`
    (before any batch padding), so video and webcam frames use it directly.
    """
    check_preprocess_args(mode, image_size, patch_size)
    image = to_rgb(image)
    width, height = image.size
    new_w, new_h = resized_shape(width, height, mode, image_size, patch_size)
    if new_w < patch_size or new_h < patch_size:
        raise ValueError(
            f"image of {width}x{height} would be resized to {new_w}x{new_h}, smaller than one "
            f"{patch_size}px patch: its aspect ratio is too extreme; crop it first"
        )
    img = pil_to_tensor(image.resize((new_w, new_h), Image.Resampling.BICUBIC))
    if mode == "crop" and new_h > image_size:
        top = (new_h - image_size) // 2
        img = img[:, top : top + image_size, :]
    if mode == "pad":
        img = pad_white(img, image_size, image_size)
    return img


# --------------------------------------------------------------------------------------------
# A batch
# --------------------------------------------------------------------------------------------

def pad_to_common_shape(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack ``[3, h_i, w_i]`` images into ``[N, 3, max h, max w]``, padding with white (1.0).

    Padding is centred (``floor(pad / 2)`` on top/left); a warning is logged when the shapes
    differ.
    """
    shapes = sorted({(int(t.shape[1]), int(t.shape[2])) for t in images})
    if len(shapes) > 1:
        height = max(h for h, _ in shapes)
        width = max(w for _, w in shapes)
        logger.warning(
            "images have different shapes %s (H, W); padding all with white to %dx%d",
            shapes, height, width,
        )
        images = [pad_white(t, height, width) for t in images]
    return torch.stack(list(images))


def load_images(
    paths: Sequence[ImageInput],
    mode: Mode = "crop",
    image_size: int = DEFAULT_IMAGE_SIZE,
    patch_size: int = 14,
    num_workers: int | None = None,
) -> torch.Tensor:
    """Load and preprocess images exactly like the reference loader.

    Args:
        paths: image files (or already opened PIL images), in sequence order; a single path
            or image is one frame.
        mode: ``"crop"`` (width = image_size, centre-crop taller images) or ``"pad"``
            (longer side = image_size, pad to a white square).
        image_size: target width (crop) / square side (pad); a multiple of ``patch_size``.
        patch_size: the other side is rounded to a multiple of this.
        num_workers: decoding threads (default ``min(8, N)``); the order is kept.

    Returns:
        ``[N, 3, H, W]`` float32 in [0, 1] (every value is ``k / 255``).

    Raises:
        ValueError: empty ``paths``, bad arguments, or an unreadable image (names the file).
        FileNotFoundError: a path does not exist.
    """
    if isinstance(paths, (str, os.PathLike, Image.Image)):
        paths = [paths]  # one image
    elif isinstance(paths, (torch.Tensor, np.ndarray)):
        raise TypeError(
            f"load_images takes image paths (or PIL images), got a {type(paths).__name__}; "
            "frames already in memory go to the model as they are ([N, 3, H, W] in [0, 1])"
        )
    if len(paths) == 0:
        raise ValueError("load_images needs at least one image path")
    check_preprocess_args(mode, image_size, patch_size)

    for item in paths:
        if not isinstance(item, (str, os.PathLike, Image.Image)):
            raise TypeError(f"load_images takes image paths or PIL images, got a {type(item).__name__} among them")

    def one(item: ImageInput) -> torch.Tensor:
        image = item if isinstance(item, Image.Image) else open_image(item)
        return preprocess_image(image, mode, image_size, patch_size)

    workers = num_workers or min(8, len(paths))
    if workers <= 1:
        tensors = [one(p) for p in paths]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            tensors = list(pool.map(one, paths))
    return pad_to_common_shape(tensors)
