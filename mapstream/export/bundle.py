"""``export_all``: every output of a run into one folder.

Layout of ``out_dir`` (format name -> files)::

    npz          predictions.npz
    tum          trajectory_tum.txt
    ply          points.ply
    glb          scene.glb
    depth        depth/<stem>.png, depth_preview/<stem>.png
    colmap       sparse/0/{cameras,images,points3D}.txt   + images/<stem>.png
    nerfstudio   transforms.json (+ masks/<stem>.png)     + images/<stem>.png
    summary      summary.png

``images/`` is shared by the COLMAP and nerfstudio outputs, so ``out_dir`` is directly a
Gaussian-splatting (``-s out_dir``) and nerfstudio (``--data out_dir``) dataset; nerfstudio's
``ply_file_path`` points at ``points.ply`` and each frame's ``depth_file_path`` at its depth PNG
when those are written. Each file is written atomically; ``predictions.npz`` goes first so the
most important output is complete soonest.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from mapstream.export.colmap import write_colmap
from mapstream.export.depth import write_depth_maps
from mapstream.export.frames import write_frame_images
from mapstream.export.glb import write_glb
from mapstream.export.glb_style import GlbStyle
from mapstream.export.nerfstudio import write_nerfstudio
from mapstream.export.points import DEFAULT_CONF_THRESHOLD, CloudOptions, PointSet, build_point_cloud, subsample, write_ply
from mapstream.export.reconstruction import Reconstruction
from mapstream.export.summary import write_summary_figure
from mapstream.export.trajectory import write_tum
from mapstream.io.atomic import prepare_dir
from mapstream.progress import progress_bar

logger = logging.getLogger(__name__)

__all__ = ["ALL_FORMATS", "check_formats", "export_all"]

ALL_FORMATS: tuple[str, ...] = ("npz", "tum", "ply", "glb", "depth", "images", "colmap", "nerfstudio", "summary")


def check_formats(formats: Iterable[str]) -> None:
    """Raise ValueError naming the format names that are not export formats, or for none."""
    formats = list(formats)
    if not formats:
        raise ValueError(f"no output format given; choose one or more of {list(ALL_FORMATS)}")
    unknown = sorted(set(formats) - set(ALL_FORMATS))
    if unknown:
        raise ValueError(f"unknown export formats {unknown}; choose from {list(ALL_FORMATS)}")


def export_all(
    recon: Reconstruction,
    out_dir: str | os.PathLike[str],
    *,
    formats: Iterable[str] = ALL_FORMATS,
    conf_threshold: float | None = DEFAULT_CONF_THRESHOLD,
    conf_percentile: float | None = None,
    mask_sky: bool = True,
    voxel_size: float | None = None,
    max_points: int | None = 2_000_000,
    colmap_max_points: int | None = 100_000,
    seed: int = 0,
    drop_black: bool = False,
    drop_white: bool = False,
    glb_style: GlbStyle = GlbStyle(),
    progress: bool | None = None,
) -> dict[str, Path]:
    """Write the requested ``formats`` (subset of :data:`ALL_FORMATS`) into ``out_dir``.

    Args:
        recon: the reconstruction.
        out_dir: output folder (created if needed).
        formats: which outputs to write (layout in the module docstring).
        conf_threshold, conf_percentile, mask_sky, voxel_size, max_points, seed, drop_black,
            drop_white: the point cloud of the PLY and GLB (see
            :class:`~mapstream.export.points.CloudOptions`).
        colmap_max_points: size of the COLMAP ``points3D.txt`` subsample (same filters, no
            voxel averaging; drawn from the PLY cloud when that one is not voxel averaged).
        glb_style: how ``scene.glb`` draws the points, cameras and trajectory (spheres,
            tubes, colour adjustments; :class:`~mapstream.export.glb_style.GlbStyle`).
        progress: a bar over the outputs being written (None: when stderr is a terminal).

    Returns:
        Format name -> path: a file, or the folder (``depth``, ``depth_preview``, ``images``,
        ``masks``, ``colmap`` = ``sparse/0``); ``nerfstudio`` is the transforms.json path.

    Raises:
        ValueError: an unknown format name.
        PermissionError: ``out_dir`` cannot be created or written.
    """
    wanted = list(dict.fromkeys(formats))
    check_formats(wanted)
    out = prepare_dir(out_dir)
    options = CloudOptions(
        conf_threshold=conf_threshold, conf_percentile=conf_percentile, mask_sky=mask_sky,
        voxel_size=voxel_size, max_points=max_points, seed=seed, drop_black=drop_black, drop_white=drop_white,
    )
    steps = _plan(recon, out, wanted, options, colmap_max_points, glb_style)
    written: dict[str, Path] = {}
    with progress_bar(len(steps), desc="export", unit="output", progress=progress) as bar:
        for name, write in steps:
            bar.set_postfix_str(name)
            began = time.perf_counter()
            result = write()
            if isinstance(result, dict):
                written.update(result)
            elif result is not None:
                written[name] = Path(result)
            logger.info("export %s: %.2f s", name, time.perf_counter() - began)
            bar.update(1)
    return written


def _plan(recon: Reconstruction, out: Path, wanted: list[str], options: CloudOptions,
          colmap_max_points: int | None, glb_style: GlbStyle) -> list[tuple[str, Callable[[], object]]]:
    """The export's steps in order, each (name, write): write returns a path, a dict of
    name -> path, or nothing. The point cloud is built once, by its own step, for PLY, GLB
    and the COLMAP points."""
    shared: dict[str, PointSet] = {}
    steps: list[tuple[str, Callable[[], object]]] = []
    if "npz" in wanted:
        steps.append(("npz", lambda: recon.save_npz(out / "predictions.npz")))
    if "tum" in wanted:
        steps.append(("tum", lambda: write_tum(recon, out / "trajectory_tum.txt")))
    if "ply" in wanted or "glb" in wanted:
        steps.append(("point cloud", lambda: shared.update(cloud=build_point_cloud(recon, options))))
    if "ply" in wanted:
        steps.append(("ply", lambda: write_ply(recon, out / "points.ply", points=shared["cloud"])))
    if "glb" in wanted:
        steps.append(("glb", lambda: write_glb(recon, out / "scene.glb", points=shared["cloud"], style=glb_style)))
    if "depth" in wanted:
        steps.append(("depth", lambda: write_depth_maps(recon, out, mask_sky=options.mask_sky)))
    if any(f in wanted for f in ("images", "colmap", "nerfstudio")):  # the frames as the model saw them
        steps.append(("images", lambda: {"images": _images(recon, out / "images")}))
    if "colmap" in wanted:
        steps.append(("colmap", lambda: {"colmap": _parent(_write_colmap(recon, out, options, colmap_max_points, shared))}))
    if "nerfstudio" in wanted:
        ply_name = "points.ply" if "ply" in wanted else None
        depth_dir = "depth" if "depth" in wanted else None
        steps.append(("nerfstudio", lambda: {
            "nerfstudio": write_nerfstudio(recon, out, write_images=False, ply_file_path=ply_name, depth_dir=depth_dir),
            **({"masks": out / "masks"} if recon.sky_mask is not None else {}),  # written with a sky mask
        }))
    if "summary" in wanted:
        steps.append(("summary", lambda: write_summary_figure(recon, out / "summary.png")))
    return steps


def _write_colmap(recon: Reconstruction, out: Path, options: CloudOptions, max_points: int | None,
                  shared: dict[str, PointSet]) -> dict[str, Path]:
    """COLMAP's text model with a subsample of the same filters (no voxel averaging): drawn
    from the PLY cloud when one was built and is not voxel averaged, else built here."""
    colmap_options = replace(options, voxel_size=None, max_points=max_points)
    cloud = shared.get("cloud")
    points = subsample(cloud, max_points, seed=options.seed) if cloud is not None and cloud.frame is not None else None
    return write_colmap(recon, out / "sparse" / "0", colmap_options, points=points)


def _images(recon: Reconstruction, folder: Path) -> Path:
    write_frame_images(recon, folder)
    return folder


def _parent(paths: dict[str, Path]) -> Path:
    return paths["cameras"].parent
