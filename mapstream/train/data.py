"""Training batches: procedural clips rendered in batches, and users' posed folders.

Both datasets yield the same dict per batch (all tensors on the dataset's device):

* ``images`` ``[B, S, 3, H, W]`` float32 in [0, 1];
* ``depth`` ``[B, S, H, W]`` float32 camera-space z in metres (0 where nothing is known);
* ``valid`` ``[B, S, H, W]`` bool (depth finite and positive);
* ``T_world_cam`` ``[B, S, 4, 4]`` float32 camera-to-world, OpenCV axes (x right, y down, z forward);
* ``K`` ``[B, S, 3, 3]`` float32 intrinsics in pixels of the ``H x W`` frame (pixel (u, v) is
  the integer index, as everywhere in mapstream);
* ``seed`` ``[B]`` int64: the procedural seed, or a folder clip's id.

The batch of ``step`` on ``rank`` holds the clips ``(step * world_size + rank) * B + b`` of
one global order, so ranks never share a clip, and the union of the ranks' batches at a step
is the batch one process with ``B * world_size`` clips sees. DataLoader workers take every
``num_workers``-th step, which the loader interleaves back into step order.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import IterableDataset, get_worker_info

from mapstream.config import DEFAULT_IMAGE_SIZE
from mapstream.eval.datasets import GroundTruthSequence, read_sequence
from mapstream.eval.depth_io import DEPTH_SUFFIXES
from mapstream.eval.input_geometry import InputGeometry, depth_in_model_frame
from mapstream.geometry import quat_to_mat
from mapstream.io.intrinsics import frame_intrinsics, read_colmap_cameras, transforms_camera
from mapstream.io.images import (
    natural_sort_key, open_image, oriented_size, preprocess_image, preprocess_pixel_map, preprocessed_height,
    resized_shape,
)
from mapstream.train.render import (
    SCENE_OBJECTS, check_frame_step, check_object_range, check_path_kinds, check_share, render_clips,
)
from mapstream.train.scene_prefetch import ScenePrefetch, sample_clips
from mapstream.validation import check_count

__all__ = [
    "SPLITS", "split_seed", "seed_split", "ProceduralClips", "FolderClips", "mirror_clips", "model_intrinsics",
    "read_colmap_sequence", "read_transforms_json", "read_posed_folder", "find_posed_folders",
]

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")
_PATCH = 14


def split_seed(split: str, index: int) -> int:
    """The ``index``-th seed of ``split``: ``index * 3 + k`` for the split's position ``k``, so
    two splits never share a seed however many clips each draws."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return int(index) * len(SPLITS) + SPLITS.index(split)


def seed_split(seed: int) -> str:
    """The split a seed belongs to (inverse of :func:`split_seed`)."""
    return SPLITS[int(seed) % len(SPLITS)]


class _Steps(IterableDataset):
    """Shared stepping: steps ``start_step .. start_step + num_batches`` (endless when None),
    split between DataLoader workers."""

    start_step: int
    num_batches: int | None

    def batch(self, step: int) -> dict[str, Tensor]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        step = self.start_step + worker
        while self.num_batches is None or step < self.start_step + self.num_batches:
            yield self.batch(step)
            step += workers

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError(f"{type(self).__name__} without num_batches is endless")
        return self.num_batches

    def close(self) -> None:
        """Release what the dataset holds beside its batches (nothing here)."""


def _check_rank(batch_size: int, rank: int, world_size: int) -> None:
    if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need batch_size >= 1 and 0 <= rank < world_size, got {batch_size}, {rank}, {world_size}")


