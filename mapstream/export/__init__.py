"""Output writers: a :class:`Reconstruction` to the formats people's next tools open.

    from mapstream.export import Reconstruction, export_all
    recon = Reconstruction(images=..., depth=..., depth_conf=..., T_world_cam=..., K=...,
                           pose_enc=..., names=..., keyframe=...)
    paths = export_all(recon, "out/")            # every format, layout in mapstream.export.bundle

Every writer takes the reconstruction and a path (file or folder) and writes atomically
(temp file in the same folder + ``os.replace``, :mod:`mapstream.io.atomic`).

Conventions, in one place:

* world frame: the reconstruction's own (the model's, i.e. the first camera's OpenCV frame),
  kept as is in predictions.npz, TUM, PLY, COLMAP and nerfstudio; the GLB maps it to glTF's
  y-up with ``diag(1, -1, -1)`` (:data:`mapstream.export.glb.OPENCV_TO_GLTF`);
* camera axes: OpenCV (x right, y down, z forward) everywhere except nerfstudio's
  ``transform_matrix`` (OpenGL: x right, y up, z back);
* poses: camera-to-world ``T_world_cam`` in npz, TUM, nerfstudio; world-to-camera in
  COLMAP's images.txt (and ``T_cam_world`` in npz);
* pixels: mapstream's (u, v) is the integer pixel index; COLMAP and nerfstudio put pixel
  centres at +0.5, so their principal point is ``K[:2, 2] + 0.5``;
* depth PNG: uint16 millimetres of the predicted scale, 0 = invalid.

PLY, GLB and the previews/figure need ``pip install 'mapstream[export]'`` (plyfile, trimesh,
matplotlib); they are imported only when used.
"""
from mapstream.export.bundle import ALL_FORMATS, check_formats, export_all
from mapstream.export.colmap import colmap_camera_params, write_colmap
from mapstream.export.depth import colorize_depth, depth_to_millimetres, write_depth_maps
from mapstream.export.frames import frame_file_names, write_frame_images, write_sky_masks
from mapstream.export.glb import OPENCV_TO_GLTF, write_glb
from mapstream.export.glb_style import GlbStyle
from mapstream.export.nerfstudio import nerfstudio_transforms, write_nerfstudio
from mapstream.export.points import (
    DEFAULT_CONF_THRESHOLD,
    CloudOptions,
    PointSet,
    build_point_cloud,
    valid_pixel_mask,
    voxel_downsample,
    write_ply,
)
from mapstream.export.reconstruction import NPZ_KEYS, Reconstruction
from mapstream.export.run_info import runtime_versions, to_jsonable, write_run_json
from mapstream.export.summary import summary_figure, write_summary_figure
from mapstream.export.trajectory import tum_rows, write_tum
from mapstream.io.atomic import (
    atomic_open,
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    prepare_dir,
    remove_stale_temp_files,
)

__all__ = [
    "ALL_FORMATS",
    "DEFAULT_CONF_THRESHOLD",
    "NPZ_KEYS",
    "OPENCV_TO_GLTF",
    "CloudOptions",
    "GlbStyle",
    "PointSet",
    "Reconstruction",
    "atomic_open",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "build_point_cloud",
    "check_formats",
    "colmap_camera_params",
    "colorize_depth",
    "depth_to_millimetres",
    "export_all",
    "frame_file_names",
    "nerfstudio_transforms",
    "prepare_dir",
    "remove_stale_temp_files",
    "runtime_versions",
    "summary_figure",
    "to_jsonable",
    "tum_rows",
    "valid_pixel_mask",
    "voxel_downsample",
    "write_colmap",
    "write_depth_maps",
    "write_frame_images",
    "write_glb",
    "write_nerfstudio",
    "write_ply",
    "write_run_json",
    "write_sky_masks",
    "write_summary_figure",
    "write_tum",
]
