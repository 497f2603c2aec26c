"""Ground-truth readers: TUM RGB-D and the authors' benchmark layout (and its writer).

Benchmark layout (one scene; the folder may also be a scene folder holding it as ``gt/``)::

    traj.txt         one frame per line: timestamp r00 r01 r02 tx r10 r11 r12 ty r20 r21 r22 tz
                     (3x4 camera-to-world T_world_cam, row-major, OpenCV axes, metres)
    intrinsics.txt   optional header line, then: timestamp fx fy cx cy width height
    rgb/<ts>.png     HxWx3 uint8 (optional)
    depth/<ts>.exr   HxW float32 metres, 0 = invalid (.npy / 16-bit-mm .png also accepted)
    points.ply       optional ground-truth cloud

``<ts>`` is the canonical timestamp string ``f"{ts:016.6f}"`` (:func:`canonical_timestamp`),
which is also the frame's name.

TUM RGB-D (one sequence folder): ``rgb.txt`` / ``depth.txt`` (``timestamp path`` lines),
``groundtruth.txt`` (``timestamp tx ty tz qx qy qz qw``, camera-to-world of the colour camera's
optical centre), depth PNGs at 5000 units per metre. Each RGB frame takes the nearest pose and
the nearest depth map within ``max_dt`` (0.02 s); frames without a pose are dropped. The frame
name is the RGB file's stem (its timestamp).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from mapstream.io.atomic import atomic_path, atomic_write_text
from mapstream.eval.depth_io import DEPTH_SUFFIXES, exr_available, read_depth, write_depth
from mapstream.geometry.align import as_float64, as_pose4

__all__ = [
    "GroundTruthSequence",
    "TUM_INTRINSICS",
    "canonical_timestamp",
    "read_traj_txt",
    "write_traj_txt",
    "read_intrinsics_txt",
    "write_intrinsics_txt",
    "read_tum_sequence",
    "read_benchmark_scene",
    "write_benchmark_scene",
    "read_sequence",
    "find_scenes",
]

log = logging.getLogger(__name__)

TUM_INTRINSICS: dict[str, tuple[float, float, float, float]] = {
    # (fx, fy, cx, cy) at 640x480; "default" is the ROS default the TUM depth maps are registered to.
    "default": (525.0, 525.0, 319.5, 239.5),
    "freiburg1": (517.3, 516.5, 318.6, 255.3),
    "freiburg2": (520.9, 521.0, 325.1, 249.7),
    "freiburg3": (535.4, 539.2, 320.1, 247.6),
}
TUM_DEPTH_SCALE = 5000.0


def canonical_timestamp(ts: float) -> str:
    """The benchmark's frame name for a timestamp in seconds: ``f"{ts:016.6f}"``."""
    return f"{float(ts):016.6f}"


@dataclass
class GroundTruthSequence:
    """A posed sequence with optional RGB and depth.

    Attributes:
        name: sequence name (folder name).
        root: the folder it was read from.
        frame_names: ``[N]`` frame ids (RGB file stems; canonical timestamps in the benchmark).
        timestamps: ``[N]`` float64 seconds (NaN when unknown).
        T_world_cam: ``[N, 4, 4]`` float64 camera-to-world, OpenCV axes, metres.
        K: ``[N, 3, 3]`` float64 intrinsics in pixels of ``image_hw``.
        image_hw: ``(H, W)``.
        rgb_paths, depth_paths: ``[N]`` files (``None`` where missing).
        depth_png_scale: raw PNG depth units per metre.
        points_path: ground-truth cloud (``points.ply``) if any.
    """

    name: str
    root: Path
    frame_names: list[str]
    timestamps: np.ndarray
    T_world_cam: np.ndarray
    K: np.ndarray
    image_hw: tuple[int, int]
    rgb_paths: list[Path | None] = field(repr=False)
    depth_paths: list[Path | None] = field(repr=False)
    depth_png_scale: float = 1000.0
    points_path: Path | None = None

    def __len__(self) -> int:
        return len(self.frame_names)

    @property
    def has_depth(self) -> bool:
        return len(self) > 0 and all(p is not None for p in self.depth_paths)

    def load_depth(self, i: int) -> np.ndarray:
        """Depth of frame ``i``: ``[H, W]`` float32 metres, 0 = invalid."""
        path = self.depth_paths[i]
        if path is None:
            raise FileNotFoundError(f"{self.name}: frame {self.frame_names[i]} has no depth map")
        return read_depth(path, png_scale=self.depth_png_scale)

    def load_rgb(self, i: int) -> np.ndarray:
        """RGB of frame ``i``: ``[H, W, 3]`` uint8."""
        path = self.rgb_paths[i]
        if path is None:
            raise FileNotFoundError(f"{self.name}: frame {self.frame_names[i]} has no RGB image")
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))

    def load_points(self) -> np.ndarray:
        """The ground-truth cloud ``[M, 3]`` float64 from ``points.ply`` (needs ``plyfile``)."""
        if self.points_path is None:
            raise FileNotFoundError(f"{self.name}: no points.ply")
        from plyfile import PlyData

        v = PlyData.read(str(self.points_path))["vertex"]
        return np.stack([np.asarray(v[c], dtype=np.float64) for c in ("x", "y", "z")], axis=1)

    def subset(self, indices: Sequence[int]) -> "GroundTruthSequence":
        """The frames ``indices`` (in that order)."""
        idx = np.asarray(indices, dtype=np.int64)
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return replace(
            self,
            frame_names=pick(self.frame_names),
            timestamps=self.timestamps[idx],
            T_world_cam=self.T_world_cam[idx],
            K=self.K[idx],
            rgb_paths=pick(self.rgb_paths),
            depth_paths=pick(self.depth_paths),
        )