class ProceduralClips(_Steps):
    """Procedural posed RGB-D clips (:func:`mapstream.train.render.sample_clip`), rendered on
    ``device`` by :func:`~mapstream.train.render.render_clips`, batch by batch.

    A batch depends only on its step and the arguments (bit for bit on one device with the
    same ``chunk_frames``), so a
    resumed run passes ``start_step`` and sees what it would have seen. Render on the GPU in
    the training process (``num_workers=0``): CUDA does not run in forked loader workers.

    Args:
        batch_size: clips per batch on this rank.
        num_frames: frames per clip.
        image_hw: ``(H, W)``, multiples of 14 (the patch size), or a sequence of such sizes:
            the batch of step ``k`` takes the ``(k mod n)``-th.
        split: ``"train"``, ``"val"`` or ``"test"`` (disjoint seeds, :func:`split_seed`).
        rank, world_size: this process's share (DDP).
        device: where the clips are rendered and returned.
        start_step: the first step yielded.
        num_batches: how many batches (None: endless).
        chunk_frames: see :func:`~mapstream.train.render.render_clips`.
        reuse_reversed: each rendered batch serves two steps, the second with every clip's
            frames in reverse order: for the causal model another clip (other scale frames,
            the motion run backwards) at no rendering cost. Step ``k`` then shows batch
            ``k // 2``'s seeds.
        reuse_mirrored: each rendered batch also serves a step mirrored left to right
            (:func:`mirror_clips`: the images flipped, the world mirrored with them, still
            rigid poses and a valid clip); with ``reuse_reversed`` a rendering serves four
            steps: as rendered, reversed, mirrored, mirrored and reversed.
        path_kinds: the camera paths drawn (:func:`~mapstream.train.render.sample_clip`).
        objects: the range of the scenes' object counts (:func:`~mapstream.train.render.sample_clip`).
        frame_step: every how many cameras of a path the clip's frames are taken
            (:func:`~mapstream.train.render.sample_clip`).
        synthetic_share: the share of clips drawn from :func:`mapstream.synthetic.render_sequence`'s
            family instead (:func:`~mapstream.train.render.synthetic_clip`).
        prefetch_scenes: draw the next rendering's scenes in a worker process while this one
            serves its steps (:class:`~mapstream.train.scene_prefetch.ScenePrefetch`; the
            batches are the same).
        more_frames: further clip lengths: rendering ``r`` takes the
            ``(r // len(sizes)) mod n``-th of ``(num_frames, *more_frames)``, so that with
            several sizes every pairing of length and size comes in turn.
        first_clip: the split's clip index the steps start from (step 0 draws clips
            ``first_clip ..``): a run going on from another's weights passes that run's
            :meth:`next_clip`, so that it sees new clips instead of the same ones again.
    """

    def __init__(
        self, batch_size: int = 4, num_frames: int = 8,
        image_hw: tuple[int, int] | Sequence[tuple[int, int]] = (294, 518), *,
        split: str = "train", rank: int = 0, world_size: int = 1, device: str | torch.device = "cpu",
        start_step: int = 0, num_batches: int | None = None, chunk_frames: int | None = None,
        reuse_reversed: bool = False, path_kinds: Sequence[str] | None = None, reuse_mirrored: bool = False,
        objects: tuple[int, int] = SCENE_OBJECTS, frame_step: int = 1, prefetch_scenes: bool = False,
        synthetic_share: float = 0.0, first_clip: int = 0, more_frames: Sequence[int] = (),
    ) -> None:
        _check_rank(batch_size, rank, world_size)
        split_seed(split, 0)
        check_count("first_clip", first_clip, least=0)
        self.first_clip = int(first_clip)
        sizes = [image_hw] if len(image_hw) == 2 and all(isinstance(s, (int, np.integer)) for s in image_hw) \
            else list(image_hw)
        for H, W in sizes:
            if H < _PATCH or W < _PATCH or H % _PATCH or W % _PATCH or num_frames < 1:
                raise ValueError(f"image_hw must be multiples of {_PATCH} and num_frames >= 1, got {image_hw}, {num_frames}")
        if not sizes:
            raise ValueError("image_hw: give at least one size")
        self.sizes = [(int(H), int(W)) for H, W in sizes]
        for count in more_frames:
            check_count("more_frames", count)
        self.frame_counts = [int(num_frames), *(int(n) for n in more_frames)]
        self.batch_size, self.num_frames, self.image_hw = batch_size, num_frames, self.sizes[0]
        self.split, self.rank, self.world_size = split, rank, world_size
        self.device, self.chunk_frames = torch.device(device), chunk_frames
        self.start_step, self.num_batches = start_step, num_batches
        self.reuse_reversed, self.path_kinds = reuse_reversed, check_path_kinds(path_kinds)
        self.reuse_mirrored, self.objects = reuse_mirrored, check_object_range(objects)
        self.frame_step, self.synthetic_share = check_frame_step(frame_step), check_share(synthetic_share)
        # (mirrored, reversed) of the steps that share one rendering, in the order they come.
        self._views = [(m, r) for m in (False, True)[: 1 + reuse_mirrored] for r in (False, True)[: 1 + reuse_reversed]]
        self._rendered: tuple[int, dict[str, Tensor]] | None = None  # (rendering, its batch)
        self._prefetch = ScenePrefetch() if prefetch_scenes else None

    def _rendering(self, step: int) -> int:
        return step // len(self._views)

    def seeds(self, step: int) -> list[int]:
        """The seeds of this rank's batch at ``step``."""
        return self._seeds(self._rendering(step))

    def _seeds(self, rendering: int) -> list[int]:
        first = self.first_clip + (rendering * self.world_size + self.rank) * self.batch_size
        return [split_seed(self.split, first + b) for b in range(self.batch_size)]

    def next_clip(self, steps: int) -> int:
        """The first clip index that steps ``0 .. steps - 1`` of every rank leave unseen."""
        renderings = -(-int(steps) // len(self._views))
        return self.first_clip + renderings * self.world_size * self.batch_size

    def batch(self, step: int) -> dict[str, Tensor]:
        """The batch of ``step``: its rendering as rendered, or reversed and/or mirrored
        (``reuse_reversed``, ``reuse_mirrored``)."""
        rendering = self._rendering(step)
        if self._rendered is None or self._rendered[0] != rendering:
            self._rendered = rendering, self._render(rendering)
        batch = self._rendered[1]
        mirrored, reversed_ = self._views[step % len(self._views)]
        if mirrored:
            batch = mirror_clips(batch)
        if reversed_:
            batch = {k: (v.flip(1) if k != "seed" else v) for k, v in batch.items()}
        return batch

    def frames_of(self, rendering: int) -> int:
        """The clip length of rendering ``rendering`` (the lengths in turn, each over every size)."""
        return self.frame_counts[(rendering // len(self.sizes)) % len(self.frame_counts)]

    def _spec_args(self, rendering: int) -> tuple | None:
        """Rendering ``rendering``'s arguments of :func:`sample_clips` (None past the end)."""
        if self.num_batches is not None and rendering * len(self._views) >= self.start_step + self.num_batches:
            return None
        return (self._seeds(rendering), self.frames_of(rendering), self.sizes[rendering % len(self.sizes)],
                self.path_kinds, self.objects, self.frame_step, self.synthetic_share)

    def close(self) -> None:
        """Stop the scene-prefetching worker, if any."""
        if self._prefetch is not None:
            self._prefetch.close()

    def _render(self, rendering: int) -> dict[str, Tensor]:
        seeds = self._seeds(rendering)
        hw = self.sizes[rendering % len(self.sizes)]
        specs = self._prefetch(rendering, self._spec_args) if self._prefetch is not None \
            else sample_clips(*self._spec_args(rendering))
        cams = np.stack([s.T_room_cam for s in specs])
        K = np.repeat(np.stack([s.K for s in specs])[:, None], self.frames_of(rendering), 1)
        images, depth = render_clips([s.scene for s in specs], cams, K, hw, self.device,
                                     chunk_frames=self.chunk_frames)
        as_dev = lambda a: torch.as_tensor(a, dtype=torch.float32, device=self.device)  # noqa: E731
        return {
            "images": images, "depth": depth, "valid": depth > 0,
            "T_world_cam": as_dev(np.stack([s.T_world_cam for s in specs])), "K": as_dev(K),
            "seed": torch.tensor(seeds, dtype=torch.int64, device=self.device),
        }


def mirror_clips(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The clips of ``batch`` seen in a mirror: every frame flipped left to right, and the
    world mirrored in its x axis with them, so that the clip stays a rigid, posed one.

    A camera-space point ``(x, y, z)`` at pixel ``u = fx x / z + s y / z + cx`` appears at
    ``W - 1 - u`` after the flip, which is the pixel of the point ``(-x, y, z)`` under ``fx``,
    skew ``-s`` and ``cx' = W - 1 - cx``. Mirroring every camera frame and the world alike
    (``M = diag(-1, 1, 1, 1)``) turns ``T_world_cam`` into ``M T M``: a rotation again
    (``det = 1``), with every relative rotation of the same angle and every distance kept,
    so the normalisation and the losses apply unchanged. Other keys pass through."""
    width = batch["images"].shape[-1]
    mirror = torch.diag(torch.tensor([-1.0, 1.0, 1.0, 1.0], dtype=batch["T_world_cam"].dtype,
                                     device=batch["T_world_cam"].device))
    K = batch["K"].clone()
    K[..., 0, 1] = -batch["K"][..., 0, 1]
    K[..., 0, 2] = (width - 1) - batch["K"][..., 0, 2]
    out = dict(batch)
    out.update(images=batch["images"].flip(-1), depth=batch["depth"].flip(-1), valid=batch["valid"].flip(-1),
               T_world_cam=mirror @ batch["T_world_cam"] @ mirror, K=K)
    return out


# ----------------------------------------------------------------------------- users' folders
def model_intrinsics(K: np.ndarray, K_hw: tuple[int, int], photo_hw: tuple[int, int], image_size: int,
                     frame_h: int | None = None) -> np.ndarray:
    """``K`` (pixels of a ``K_hw`` image) carried into the model's frame of a ``photo_hw`` photo.

    The photo is resized to :func:`mapstream.io.images.resized_shape` (crop mode), its rows
    centre-cropped to ``min(image_size, new_h)`` and then to ``frame_h``. A resized pixel's
    centre ``i + 0.5`` lies at ``(i + 0.5) / s`` of the source (PIL's rule), so with integer
    pixel indices ``c' = (c + 0.5) s - 0.5`` and ``f' = f s`` (``s = new / K_hw``, which also
    rescales a ``K`` given for another resolution of the photo), less the rows cropped.
    """
    new_w, new_h = resized_shape(photo_hw[1], photo_hw[0], "crop", image_size, _PATCH)
    own_h = min(image_size, new_h)
    frame_h = own_h if frame_h is None else frame_h
    if frame_h > own_h:
        raise ValueError(f"frame height {frame_h} exceeds the preprocessed height {own_h}")
    pixel_map = preprocess_pixel_map(photo_hw[1], photo_hw[0], "crop", image_size, _PATCH)
    pixel_map[1, 2] -= (own_h - frame_h) // 2
    to_photo = np.diag([photo_hw[1] / K_hw[1], photo_hw[0] / K_hw[0], 1.0])
    return frame_intrinsics(np.asarray(K, dtype=np.float64), pixel_map @ to_photo)


def _frame_files(folder: Path, stem: str, suffixes: Sequence[str]) -> Path | None:
    return next((folder / f"{stem}{s}" for s in suffixes if (folder / f"{stem}{s}").is_file()), None)


def read_colmap_sequence(path: str | Path) -> GroundTruthSequence:
    """A COLMAP text model as a posed sequence, frames in natural order of their names.

    Layout: ``path/images/<name>``, the model in ``path/sparse/0``, ``path/sparse`` or ``path``
    (``cameras.txt``, ``images.txt``; binary models: ``colmap model_converter --output_type TXT``),
    optional depth ``path/depth/<stem>.{exr,npy,png}`` (PNG in millimetres). COLMAP stores
    world-to-camera poses with scalar-first quaternions and puts pixel centres at +0.5; the
    camera axes are OpenCV's. Pinhole models, or radial/OpenCV ones with zero distortion.
    """
    root = Path(path)
    model = next((d for d in (root / "sparse" / "0", root / "sparse", root) if (d / "images.txt").is_file()), None)
    if model is None:
        raise FileNotFoundError(f"{root}: no COLMAP text model (sparse/0/images.txt)")
    cams = read_colmap_cameras(model / "cameras.txt")
    lines = [ln for ln in (model / "images.txt").read_text().splitlines() if not ln.startswith("#")]
    frames = []
    for line in lines[0::2]:  # each image's second line (its 2D points) may be empty
        tok = line.split()
        if len(tok) < 10:
            continue
        q = torch.tensor([float(x) for x in tok[2:5]] + [float(tok[1])], dtype=torch.float64)
        R, t = quat_to_mat(q).numpy(), np.array([float(x) for x in tok[5:8]])
        T = np.eye(4)
        T[:3, :3], T[:3, 3] = R.T, -R.T @ t
        frames.append((" ".join(tok[9:]), T, *cams[tok[8]]))
    if not frames:
        raise ValueError(f"{model / 'images.txt'}: no images")
    frames.sort(key=lambda f: natural_sort_key(f[0]))
    return _sequence(root, [f[0] for f in frames], [f[1] for f in frames], [f[2] for f in frames],
                     [f[3] for f in frames], root / "images", root / "depth")


def read_transforms_json(path: str | Path) -> GroundTruthSequence:
    """A nerfstudio / instant-ngp ``transforms.json`` as a posed sequence (frames in natural
    order of their file paths).

    ``transform_matrix`` is camera-to-world in OpenGL camera axes (``@ diag(1, -1, -1, 1)``
    gives OpenCV's); ``fl_x, fl_y, cx, cy, w, h`` per frame or at the top (``camera_angle_x``
    when there is no focal length; ``cx, cy`` default to the centre), pixel centres at +0.5;
    ``depth_file_path`` per frame is optional (PNG in millimetres). Paths without a suffix
    get ``.png`` / ``.jpg``.
    """
    file = Path(path)
    file = file / "transforms.json" if file.is_dir() else file
    meta = json.loads(file.read_text())
    names, poses, Ks, sizes, rgb, depth = [], [], [], [], {}, {}
    for frame in sorted(meta.get("frames", []), key=lambda f: natural_sort_key(str(f["file_path"]))):
        image = file.parent / frame["file_path"]
        image = image if image.is_file() else (_frame_files(image.parent, image.name, (".png", ".jpg")) or image)
        size = None if frame.get("w", meta.get("w")) is not None and frame.get("h", meta.get("h")) is not None \
            else oriented_size(image)
        K, hw = transforms_camera(meta, frame, size)
        names.append(Path(frame["file_path"]).stem)
        poses.append(np.asarray(frame["transform_matrix"], dtype=np.float64) @ np.diag([1.0, -1.0, -1.0, 1.0]))
        Ks.append(K)
        sizes.append(hw)
        rgb[names[-1]] = image
        if frame.get("depth_file_path"):
            depth[names[-1]] = file.parent / frame["depth_file_path"]
    if not names:
        raise ValueError(f"{file}: no frames")
    return _sequence(file.parent, names, poses, Ks, sizes, rgb, depth)


def _sequence(root: Path, names, poses, Ks, sizes, rgb, depth) -> GroundTruthSequence:
    """A GroundTruthSequence; ``rgb`` / ``depth`` are folders searched by stem, or dicts."""
    if len(set(sizes)) > 1:
        raise ValueError(f"{root}: frames of different sizes are not supported: {sorted(set(sizes))}")
    stems = [Path(n).stem for n in names]

    def find(where, stem, suffixes):
        return where.get(stem) if isinstance(where, dict) else _frame_files(where, stem, suffixes)

    rgb_paths = [rgb / n if not isinstance(rgb, dict) and (rgb / n).is_file() else find(rgb, s, (".png", ".jpg"))
                 for n, s in zip(names, stems)]
    return GroundTruthSequence(
        name=root.name, root=root, frame_names=stems, timestamps=np.full(len(names), np.nan),
        T_world_cam=np.stack(poses), K=np.stack(Ks), image_hw=sizes[0], rgb_paths=rgb_paths,
        depth_paths=[find(depth, s, DEPTH_SUFFIXES) for s in stems],
    )


def _posed_kind(p: Path) -> str | None:
    """Which format a folder holds, from its files alone."""
    if (p / "transforms.json").is_file() or (p.suffix == ".json" and p.is_file()):
        return "transforms"
    if any((d / "images.txt").is_file() for d in (p / "sparse" / "0", p / "sparse", p)):
        return "colmap"
    if (p / "groundtruth.txt").is_file() and (p / "rgb.txt").is_file():
        return "tum"
    if (p / "traj.txt").is_file() or (p / "gt" / "traj.txt").is_file():
        return "benchmark"
    return None


def read_posed_folder(path: str | Path, *, max_dt: float = 0.02, camera: str = "default") -> GroundTruthSequence:
    """One posed folder, whichever format: ``transforms.json``, a COLMAP text model, or what
    :func:`mapstream.eval.datasets.read_sequence` reads (TUM RGB-D, the benchmark layout;
    ``max_dt`` and ``camera`` are TUM's)."""
    p = Path(path)
    kind = _posed_kind(p)
    if kind == "transforms":
        return read_transforms_json(p)
    if kind == "colmap":
        return read_colmap_sequence(p)
    return read_sequence(p, max_dt=max_dt, camera=camera)


def find_posed_folders(root: str | Path) -> list[Path]:
    """``root`` if it is a posed folder, else its sub-folders that are (one level, sorted)."""
    root = Path(root)
    if _posed_kind(root) is not None:
        return [root]
    found = [p for p in sorted(root.iterdir()) if p.is_dir() and _posed_kind(p)] if root.is_dir() else []
    if not found:
        raise FileNotFoundError(f"{root}: no posed folder (TUM, benchmark, COLMAP text, transforms.json) in it or below")
    return found


class FolderClips(_Steps):
    """Clips of ``num_frames`` frames (every ``stride``-th) from users' posed folders.

    Frames go through the model's crop preprocessing (:func:`mapstream.io.images.preprocess_image`)
    at ``image_size``; folders whose frames come out taller are centre-cropped to the shortest
    folder's height so that clips stack. ``K`` follows (:func:`model_intrinsics`); depth takes
    the source pixel under each frame pixel's centre (nearest: no depth blended across an edge).
    Each epoch visits every clip once, in an order drawn from ``(seed, epoch)`` when
    ``shuffle``; a clip's ``seed`` entry is its index in :attr:`clips`.

    Args:
        folders: posed folders, or folders holding them (:func:`find_posed_folders`).
        batch_size, num_frames, image_size: clips per batch, frames per clip, model width.
        stride: frame step inside a clip; clip_step: frame step between clip starts (default:
            the clip's span, so clips do not overlap).
        shuffle, seed, rank, world_size, device, start_step: as :class:`ProceduralClips`.
        epochs: how many passes (None: endless).
        max_dt, camera: TUM's association tolerance and intrinsics.
    """

    def __init__(
        self, folders: str | Path | Sequence[str | Path], batch_size: int = 1, num_frames: int = 8,
        image_size: int = DEFAULT_IMAGE_SIZE, *, stride: int = 1, clip_step: int | None = None, shuffle: bool = True,
        seed: int = 0, rank: int = 0, world_size: int = 1, device: str | torch.device = "cpu",
        start_step: int = 0, epochs: int | None = None, max_dt: float = 0.02, camera: str = "default",
    ) -> None:
        _check_rank(batch_size, rank, world_size)
        if image_size < _PATCH or image_size % _PATCH or num_frames < 1 or stride < 1:
            raise ValueError(f"need image_size a multiple of {_PATCH}, num_frames >= 1, stride >= 1")
        folders = [folders] if isinstance(folders, (str, Path)) else list(folders)
        paths = [p for f in folders for p in find_posed_folders(f)]
        self.sequences = [read_posed_folder(p, max_dt=max_dt, camera=camera) for p in paths]
        for seq in self.sequences:
            if any(p is None for p in seq.rgb_paths):
                raise FileNotFoundError(f"{seq.root}: some frames have no image")
        self.photo_hw = [oriented_size(seq.rgb_paths[0])[::-1] for seq in self.sequences]
        height = min(preprocessed_height(w, h, "crop", image_size, _PATCH) for h, w in self.photo_hw)
        self.image_hw = (height, image_size)
        span = (num_frames - 1) * stride + 1
        step = clip_step or span
        self.clips = [(i, s) for i, seq in enumerate(self.sequences) for s in range(0, len(seq) - span + 1, step)]
        per_step = batch_size * world_size
        if len(self.clips) < per_step:
            raise ValueError(f"{len(self.clips)} clips of {num_frames} frames (stride {stride}) in {folders}: "
                             f"fewer than batch_size * world_size = {per_step}")
        self.steps_per_epoch = len(self.clips) // per_step
        self.batch_size, self.num_frames, self.image_size, self.stride = batch_size, num_frames, image_size, stride
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.device, self.start_step = torch.device(device), start_step
        self.num_batches = None if epochs is None else epochs * self.steps_per_epoch - start_step

    def clip_ids(self, step: int) -> list[int]:
        """Indices into :attr:`clips` of this rank's batch at ``step``."""
        epoch, k = divmod(step, self.steps_per_epoch)
        n = len(self.clips)
        order = np.random.default_rng((self.seed, epoch)).permutation(n) if self.shuffle else np.arange(n)
        first = (k * self.world_size + self.rank) * self.batch_size
        return [int(i) for i in order[first:first + self.batch_size]]

    def load_clip(self, clip_id: int) -> dict[str, Tensor]:
        """One clip's ``images``, ``depth``, ``valid``, ``T_world_cam``, ``K`` (no batch axis, on the CPU)."""
        i, start = self.clips[clip_id]
        seq, photo_hw = self.sequences[i], self.photo_hw[i]
        frames = [start + k * self.stride for k in range(self.num_frames)]
        H, W = self.image_hw
        images, depths = [], []
        for f in frames:
            img = preprocess_image(open_image(seq.rgb_paths[f]), "crop", self.image_size, _PATCH)
            top = (img.shape[1] - H) // 2
            images.append(img[:, top:top + H])
            if seq.depth_paths[f] is None:
                depths.append(np.zeros((H, W), np.float32))
            else:
                d = depth_in_model_frame(seq.load_depth(f), InputGeometry("crop", self.image_size), (H, W), photo_hw)
                depths.append(np.where(np.isfinite(d) & (d > 0), d, 0).astype(np.float32))
        depth = torch.from_numpy(np.stack(depths))
        K = model_intrinsics(seq.K[frames], seq.image_hw, photo_hw, self.image_size, H)
        return {
            "images": torch.stack(images), "depth": depth, "valid": depth > 0,
            "T_world_cam": torch.as_tensor(seq.T_world_cam[frames], dtype=torch.float32),
            "K": torch.as_tensor(K, dtype=torch.float32),
        }

    def batch(self, step: int) -> dict[str, Tensor]:
        """Load the batch of ``step``."""
        ids = self.clip_ids(step)
        clips = [self.load_clip(c) for c in ids]
        out = {k: torch.stack([c[k] for c in clips]).to(self.device) for k in clips[0]}
        out["seed"] = torch.tensor(ids, dtype=torch.int64, device=self.device)
        return out
