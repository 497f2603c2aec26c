"""The point-cloud flags `mapstream run` and `mapstream export` share, declared once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

import tyro

from ..export import DEFAULT_CONF_THRESHOLD, CloudOptions

__all__ = ["CloudFlags", "PointCloudFlags"]


@dataclass
class PointCloudFlags:
    """How depth becomes the written point cloud."""

    conf_threshold: float = DEFAULT_CONF_THRESHOLD
    """Point cloud: keep pixels whose depth confidence is above this (confidence is > 1)."""
    conf_percentile: Optional[float] = None
    """Point cloud: also keep only pixels whose confidence reaches this percentile (0-100) of the run's."""
    voxel_size: Optional[float] = None
    """Point cloud: average the points on a grid of this edge, in world units (None: no grid)."""
    drop_black_background: bool = False
    """Point cloud: leave out near-black pixels (R+G+B < 16), e.g. a black backdrop."""
    drop_white_background: bool = False
    """Point cloud: leave out near-white pixels (all channels > 240), e.g. a white backdrop or the padding of --preprocess pad."""
    max_points: Optional[int] = 2_000_000
    """Point cloud: at most this many points, a seeded subsample of those kept (None keeps them all)."""

    def options(self, **rest) -> CloudOptions:
        """These settings as the library's CloudOptions (which checks them), with ``rest``
        (mask_sky, seed) as the command has them."""
        return CloudOptions(
            conf_threshold=self.conf_threshold, conf_percentile=self.conf_percentile, voxel_size=self.voxel_size,
            drop_black=self.drop_black_background, drop_white=self.drop_white_background, max_points=self.max_points,
            **rest,
        )


CloudFlags = Annotated[PointCloudFlags, tyro.conf.arg(name="")]
"""A command's field of these flags, spelled without a prefix (``--voxel-size``, not
``--cloud.voxel-size``)."""
