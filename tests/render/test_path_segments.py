"""Camera paths made of segments (`mapstream render --path FILE`) and the pivot mode."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from mapstream.render import (
    PathSegment, PathStyle, SegmentedPath, camera_path, load_path_file, parse_segmented_path, segmented_camera_path,
    transition_weights,
)

from render_synthetic import plane_run, straight_run

UP = np.array([0.0, -1.0, 0.0])
OVERVIEW = (np.array([0.0, -1.0, -4.0]), np.array([0.0, 0.0, 0.0]))  # 4 from the centre, 1 above it
SCENE = {"extent": 4.0, "up": UP, "overview": OVERVIEW}


def test_pivot_orbits_the_centre_at_the_overview_distance_and_height() -> None:
    views = camera_path(straight_run(5), style=PathStyle(mode="pivot", turns=1.0), **SCENE)
    # One turn from frame 0 to frame 4; counter-clockwise seen from above (about -y here).
    expected = [[0, -1, -4], [4, -1, 0], [0, -1, 4], [-4, -1, 0], [0, -1, -4]]
    np.testing.assert_allclose(views[:, :, 3], expected, atol=1e-12)
    for view in views:  # looking at the centre, image up = world up
        np.testing.assert_allclose(view[:, 2], -view[:, 3] / np.linalg.norm(view[:, 3]), atol=1e-12)
        assert view[:, 1] @ UP < 0
    half = camera_path(straight_run(3), style=PathStyle(mode="pivot", turns=-0.5), **SCENE)
    np.testing.assert_allclose(half[:, :, 3], [[0, -1, -4], [-4, -1, 0], [0, -1, 4]], atol=1e-12)  # clockwise
    with pytest.raises(ValueError, match="overview"):
        camera_path(straight_run(3), extent=1.0, up=UP, style=PathStyle(mode="pivot"))


def test_a_pivot_segment_turns_over_its_own_frames_and_goes_on_past_its_end() -> None:
    path = parse_segmented_path({"transition": 0, "segments": [
        {"mode": "static", "frames": [0, 1]}, {"mode": "pivot", "frames": [2, 4], "degrees": 90}]})
    views = segmented_camera_path(straight_run(7), path, **SCENE)
    np.testing.assert_allclose(views[:2, :, 3], [OVERVIEW[0]] * 2, atol=1e-12)
    c, s = np.cos(np.pi / 4), np.sin(np.pi / 4)  # 45 degrees a frame
    expected = [[0, -1, -4], [4 * s, -1, -4 * c], [4, -1, 0], [4 * s, -1, 4 * c], [0, -1, 4]]
    np.testing.assert_allclose(views[2:, :, 3], expected, atol=1e-12)


def test_transition_weights_ease_from_0_to_1_over_the_window() -> None:
    w = transition_weights(10, 3, 3)
    np.testing.assert_array_equal(w[:3], 0.0)
    np.testing.assert_array_equal(w[6:], 1.0)
    x = np.array([1, 2, 3]) / 4
    np.testing.assert_allclose(w[3:6], x * x * (3 - 2 * x), rtol=1e-15)
    np.testing.assert_array_equal(transition_weights(5, 2, 0), [0, 0, 1, 1, 1])  # 0 frames: a cut


def test_two_segments_give_each_ones_views_exactly_and_blend_in_between() -> None:
    poses = straight_run(20)
    follow, birdeye = PathStyle(mode="follow", back=0.5, smooth_frames=2.0), PathStyle(mode="birdeye", smooth_frames=2.0)
    path = SegmentedPath((PathSegment(follow, 0, 7), PathSegment(birdeye, 8, 19)), transition=4)
    views = segmented_camera_path(poses, path, smooth_frames=2.0, **SCENE)
    a = camera_path(poses, style=follow, **SCENE)
    b = camera_path(poses, style=birdeye, **SCENE)
    np.testing.assert_array_equal(views[:8], a[:8])  # before the window: exactly A
    np.testing.assert_array_equal(views[12:], b[12:])  # after it: exactly B
    w = transition_weights(20, 8, 4)[8:12, None]
    np.testing.assert_allclose(views[8:12, :, 3], (1 - w) * a[8:12, :, 3] + w * b[8:12, :, 3], atol=1e-12)
    for t in range(8, 12):  # strictly between the two
        assert not np.allclose(views[t], a[t]) and not np.allclose(views[t], b[t])
    steps = np.linalg.norm(np.diff(views[:, :, 3], axis=0), axis=1)
    cut = segmented_camera_path(poses, SegmentedPath(path.segments, transition=0), smooth_frames=2.0, **SCENE)
    assert steps.max() < np.linalg.norm(cut[8, :, 3] - cut[7, :, 3])  # no jump where a cut jumps


def test_the_last_segment_goes_on_and_segments_after_the_run_are_not_used() -> None:
    segments = [{"mode": "follow", "frames": [0, 3]}, {"mode": "birdeye", "frames": [4, 6]}]
    poses = straight_run(10)
    views = segmented_camera_path(poses, parse_segmented_path({"transition": 2, "segments": segments}), **SCENE)
    bird = camera_path(poses, style=PathStyle(mode="birdeye"), **SCENE)
    np.testing.assert_array_equal(views[6:], bird[6:])  # birdeye on past its end, frame 6
    short = straight_run(7)  # frames 0-6: a segment from frame 7 on is past the run
    later = [*segments, {"mode": "static", "frames": [7, 50]}]
    np.testing.assert_array_equal(segmented_camera_path(short, parse_segmented_path(later), **SCENE),
                                  segmented_camera_path(short, parse_segmented_path(segments), **SCENE))


@pytest.mark.parametrize(("data", "message"), [
    ([{"mode": "follow", "frames": [0, 9]}, {"mode": "orbit", "frames": [10, 19]}],
     r"segment 1: field 'mode' must be one of follow, birdeye, static, pivot, got 'orbit'"),
    ([{"frames": [0, 9]}], r"segment 0: field 'mode' must be one of .*got None"),
    ([{"mode": "static", "frames": [0, 9]}, {"mode": "follow", "frames": [5, 19]}],
     r"segment 1: frames \[5, 19\] overlap or come before segment 0's \[0, 9\]"),
    ([{"mode": "static", "frames": [0, 9]}, {"mode": "follow", "frames": [12, 19]}],
     r"segment 1: frames 10-11 are in no segment .* start segment 1 at frame 10 or end segment 0 at frame 11"),
    ([{"mode": "static", "frames": [3, 9]}], r"segment 0: frames must start at frame 0 \(frames 0-2 are in no segment\)"),
    ([{"mode": "static", "frames": [9, 3]}], r"segment 0: field 'frames' must be \[start, end\] with 0 <= start <= end"),
    ([{"mode": "static", "frames": [0, 1.5]}], r"segment 0: field 'frames' must be \[start, end\], two whole"),
    ([{"mode": "static", "frames": [0, True]}], r"segment 0: field 'frames' must be \[start, end\], two whole"),
    ([{"mode": "static", "frames": "0-9"}], r"segment 0: field 'frames' must be"),
    ([{"mode": "static"}], r"segment 0: field 'frames' is missing"),
    ([{"mode": "follow", "frames": [0, 9], "turns": 1}],
     r"segment 0: unknown field 'turns' for mode follow \(it takes back, height, ahead\)"),
    ([{"mode": "static", "frames": [0, 9], "back": 1}], r"segment 0: unknown field 'back' for mode static \(it takes no"),
    ([{"mode": "pivot", "frames": [0, 9], "turns": 1, "degrees": 90}], r"segment 0: give field 'turns' or field 'degrees'"),
    ([{"mode": "follow", "frames": [0, 9], "back": "far"}], r"segment 0: field 'back' must be a finite number, got 'far'"),
    ([{"mode": "pivot", "frames": [0, 9], "turns": float("nan")}], r"segment 0: field 'turns' must be a finite number"),
    ([{"mode": "follow", "frames": [0, 9], "back": 0.2, "ahead": -0.2, "height": 0}],
     r"segment 0: follow: back 0.2 and ahead -0.2 with height 0 put the eye on the point it looks at"),
    (["follow"], r"segment 0: expected a mapping"),
    ({"segments": [], "transition": 5}, r"'segments' must be a non-empty list"),
    ({"segments": [{"mode": "static", "frames": [0, 9]}], "transition": -1}, r"'transition' must be a whole number"),
    ({"segments": [{"mode": "static", "frames": [0, 9]}], "transition": 2.5}, r"'transition' must be a whole number"),
    ({"segments": [{"mode": "static", "frames": [0, 9]}], "blend": 3}, r"unknown field 'blend'"),
    ("follow", r"expected a mapping with 'segments'"),
    (None, r"expected a mapping with 'segments'.*got nothing"),
])
def test_a_path_file_that_is_not_right_is_refused_naming_the_segment_and_field(data, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_segmented_path(data)


EXAMPLE_YAML = """\
# two frames of overview, then follow, turning into a pivot
transition: 2
segments:
  - {mode: static, frames: [0, 1]}
  - mode: follow
    frames: [2, 5]
    back: 0.3
  - {mode: pivot, frames: [6, 9], degrees: 180}
