"""`mapstream export RUN_DIR`: write a run's outputs again from its predictions.npz, with other
point-cloud settings or formats, without running the model again."""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..export import ALL_FORMATS
from ._cloud import CloudFlags, PointCloudFlags
from ._flags import as_flags
from ._glb import GlbFlags, GlbStyleFlags
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
    cloud: CloudFlags = field(default_factory=PointCloudFlags)
    mask_sky: bool = True
    """Point cloud: leave out sky pixels when the run has a sky mask."""
    glb: GlbFlags = field(default_factory=GlbStyleFlags)
    quiet: bool = False
    """No progress bar."""

    def main(self) -> int:
        from ..export import check_formats, export_all
        from ..viewer import load_run, predictions_path
        from ..viewer.loading import run_warnings

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
            cloud = self.cloud.options(mask_sky=self.mask_sky)
            glb_style = self.glb.style()
        except ValueError as err:
            raise ValueError(as_flags(str(err), Export)) from err
        recon = load_run(self.run_dir, log_notes=False)
        for warning in run_warnings(self.run_dir, recon):
            print(f"WARNING: {warning}", file=sys.stderr)
        recon = select_frames(recon, self.frames)
        from ..io.atomic import prepare_dir
        from ..pipeline.folder_lock import lock_run_folder
        from ..pipeline.outputs import record_export

        # Held as a run holds it: a run (or another export) writing there meanwhile is refused.
        with lock_run_folder(prepare_dir(out)):
            # CloudOptions' fields are export_all's point-cloud keywords, name for name.
            written = export_all(
                recon, out, formats=formats, **dataclasses.asdict(cloud), glb_style=glb_style, progress=not self.quiet
            )
            record_export(out, written, recon.file_stems())
        print(f"{len(recon)} frames from {source} -> {out}: " + ", ".join(sorted(written)))
        return 0
