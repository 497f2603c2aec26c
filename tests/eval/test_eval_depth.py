"""Depth metrics: known answers, alignment modes and validity masks."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mapstream.eval.depth import DEPTH_METRIC_NAMES, depth_metrics


def gt_maps(n: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 6.0, size=(n, 12, 16))


def test_known_values_without_alignment() -> None:
    gt = np.array([[1.0, 2.0]])
    pred = np.array([[1.1, 1.8]])
    m = depth_metrics(pred, gt, align="none")
    assert m["abs_rel"] == pytest.approx(0.1)
    assert m["sq_rel"] == pytest.approx((0.01 / 1 + 0.04 / 2) / 2)
    assert m["rmse"] == pytest.approx(math.sqrt((0.01 + 0.04) / 2))
    assert m["log_rmse"] == pytest.approx(math.sqrt((math.log(1.1) ** 2 + math.log(0.9) ** 2) / 2))
    assert m["delta_1"] == 1.0

    doubled = depth_metrics(2 * gt_maps(), gt_maps(), align="none")
    assert doubled["abs_rel"] == pytest.approx(1.0)
    assert (doubled["delta_1"], doubled["delta_2"], doubled["delta_3"]) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("align", ["median", "scale_shift"])
def test_scale_alignment_removes_the_scale(align: str) -> None:
    gt = gt_maps()
    pred = 0.37 * gt + (0.2 if align == "scale_shift" else 0.0)
    m = depth_metrics(torch.from_numpy(pred).float(), gt, align=align)
    for key in ("abs_rel", "sq_rel", "rmse", "log_rmse"):
        assert m[key] < 1e-6, key
    assert m["delta_1"] == 1.0
    np.testing.assert_allclose(m.scales, 1 / 0.37, rtol=1e-5)
    assert set(m.values) == set(DEPTH_METRIC_NAMES)


def test_per_frame_versus_per_sequence() -> None:
    gt = gt_maps(2)
    pred = gt * np.array([1.0, 3.0])[:, None, None]  # a different scale per frame
    assert depth_metrics(pred, gt, align="median", per="frame")["abs_rel"] < 1e-12
    seq = depth_metrics(pred, gt, align="median", per="sequence")
    assert seq["abs_rel"] > 0.1
    assert seq.scales[0] == seq.scales[1]


def test_validity_masks() -> None:
    gt = gt_maps(1)
    pred = gt.copy()
    pred[0, 0, :4] = 100.0  # wrong, but masked out below in three different ways
    gt_bad = gt.copy()
    gt_bad[0, 0, 0] = 0.0
    gt_bad[0, 0, 1] = np.nan
    gt_bad[0, 0, 2] = 50.0
    mask = np.ones_like(gt, dtype=bool)
    mask[0, 0, 3] = False
    m = depth_metrics(pred, gt_bad, align="none", max_depth=10.0, mask=mask)
    assert m["abs_rel"] == 0.0
    assert m.valid_pixels[0] == gt.size - 4
    pred[0, 5, 5] = np.nan  # non-finite predictions are not scored either
    assert depth_metrics(pred, gt_bad, align="none", max_depth=10.0, mask=mask).valid_pixels[0] == gt.size - 5


def test_frames_without_valid_pixels_are_skipped_and_errors_raise() -> None:
    gt = gt_maps(2)
    gt[1] = 0.0
    m = depth_metrics(gt, gt, align="median")
    assert m["abs_rel"] == 0.0 and math.isnan(m.per_frame["abs_rel"][1])
    with pytest.raises(ValueError, match="no valid depth"):
        depth_metrics(gt[1:], gt[1:])
    with pytest.raises(ValueError, match="shape"):
        depth_metrics(gt[:, :5], gt)
    with pytest.raises(ValueError, match="align"):
        depth_metrics(gt, gt, align="mean")