# ----------------------------------------------------------------------------- text files
def _numeric_rows(path: Path, ncols: int) -> np.ndarray:
    """Rows of ``ncols`` numbers; comment (#), blank and header (non-numeric) lines are skipped."""
    if not path.is_file():
        raise FileNotFoundError(f"not found: {path}")
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        tokens = line.replace(",", " ").split()
        if not tokens or tokens[0].startswith("#"):
            continue
        try:
            values = [float(t) for t in tokens]
        except ValueError:
            if rows:
                raise ValueError(f"{path}:{lineno}: non-numeric line {line!r}") from None
            continue  # header
        if len(values) != ncols:
            raise ValueError(f"{path}:{lineno}: expected {ncols} values, got {len(values)}")
        rows.append(values)
    return np.asarray(rows, dtype=np.float64).reshape(-1, ncols)


def read_traj_txt(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read a benchmark ``traj.txt``: ``(timestamps [N], T_world_cam [N, 4, 4])`` float64."""
    rows = _numeric_rows(Path(path), 13)
    return rows[:, 0], as_pose4(rows[:, 1:].reshape(-1, 3, 4))


def write_traj_txt(path: str | Path, timestamps: np.ndarray, T_world_cam: np.ndarray) -> None:
    """Write a benchmark ``traj.txt`` (timestamp + row-major 3x4 camera-to-world per line)."""
    T = as_pose4(T_world_cam, "T_world_cam")
    ts = as_float64(timestamps, "timestamps")
    if T.ndim != 3 or len(ts) != len(T):
        raise ValueError("timestamps [N] and T_world_cam [N, 3|4, 4] must have the same N")
    lines = [
        canonical_timestamp(t) + " " + " ".join(f"{v:.12g}" for v in M[:3].reshape(-1))
        for t, M in zip(ts, T)
    ]
    atomic_write_text(path, "\n".join(lines) + "\n")


def read_intrinsics_txt(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read a benchmark ``intrinsics.txt``: ``(timestamps [N], K [N, 3, 3], hw [N, 2] int)``."""
    rows = _numeric_rows(Path(path), 7)
    K = np.zeros((len(rows), 3, 3))
    K[:, 0, 0], K[:, 1, 1], K[:, 0, 2], K[:, 1, 2] = rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 4]
    K[:, 2, 2] = 1.0
    hw = np.stack((rows[:, 6], rows[:, 5]), axis=1).astype(np.int64)
    return rows[:, 0], K, hw


