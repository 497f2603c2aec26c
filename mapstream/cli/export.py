"""`mapstream export RUN_DIR`: write a run's outputs again from its predictions.npz, with other
point-cloud settings or formats, without running the model again."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..export import ALL_FORMATS
from ._flags import as_flags
from ._frames import frame_slice, select_frames
from .view import RunDir


@dataclass
class Export:
    """Write a run's outputs (PLY, GLB, COLMAP, ...) again from its predictions.npz: other thresholds or formats, no inference."""

    run_dir: RunDir
    """Run folder holding predictions.npz (or the path of a predictions .npz file)."""
    out: Optional[Path] = None
    """Folder to write into (default: the run folder, whose outputs are replaced atomically)."""
    frames: Optional[str] = None
    """Only these frames, as START:STOP[:STEP] (e.g. 0:100, 50:, ::2; numbered from 0)."""
    formats: Optional[tuple[str, ...]] = None
    """Outputs to write (default: all; all but predictions.npz when writing into the run folder itself)."""
    conf_threshold: float = 1.5
    """Point cloud: keep pixels whose depth confidence is above this (confidence is > 1)."""
    conf_percentile: Optional[float] = None
    """Point cloud: also keep only pixels whose confidence reaches this percentile (0-100) of the run's."""
    voxel_size: Optional[float] = None
    """Point cloud: average the points on a grid of this edge, in world units (None: no grid)."""
    max_points: Optional[int] = 2_000_000
    """Point cloud: most points (seeded uniform subsample beyond; None: no cap)."""
    mask_sky: bool = True
    """Point cloud: leave out sky pixels when the run has a sky mask."""
    drop_black_background: bool = False
    """Point cloud: leave out near-black pixels (R+G+B < 16), e.g. a black backdrop."""
    drop_white_background: bool = False
    """Point cloud: leave out near-white pixels (all channels > 240), e.g. a white backdrop."""
    quiet: bool = False
    """No progress bar."""

    def main(self) -> int:
        from ..export import CloudOptions, check_formats, export_all
        from ..viewer import load_run, predictions_path

        source = predictions_path(self.run_dir)
        out = self.out if self.out is not None else source.parent
        in_place = out.resolve() == source.parent.resolve()
        formats = self.formats if self.formats is not None else tuple(
            f for f in ALL_FORMATS if not (in_place and f == "npz")  # the file being read, as it is
        )
        # Every option is checked before the run is read.
        check_formats(formats)
        if self.frames is not None:
            frame_slice(self.frames)
        try:
            CloudOptions(
                conf_threshold=self.conf_threshold, conf_percentile=self.conf_percentile, voxel_size=self.voxel_size,
                max_points=self.max_points,
            )
        except ValueError as err:
            raise ValueError(as_flags(str(err), Export)) from err
        recon = select_frames(load_run(self.run_dir), self.frames)
        written = export_all(
            recon, out, formats=formats, conf_threshold=self.conf_threshold, conf_percentile=self.conf_percentile,
            mask_sky=self.mask_sky, voxel_size=self.voxel_size, max_points=self.max_points,
            drop_black=self.drop_black_background, drop_white=self.drop_white_background, progress=not self.quiet,
        )
        print(f"{len(recon)} frames from {source} -> {out}: " + ", ".join(sorted(written)))
        return 0
