"""`mapstream view DIR`: look at a run's outputs in the browser (viser; see docs/VIEWER.md)."""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

try:  # tyro only matters when parsing a command line
    import tyro

    RunDir = Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="RUN_DIR")]
except ImportError:
    RunDir = Path  # type: ignore[misc]

from ..export import DEFAULT_CONF_THRESHOLD
from ..viewer.scene import DEFAULT_MAX_POINTS

logger = logging.getLogger(__name__)


@dataclass
class View:
    """Serve a run folder (the --out of `mapstream run`) in a browser: point cloud, cameras, frame scrubber."""

    run_dir: RunDir
    """Run folder holding predictions.npz (or the path of a predictions .npz file)."""
    port: int = 8080
    """Port to serve on (the next free one is taken if it is busy)."""
    host: str = "127.0.0.1"
    """Address of this machine to listen on; 0.0.0.0 makes the viewer reachable from other machines."""
    conf_threshold: float = DEFAULT_CONF_THRESHOLD
    """Initial confidence threshold: points with confidence > this are shown (confidence is > 1)."""
    max_points: int = DEFAULT_MAX_POINTS
    """Most points held and shown; beyond, a seeded uniform subsample."""
    point_size: float | None = None
    """Initial point size in world units (default: the median size of a pixel at its depth)."""
    downsample: Literal[1, 2, 4, 8, 16, 32] = 1
    """Initially keep one point in this many."""
    hide_sky: bool = True
    """Initially hide sky points (when the run has a sky mask), as the reference does; a checkbox shows them."""
    export_dir: tuple[Path, ...] = ()
    """Further folders the page's GLB, PNG and video paths may write into (besides the run folder; nowhere else)."""
    allow_origin: tuple[str, ...] = ()
    """Further web origins (http://HOST:PORT) whose pages may connect, e.g. a tunnel's local address on another port."""
    block: bool = True
    """Serve until Ctrl-C; --no-block builds the scene, prints the address and exits (a smoke test)."""

    def main(self) -> int:
        from ..viewer import ViewerApp, ViewerOptions, load_run, predictions_path
        from ..viewer.loading import run_warnings

        recon = load_run(self.run_dir, log_notes=False)
        warnings = run_warnings(self.run_dir, recon)
        for warning in warnings:
            print(f"WARNING: {warning}", file=sys.stderr)
        options = ViewerOptions(
            conf_threshold=self.conf_threshold, max_points=self.max_points, point_size=self.point_size,
            downsample=self.downsample, hide_sky=self.hide_sky,
        )
        app = ViewerApp(
            recon, options, host=self.host, port=self.port, title=f"mapstream: {self.run_dir}",
            output_dir=predictions_path(self.run_dir).parent,  # where "export GLB" and "screenshot" write
            export_dirs=self.export_dir, allowed_origins=self.allow_origin, notices=warnings,
        )
        app.start()
        try:
            print(
                f"viewing {self.run_dir}: {len(recon)} frames, {len(app.pool):,} points "
                f"({app.pool.num_valid:,} valid) at {app.url}"
            )
            if self.block:
                print("press Ctrl-C to stop")
                app.wait()
        finally:
            app.stop()
        return 0