"""


def test_yaml_and_json_path_files_read_the_same(tmp_path: Path) -> None:
    (tmp_path / "path.yaml").write_text(EXAMPLE_YAML)
    from_yaml = load_path_file(tmp_path / "path.yaml")
    expected = SegmentedPath((
        PathSegment(PathStyle(mode="static"), 0, 1), PathSegment(PathStyle(mode="follow", back=0.3), 2, 5),
        PathSegment(PathStyle(mode="pivot", turns=0.5), 6, 9)), transition=2)
    assert from_yaml == expected
    (tmp_path / "path.json").write_text(json.dumps({"transition": 2, "segments": [
        {"mode": "static", "frames": [0, 1]}, {"mode": "follow", "frames": [2, 5], "back": 0.3},
        {"mode": "pivot", "frames": [6, 9], "turns": 0.5}]}))
    assert load_path_file(tmp_path / "path.json") == expected
    assert parse_segmented_path([{"mode": "static", "frames": [0, 1]}]).transition == 10  # the default


def test_path_file_errors_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"path.txt: a camera path file must end in .yaml, .yml, .json"):
        load_path_file(tmp_path / "path.txt")
    with pytest.raises(FileNotFoundError, match="nowhere.yaml: no such camera path file"):
        load_path_file(tmp_path / "nowhere.yaml")
    (tmp_path / "broken.yaml").write_text("segments: [ {mode: static\n")
    with pytest.raises(ValueError, match="broken.yaml: not valid YAML"):
        load_path_file(tmp_path / "broken.yaml")
    (tmp_path / "broken.json").write_text("{'segments': []}")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        load_path_file(tmp_path / "broken.json")
    (tmp_path / "gap.yml").write_text("segments:\n  - {mode: static, frames: [0, 1]}\n  - {mode: pivot, frames: [3, 4]}\n")
    with pytest.raises(ValueError, match=r"gap.yml: segment 1: frames 2-2 are in no segment"):
        load_path_file(tmp_path / "gap.yml")
    monkeypatch.setitem(sys.modules, "yaml", None)  # PyYAML not installed
    with pytest.raises(ImportError, match="pip install pyyaml .* or write the file as JSON"):
        load_path_file(tmp_path / "gap.yml")


def test_mapstream_render_follows_a_path_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("av")
    from mapstream.cli.main import main
    from render_synthetic import decode

    run = tmp_path / "run"
    run.mkdir()
    plane_run(n=4).save_npz(run / "predictions.npz")
    (tmp_path / "path.yaml").write_text(
        "transition: 1\nsegments:\n  - {mode: static, frames: [0, 1]}\n  - {mode: pivot, frames: [2, 3], turns: 0.25}\n")
    common = ["--height", "48", "--quiet", "--device", "cpu"]
    assert main(["render", str(run), "--path", str(tmp_path / "path.yaml"), "--edl-strength", "2", *common]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {run / 'flythrough.mp4'} (4 frames at 10 FPS)"
    assert len(decode(run / "flythrough.mp4")) == 4
    assert main(["render", str(run), "--mode", "pivot", "--out", str(tmp_path / "pivot.mp4"), *common]) == 0
    assert len(decode(tmp_path / "pivot.mp4")) == 4


def test_mapstream_render_checks_the_path_file_before_reading_the_run(tmp_path, capsys, monkeypatch) -> None:
    import mapstream.viewer as viewer
    from mapstream.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    plane_run(n=2).save_npz(run / "predictions.npz")
    monkeypatch.setattr(viewer, "load_run", lambda *a: pytest.fail("the run was read"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("segments:\n  - {mode: static, frames: [0, 1]}\n  - {mode: orbit, frames: [2, 3]}\n")
    assert main(["render", str(run), "--path", str(bad), "--quiet"]) == 2
    assert f"error: {bad}: segment 1: field 'mode' must be one of" in capsys.readouterr().err
    assert main(["render", str(run), "--path", str(tmp_path / "missing.json"), "--quiet"]) == 2
    assert "missing.json: no such camera path file" in capsys.readouterr().err
    assert main(["render", str(run), "--edl-radius", "0", "--quiet"]) == 2
    assert "--edl-radius must be >= 1 pixel" in capsys.readouterr().err
    assert main(["render", str(run), "--edl-strength", "-1", "--quiet"]) == 2
    assert "--edl-strength must be a finite number >= 0" in capsys.readouterr().err
    assert not (run / "flythrough.mp4").exists()