def write_intrinsics_txt(path: str | Path, timestamps: np.ndarray, K: np.ndarray, image_hw: tuple[int, int]) -> None:
    """Write a benchmark ``intrinsics.txt`` (header + ``ts fx fy cx cy width height`` per line)."""
    K = as_float64(K, "K")
    ts = as_float64(timestamps, "timestamps")
    H, W = image_hw
    lines = ["# timestamp fx fy cx cy width height"]
    lines += [
        f"{canonical_timestamp(t)} {k[0, 0]:.12g} {k[1, 1]:.12g} {k[0, 2]:.12g} {k[1, 2]:.12g} {W} {H}"
        for t, k in zip(ts, K)
    ]
    atomic_write_text(path, "\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- TUM RGB-D
def _tum_list(path: Path) -> tuple[np.ndarray, list[str]]:
    stamps, files = [], []
    for line in path.read_text().splitlines():
        tokens = line.split()
        if len(tokens) < 2 or tokens[0].startswith("#"):
            continue
        stamps.append(float(tokens[0]))
        files.append(tokens[1])
    return np.asarray(stamps), files


def nearest_timestamps(query: np.ndarray, stamps: np.ndarray, max_dt: float) -> np.ndarray:
    """Index of the nearest ``stamps`` entry for each query, -1 when farther than ``max_dt``."""
    if len(stamps) == 0:
        return np.full(len(query), -1)
    order = np.argsort(stamps)
    s = stamps[order]
    hi = np.clip(np.searchsorted(s, query), 0, len(s) - 1)
    lo = np.clip(hi - 1, 0, len(s) - 1)
    pick = order[np.where(np.abs(query - s[lo]) <= np.abs(s[hi] - query), lo, hi)]
    return np.where(np.abs(stamps[pick] - query) <= max_dt, pick, -1)


def read_tum_sequence(root: str | Path, *, max_dt: float = 0.02, camera: str = "default") -> GroundTruthSequence:
    """Read a TUM RGB-D sequence folder (see the module docstring).

    Args:
        root: folder with ``rgb.txt``, ``groundtruth.txt`` and (optionally) ``depth.txt``.
        max_dt: association tolerance in seconds.
        camera: intrinsics: ``"default"`` (fx = fy = 525, cx = 319.5, cy = 239.5),
            ``"freiburg1"``, ``"freiburg2"``, ``"freiburg3"``, or ``"auto"`` (from the folder
            name, e.g. ``rgbd_dataset_freiburg1_desk``; default when none matches).
    """
    root = Path(root)
    if camera == "auto":
        m = re.search(r"freiburg([123])", root.name)
        camera = f"freiburg{m.group(1)}" if m else "default"
    if camera not in TUM_INTRINSICS:
        raise ValueError(f"camera must be one of {sorted(TUM_INTRINSICS)} or 'auto', got {camera!r}")
    rgb_ts, rgb_files = _tum_list(root / "rgb.txt")
    gt = _numeric_rows(root / "groundtruth.txt", 8)
    depth_ts, depth_files = _tum_list(root / "depth.txt") if (root / "depth.txt").is_file() else (np.zeros(0), [])
    pose_idx = nearest_timestamps(rgb_ts, gt[:, 0], max_dt)
    depth_idx = nearest_timestamps(rgb_ts, depth_ts, max_dt)
    keep = np.flatnonzero(pose_idx >= 0)
    if len(keep) == 0:
        raise ValueError(f"{root}: no RGB frame has a ground-truth pose within {max_dt} s")
    if len(keep) < len(rgb_ts):
        log.info("%s: %d of %d RGB frames have a pose within %g s", root.name, len(keep), len(rgb_ts), max_dt)
    from scipy.spatial.transform import Rotation

    g = gt[pose_idx[keep]]
    T = np.tile(np.eye(4), (len(keep), 1, 1))
    T[:, :3, :3] = Rotation.from_quat(g[:, 4:8]).as_matrix()  # scipy: (x, y, z, w)
    T[:, :3, 3] = g[:, 1:4]
    fx, fy, cx, cy = TUM_INTRINSICS[camera]
    K = np.tile(np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1.0]]), (len(keep), 1, 1))
    return GroundTruthSequence(
        name=root.name,
        root=root,
        frame_names=[Path(rgb_files[i]).stem for i in keep],
        timestamps=rgb_ts[keep],
        T_world_cam=T,
        K=K,
        image_hw=(480, 640),
        rgb_paths=[root / rgb_files[i] for i in keep],
        depth_paths=[root / depth_files[depth_idx[i]] if depth_idx[i] >= 0 else None for i in keep],
        depth_png_scale=TUM_DEPTH_SCALE,
    )


# ----------------------------------------------------------------------------- benchmark layout
def _benchmark_dir(path: Path) -> Path:
    if (path / "traj.txt").is_file():
        return path
    if (path / "gt" / "traj.txt").is_file():
        return path / "gt"
    raise FileNotFoundError(f"{path}: no traj.txt (nor gt/traj.txt): not a benchmark scene")


def _find_file(folder: Path, stem: str, suffixes: Sequence[str]) -> Path | None:
    for suffix in suffixes:
        p = folder / f"{stem}{suffix}"
        if p.is_file():
            return p
    return None


def read_benchmark_scene(path: str | Path) -> GroundTruthSequence:
    """Read one scene of the authors' benchmark layout (see the module docstring).

    Args:
        path: the folder holding ``traj.txt``, or a scene folder holding ``gt/traj.txt``.
    """
    path = Path(path)
    d = _benchmark_dir(path)
    ts, T = read_traj_txt(d / "traj.txt")
    if len(ts) == 0:
        raise ValueError(f"{d / 'traj.txt'}: empty trajectory")
    names = [canonical_timestamp(t) for t in ts]
    ki_ts, K_all, hw_all = read_intrinsics_txt(d / "intrinsics.txt")
    if len(K_all) == 1:
        K, hw = np.repeat(K_all, len(ts), 0), np.repeat(hw_all, len(ts), 0)
    else:
        lookup = {canonical_timestamp(t): i for i, t in enumerate(ki_ts)}
        missing = [n for n in names if n not in lookup]
        if missing:
            raise ValueError(f"{d / 'intrinsics.txt'}: no intrinsics for {len(missing)} frames, e.g. {missing[0]}")
        sel = [lookup[n] for n in names]
        K, hw = K_all[sel], hw_all[sel]
    if (hw != hw[0]).any():
        raise ValueError(f"{d}: frames of different sizes are not supported")
    name = d.parent.name if d.name == "gt" else d.name
    return GroundTruthSequence(
        name=name,
        root=d,
        frame_names=names,
        timestamps=ts,
        T_world_cam=T,
        K=K,
        image_hw=(int(hw[0, 0]), int(hw[0, 1])),
        rgb_paths=[_find_file(d / "rgb", n, (".png", ".jpg")) for n in names],
        depth_paths=[_find_file(d / "depth", n, DEPTH_SUFFIXES) for n in names],
        points_path=(d / "points.ply") if (d / "points.ply").is_file() else None,
    )


