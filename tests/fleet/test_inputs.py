"""Inputs expanded into one folder each: names that tell inputs apart, lists, globs, and the
mistakes refused before anything runs."""
from __future__ import annotations

import pytest

from mapstream.fleet import expand_inputs


def _make(tmp_path, *paths):
    for p in paths:
        target = tmp_path / p
        if target.suffix:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"")
        else:
            target.mkdir(parents=True, exist_ok=True)
    return tmp_path


def _names(specs, root):
    return [(i.input, i.name, i.out) for i in expand_inputs(specs, root)]


def test_folders_are_named_by_what_tells_the_inputs_apart(tmp_path):
    _make(tmp_path, "data/desk/rgb", "data/room/rgb", "v/walk.mp4", "v/run.mp4")
    items = expand_inputs([str(tmp_path / "data/*/rgb")], tmp_path / "out")
    assert [(i.name, i.out) for i in items] == [("desk", tmp_path / "out/desk"), ("room", tmp_path / "out/room")]
    assert [i.input for i in items] == [str(tmp_path / "data/desk/rgb"), str(tmp_path / "data/room/rgb")]
    assert [i.name for i in expand_inputs([str(tmp_path / "v/walk.mp4"), str(tmp_path / "v/run.mp4")], "o")] == [
        "walk", "run"]
    # Same last names, different depths of difference: as many components as tell them apart.
    _make(tmp_path, "a/x/cam", "b/x/cam")
    assert [i.name for i in expand_inputs([str(tmp_path / "a/x/cam"), str(tmp_path / "b/x/cam")], "o")] == ["a", "b"]
    _make(tmp_path, "p/x/one", "q/x/one", "q/y/one")
    names = [i.name for i in expand_inputs([str(tmp_path / s) for s in ("p/x/one", "q/x/one", "q/y/one")], "o")]
    assert names == ["p_x", "q_x", "q_y"]
    # The names do not depend on how a path is spelled, and stay the same on every call.
    respelled = [str(tmp_path / "data/desk/rgb/../rgb"), str(tmp_path / "data/room/rgb")]
    again = [i.name for i in expand_inputs(respelled, "o")]
    assert again == ["desk", "room"]


def test_a_list_file_names_inputs_relative_to_itself(tmp_path):
    _make(tmp_path, "lists/d/one", "lists/d/two", "elsewhere/three.mp4")
    (tmp_path / "lists" / "job.txt").write_text(
        f"# my inputs\nd/one\n\n  d/two  \n{tmp_path / 'elsewhere/three.mp4'}\nrtsp://cam/live\n")
    items = expand_inputs([str(tmp_path / "lists" / "job.txt")], tmp_path / "out")
    assert [i.input for i in items] == [
        str(tmp_path / "lists/d/one"), str(tmp_path / "lists/d/two"), str(tmp_path / "elsewhere/three.mp4"),
        "rtsp://cam/live"]
    assert [i.name for i in items] == ["one", "two", "three", "live"]


@pytest.mark.parametrize("case, message", [
    ("no_match", "no input matches the glob"),
    ("missing_list", "the list of inputs"),
    ("empty_list", "names no input"),
    ("missing_path", "does not exist"),
    ("twice", "is given twice"),
    ("same_folder", "would both write to the folder a_b"),
    ("summary_name", "would both write to the folder job.json"),
    ("nothing", "no inputs given"),
    ("image", "is an image: a job's inputs are folders, videos or streams"),
])
def test_mistakes_are_refused_before_anything_runs(tmp_path, case, message):
    _make(tmp_path, "x/a b", "x/a_b", "y/job.json.mp4", "ok", "frames/1.JPG", "frames/2.JPG")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    specs = {
        "no_match": [str(tmp_path / "nothing*/rgb")], "missing_list": [str(tmp_path / "gone.txt")],
        "empty_list": [str(tmp_path / "empty.txt")], "missing_path": [str(tmp_path / "ok"), str(tmp_path / "gone")],
        "twice": [str(tmp_path / "ok"), str(tmp_path / "x/../ok")],
        "same_folder": [str(tmp_path / "x/a b"), str(tmp_path / "x/a_b")],
        "summary_name": [str(tmp_path / "y/job.json.mp4")], "nothing": [],
        "image": [str(tmp_path / "frames" / "*.JPG")],
    }[case]
    with pytest.raises(ValueError, match=message):
        expand_inputs(specs, tmp_path / "out")