def write_benchmark_scene(
    out_dir: str | Path,
    timestamps: np.ndarray,
    T_world_cam: np.ndarray,
    K: np.ndarray,
    image_hw: tuple[int, int],
    *,
    rgb: np.ndarray | None = None,
    depth: np.ndarray | None = None,
    depth_format: str = "auto",
) -> Path:
    """Write a scene in the benchmark layout (the inverse of :func:`read_benchmark_scene`).

    Args:
        out_dir: destination folder (created); receives ``traj.txt``, ``intrinsics.txt``,
            ``rgb/`` and ``depth/``.
        timestamps: ``[N]`` seconds (distinct after :func:`canonical_timestamp`).
        T_world_cam: ``[N, 3|4, 4]`` camera-to-world poses.
        K: ``[N, 3, 3]`` (or one ``[3, 3]`` for all frames) intrinsics in pixels.
        image_hw: ``(H, W)``.
        rgb: optional ``[N, H, W, 3]`` uint8.
        depth: optional ``[N, H, W]`` metres (0 = invalid).
        depth_format: ``"exr"``, ``"npy"``, ``"png"`` (16-bit mm) or ``"auto"`` (EXR when the
            OpenEXR bindings or PyAV are installed, else npy).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ts = as_float64(timestamps, "timestamps")
    names = [canonical_timestamp(t) for t in ts]
    if len(set(names)) != len(names):
        raise ValueError("timestamps must be distinct at microsecond resolution")
    K = as_float64(K, "K")
    if K.shape == (3, 3):
        K = np.repeat(K[None], len(ts), 0)
    write_traj_txt(out / "traj.txt", ts, T_world_cam)
    write_intrinsics_txt(out / "intrinsics.txt", ts, K, image_hw)
    if rgb is not None:
        for n, im in zip(names, np.asarray(rgb)):
            with atomic_path(out / "rgb" / f"{n}.png") as tmp:
                Image.fromarray(np.asarray(im, dtype=np.uint8)).save(tmp)
    if depth is not None:
        if depth_format == "auto":
            depth_format = "exr" if exr_available() else "npy"
        if depth_format not in ("exr", "npy", "png"):
            raise ValueError(f"depth_format must be exr, npy, png or auto, got {depth_format!r}")
        for n, d in zip(names, np.asarray(depth)):
            write_depth(out / "depth" / f"{n}.{depth_format}", d)
    return out


# ----------------------------------------------------------------------------- dispatch
def _kind(path: Path) -> str | None:
    if (path / "groundtruth.txt").is_file() and (path / "rgb.txt").is_file():
        return "tum"
    if (path / "traj.txt").is_file() or (path / "gt" / "traj.txt").is_file():
        return "benchmark"
    return None


def read_sequence(path: str | Path, *, max_dt: float = 0.02, camera: str = "default") -> GroundTruthSequence:
    """Read a TUM RGB-D sequence or a benchmark scene, whichever ``path`` is.

    ``max_dt`` and ``camera`` apply to TUM sequences (see :func:`read_tum_sequence`).
    """
    path = Path(path)
    kind = _kind(path)
    if kind == "tum":
        return read_tum_sequence(path, max_dt=max_dt, camera=camera)
    if kind == "benchmark":
        return read_benchmark_scene(path)
    raise FileNotFoundError(
        f"{path}: not a sequence (expected TUM's rgb.txt + groundtruth.txt, or the benchmark's traj.txt)"
    )


def find_scenes(root: str | Path) -> dict[str, Path]:
    """Sequences under ``root``: ``{name: folder}``.

    ``root`` itself if it is a sequence, else its sub-folders that are (one level down, sorted).
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"ground truth not found: {root}")
    if _kind(root) is not None:
        return {root.name if root.name != "gt" else root.parent.name: root}
    scenes = {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and _kind(p) is not None}
    if not scenes:
        raise FileNotFoundError(f"{root}: no sequence found (neither it nor its sub-folders)")
    return scenes
