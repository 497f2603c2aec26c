"""Checkpoint loading and conversion (tiny preset, synthetic weights, no network)."""
from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import mapstream
from mapstream import hub
from mapstream.models import fill_synthetic_
from mapstream.checkpoint import (
    CheckpointError,
    checkpoint_filter_fn,
    convert_checkpoint,
    convert_main,
    load_model,
)

TINY_PARAMS = 4_738_404
REPO = "robbyant/lingbot-map"


@pytest.fixture(scope="module")
def source() -> mapstream.GCTStream:
    return fill_synthetic_(mapstream.build_model("tiny")).eval()


@pytest.fixture(scope="module")
def ref(source) -> dict[str, torch.Tensor]:
    return source.state_dict()


@pytest.fixture(scope="module")
def point_ref() -> dict[str, torch.Tensor]:
    return fill_synthetic_(mapstream.build_model("tiny", enable_point=True)).state_dict()


@pytest.fixture
def pt_file(tmp_path, ref) -> Path:
    path = tmp_path / "ckpt.pt"
    torch.save({"model": ref, "epoch": 3, "optimizer": {"lr": 1e-4}}, path)
    return path


@pytest.fixture
def no_hub(monkeypatch):
    """Fail the test if the hub is contacted."""

    def fail(*args, **kwargs):
        raise AssertionError(f"hub contacted: {args} {kwargs}")

    monkeypatch.setattr(hub, "hf_hub_download", fail)


def assert_same(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = model.state_dict()
    assert list(got) == list(expected)
    for key, tensor in expected.items():
        assert got[key].dtype == tensor.dtype, key
        assert torch.equal(got[key], tensor), key
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])


# --------------------------------------------------------------------------- round trips
def test_pt_with_model_entry(pt_file, ref):
    model = load_model(pt_file, preset="tiny")
    assert_same(model, ref)
    assert model.load_report.ok and model.load_report.loaded == len(ref)
    assert not model.training
    assert torch.equal(model.aggregator._resnet_mean.flatten(), torch.tensor([0.485, 0.456, 0.406]))


def test_bare_pt_and_legacy_format(tmp_path, ref):
    torch.save(ref, tmp_path / "bare.pt")
    assert_same(load_model(tmp_path / "bare.pt", preset="tiny"), ref)
    torch.save(ref, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert_same(load_model(str(tmp_path / "legacy.pt"), preset="tiny"), ref)


@pytest.mark.parametrize("prefix", ["_orig_mod.", "module.", "module._orig_mod."])
def test_compile_and_dataparallel_prefixes(tmp_path, ref, prefix):
    torch.save({"model": {prefix + k: v for k, v in ref.items()}}, tmp_path / "p.pt")
    assert_same(load_model(tmp_path / "p.pt", preset="tiny"), ref)


def test_safetensors(tmp_path, ref):
    save_file(dict(ref), tmp_path / "w.safetensors")
    assert_same(load_model(tmp_path / "w.safetensors", preset="tiny"), ref)


def test_loaded_model_predicts_like_the_source(pt_file, source):
    frames = torch.rand(3, 3, 28, 42, generator=torch.Generator().manual_seed(0))
    loaded = load_model(pt_file, preset="tiny")
    with torch.no_grad():
        want = source.inference_streaming(frames, num_scale_frames=2)
        got = loaded.inference_streaming(frames, num_scale_frames=2)
    assert set(got) == set(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def test_convert(tmp_path, pt_file, ref):
    dst = convert_checkpoint(pt_file, tmp_path / "out" / "w.safetensors")
    assert dst == tmp_path / "out" / "w.safetensors"
    assert [p.name for p in dst.parent.iterdir()] == ["w.safetensors"]  # no temp file left
    with safe_open(dst, framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and meta["source_file"] == "ckpt.pt"
    assert meta["mapstream_version"] == mapstream.__version__
    assert meta["parameters"] == str(TINY_PARAMS) and meta["tensors"] == str(len(ref))
    assert_same(load_model(dst, preset="tiny"), ref)
    assert dst.stat().st_mode & 0o777 == 0o666 & ~_current_umask()  # as any new file, not private


def _current_umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_convert_into_a_folder_and_never_over_its_source(tmp_path, pt_file, ref):
    """A folder as the output gets `<source stem>.safetensors` inside it; the source itself
    as the output is refused (it used to be overwritten with the converted copy)."""
    folder = tmp_path / "weights"
    folder.mkdir()
    assert convert_checkpoint(pt_file, folder) == folder / "ckpt.safetensors"
    assert_same(load_model(folder / "ckpt.safetensors", preset="tiny"), ref)
    assert convert_checkpoint(pt_file, f"{tmp_path}/new/sub/") == tmp_path / "new" / "sub" / "ckpt.safetensors"
    before = pt_file.read_bytes()
    with pytest.raises(ValueError, match="is the checkpoint being converted"):
        convert_checkpoint(pt_file, pt_file)
    assert pt_file.read_bytes() == before


def test_convert_keeps_old_file_on_failure(tmp_path):
    dst = tmp_path / "w.safetensors"
    dst.write_bytes(b"old")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint at all" * 4)
    with pytest.raises(CheckpointError, match="could not read"):
        convert_checkpoint(tmp_path / "bad.pt", dst)
    assert dst.read_bytes() == b"old" and len(list(tmp_path.iterdir())) == 2


def test_convert_main(tmp_path, pt_file, ref, caplog):
    assert convert_main(str(pt_file), None) == 0
    assert_same(load_model(pt_file.with_suffix(".safetensors"), preset="tiny"), ref)
    with caplog.at_level(logging.ERROR):
        assert convert_main(str(tmp_path / "missing.pt"), None) == 1
    assert "not found" in caplog.text


def test_convert_without_a_destination_writes_where_the_source_is(tmp_path, pt_file, ref, monkeypatch, capsys):
    """`mapstream convert SRC` and `convert_main` agree on the default output: beside a file,
    inside a folder, and in the working folder for a hub repo id."""
    import shutil

    from mapstream.cli.main import main
    from mapstream.checkpoint import DEFAULT_FILENAME, default_converted_path

    folder = tmp_path / "weights"
    folder.mkdir()
    shutil.copy(pt_file, folder / DEFAULT_FILENAME)
    expected = folder / (Path(DEFAULT_FILENAME).stem + ".safetensors")
    assert default_converted_path(str(folder)) == expected
    assert main(["convert", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {expected}"
    assert_same(load_model(expected, preset="tiny"), ref)
    expected.unlink()
    assert convert_main(str(folder)) == 0 and expected.is_file()
    assert default_converted_path(str(pt_file)) == pt_file.with_suffix(".safetensors")
    monkeypatch.chdir(tmp_path)
    assert default_converted_path("someone/some-model") == Path(Path(DEFAULT_FILENAME).stem + ".safetensors")


# --------------------------------------------------------------------------- key filter
def test_filter_fn_is_pure_and_ordered(ref):
    prefixed = {"_orig_mod." + k: v for k, v in ref.items()}
    prefixed["aggregator._orig_mod.x"] = torch.zeros(1)
    before = list(prefixed)
    out = checkpoint_filter_fn(prefixed)
    assert list(prefixed) == before
    assert list(out) == [*ref, "aggregator.x"]
    assert checkpoint_filter_fn({"module.module.a": 1}) == {"a": 1}


def test_filter_fn_rejects_collisions():
    with pytest.raises(CheckpointError, match="both name 'a.b'"):
        checkpoint_filter_fn({"a.b": torch.zeros(1), "module.a.b": torch.zeros(1)})


# --------------------------------------------------------------------------- strictness
def test_missing_keys(tmp_path, ref):
    torch.save({k: v for k, v in ref.items() if not k.startswith("depth_head.")}, tmp_path / "m.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "m.pt", preset="tiny")
    n = sum(k.startswith("depth_head.") for k in ref)
    message = str(err.value)
    assert f"{n} missing keys" in message and f"{n} under depth_head.*" in message
    assert "strict=False" in message
    assert err.value.report.missing == [k for k in ref if k.startswith("depth_head.")]


def test_unexpected_keys(tmp_path, ref):
    torch.save({**ref, "extra.weight": torch.zeros(2)}, tmp_path / "u.pt")
    with pytest.raises(CheckpointError, match=r"1 unexpected key .*: extra\.weight"):
        load_model(tmp_path / "u.pt", preset="tiny")


def test_shape_mismatch(pt_file):
    with pytest.raises(CheckpointError) as err:
        load_model(pt_file, preset="tiny", img_size=224)
    message = str(err.value)
    assert "aggregator.patch_embed.pos_embed: checkpoint [1, 1370, 128] vs model [1, 257, 128]" in message
    assert "img_size" in message


def test_wrong_preset_names_the_right_one(pt_file):
    with pytest.raises(CheckpointError, match=r"matches preset 'tiny': pass preset='tiny' \(or preset='auto'\)"):
        load_model(pt_file)


def test_preset_auto_builds_the_architecture_the_checkpoint_fits(pt_file, ref, tmp_path, caplog):
    """preset="auto" (what the command line uses) takes the preset whose keys and shapes the
    checkpoint fits; a checkpoint that fits none is reported against the official one."""
    with caplog.at_level(logging.INFO):
        model = load_model(pt_file, preset="auto")
    assert "fits preset 'tiny'" in caplog.text
    assert model.config == load_model(pt_file, preset="tiny").config
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in ref.items())
    foreign = {"encoder.weight": torch.zeros(2, 2)}
    torch.save(foreign, tmp_path / "f.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "f.pt", preset="auto")
    assert "for preset 'lingbot-map'" in str(err.value)
    with pytest.raises(ValueError, match="preset"):
        load_model(pt_file, preset="tinny")


def test_foreign_state_dict(tmp_path):
    foreign = {f"backbone.blocks.{i}.attn.qkv.weight": torch.zeros(3, 3) for i in range(12)}
    foreign["head.fc.weight"] = torch.zeros(2, 2)
    torch.save(foreign, tmp_path / "vggt.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "vggt.pt", preset="tiny")
    message = str(err.value)
    assert "does not look like a LingBot-Map checkpoint" in message
    assert "12 under backbone.blocks.*" in message and "head.fc.weight" in message
    assert "strict=False" not in message  # it would load nothing


@pytest.mark.parametrize(
    "content, match",
    [
        ({"epoch": 3, "lr": 0.1}, r"not a state dict: entries 'epoch' \(int\), 'lr' \(float\)"),
        ([torch.zeros(1)], "holds a list, not a state dict"),
        ({}, "empty dict"),
    ],
)
def test_not_a_state_dict(tmp_path, content, match):
    torch.save(content, tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match=match):
        load_model(tmp_path / "x.pt", preset="tiny")


@pytest.mark.parametrize("damage", ["nan", "inf"])
def test_weights_holding_nan_or_inf_are_refused_and_skipped_when_not_strict(tmp_path, ref, caplog, damage):
    """A damaged checkpoint whose tensors hold NaN or Inf would make every prediction NaN:
    strict loading names the tensors; strict=False loads the rest and keeps those tensors'
    initial values."""
    bad_value = float("nan") if damage == "nan" else float("-inf")
    damaged = {k: v.clone() for k, v in ref.items()}
    names = ["aggregator.camera_token", "depth_head.norm.weight"]
    for name in names:
        damaged[name].view(-1)[-1] = bad_value
    torch.save(damaged, tmp_path / "d.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "d.pt", preset="tiny")
    message = str(err.value)
    assert "2 tensors holding NaN or Inf values: aggregator.camera_token, depth_head.norm.weight" in message
    assert "download or copy it again" in message
    assert err.value.report.non_finite == names and not err.value.report.missing
    with pytest.raises(CheckpointError, match="the checkpoint matches preset 'tiny'"):
        load_model(tmp_path / "d.pt")  # the preset is found by keys and shapes, whatever the values
    with caplog.at_level(logging.WARNING):
        model = load_model(tmp_path / "d.pt", preset="tiny", strict=False)
    assert "holding NaN or Inf" in caplog.text
    assert model.load_report.loaded == len(ref) - 2
    state = model.state_dict()
    for key, tensor in ref.items():
        assert torch.isfinite(state[key]).all(), key
        if key not in names:
            assert torch.equal(state[key], tensor), key


@pytest.mark.parametrize("damage", ["header", "truncated"])
def test_a_damaged_safetensors_file_gets_a_checkpoint_error(tmp_path, ref, damage):
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in ref.items()}, path)
    data = path.read_bytes()
    if damage == "header":  # still looks like safetensors: a length, then "{"
        data = data[:8] + b"{not json" + data[17:]
    else:
        data = data[: len(data) // 2]
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=r"could not read .*w\.safetensors.*copied completely"):
        load_model(path, preset="tiny")


def test_a_plain_pickle_is_named_as_such_without_torchs_warning(tmp_path, ref, recwarn):
    """`pickle.dump` of a dict is no checkpoint torch.save wrote: one plain line, no torch
    warning about pickle protocols, no cut-off UnpicklingError text."""
    import pickle

    with open(tmp_path / "raw.pt", "wb") as f:
        pickle.dump({"weights": [1.0, 2.0]}, f, protocol=4)
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "raw.pt", preset="tiny", trust_pickle=True)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'raw.pt'} is a plain Python pickle, not a checkpoint written by torch.save")
    assert "torch.save(model.state_dict(), path)" in message and "Unpickl" not in message
    assert [str(w.message) for w in recwarn] == []
    # torch.save's legacy format, at any pickle protocol, is torch's own: not told as a plain pickle.
    from mapstream.checkpoint.files import is_plain_pickle

    for protocol in (2, 4):
        torch.save(ref, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False, pickle_protocol=protocol)
        assert not is_plain_pickle(tmp_path / "legacy.pt")
    assert is_plain_pickle(tmp_path / "raw.pt")


def test_a_file_named_safetensors_that_is_not_one_says_so_in_plain_words(tmp_path, pt_file, ref):
    text = tmp_path / "notes.safetensors"
    text.write_text("these are notes, not weights\n")
    with pytest.raises(CheckpointError, match=r"notes\.safetensors is named \.safetensors but is not a safetensors "
                                              r"file .*a file of another kind renamed") as err:
        convert_checkpoint(text, tmp_path / "out.safetensors")
    assert "zip" not in str(err.value) and "header too large" not in str(err.value)
    renamed = pt_file.rename(tmp_path / "ckpt.safetensors")
    with pytest.raises(CheckpointError, match=r"is named \.safetensors but is a PyTorch checkpoint \(torch\.save\); "
                                              r"rename it to ckpt\.pt"):
        load_model(renamed, preset="tiny")
    assert not (tmp_path / "out.safetensors").exists()


def test_partial_load(tmp_path, ref, caplog):
    partial = {k: v for k, v in ref.items() if not k.startswith("depth_head.")}
    partial["aggregator.camera_token"] = torch.zeros(1, 2, 1, 7)
    partial["extra.weight"] = torch.zeros(1)
    torch.save(partial, tmp_path / "p.pt")
    with caplog.at_level(logging.WARNING):
        model = load_model(tmp_path / "p.pt", preset="tiny", strict=False)
    report = model.load_report
    assert "under depth_head.*" in caplog.text and "extra.weight" in caplog.text
    assert report.unexpected == ["extra.weight"]
    assert report.mismatched == [("aggregator.camera_token", (1, 2, 1, 7), (1, 2, 1, 128))]
    assert report.loaded == len(ref) - len(report.missing) - 1
    state = model.state_dict()
    for key, tensor in ref.items():
        if key in partial and key != "aggregator.camera_token":
            assert torch.equal(state[key], tensor), key
        assert not state[key].is_meta and torch.isfinite(state[key]).all(), key


# --------------------------------------------------------------------------- point head
def test_enable_point_auto(tmp_path, ref, point_ref):
    torch.save({"model": point_ref}, tmp_path / "point.pt")
    model = load_model(tmp_path / "point.pt", preset="tiny")
    assert model.point_head is not None
    assert_same(model, point_ref)

    model = load_model(tmp_path / "point.pt", preset="tiny", enable_point=False, strict=False)
    assert model.point_head is None
    assert_same(model, ref)
    assert all(k.startswith("point_head.") for k in model.load_report.unexpected)

    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "point.pt", preset="tiny", enable_point=False)
    n = sum(k.startswith("point_head.") for k in point_ref)
    assert f"{n} unexpected keys" in str(err.value) and f"{n} under point_head.*" in str(err.value)
    assert "enable_point=True" in str(err.value)


def test_enable_point_without_point_weights(pt_file):
    assert load_model(pt_file, preset="tiny").point_head is None
    with pytest.raises(CheckpointError, match="has no point head: use enable_point=False"):
        load_model(pt_file, preset="tiny", enable_point=True)


# --------------------------------------------------------------------------- pickle, dtype
def test_pickled_objects_need_trust(tmp_path, ref):
    torch.save({"model": ref, "args": argparse.Namespace(lr=0.1)}, tmp_path / "args.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "args.pt", preset="tiny")
    assert "argparse.Namespace" in str(err.value) and "trust_pickle=True" in str(err.value)
    assert f"mapstream convert {tmp_path / 'args.pt'} --trust-pickle" in str(err.value)  # a CLI user's way
    assert_same(load_model(tmp_path / "args.pt", preset="tiny", trust_pickle=True), ref)


def test_dtype(tmp_path, pt_file, ref):
    model = load_model(pt_file, preset="tiny", dtype=torch.float64)
    assert_same(model, {k: v.double() for k, v in ref.items()})
    half = {k: v.bfloat16() for k, v in ref.items()}
    torch.save(half, tmp_path / "bf16.pt")
    assert_same(load_model(tmp_path / "bf16.pt", preset="tiny"), {k: v.float() for k, v in half.items()})


# --------------------------------------------------------------------------- sources
def _hub_cache(root: Path, ref: dict[str, torch.Tensor]) -> Path:
    """A hub cache holding robbyant/lingbot-map's lingbot-map-long.pt (= the tiny weights)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / "models--robbyant--lingbot-map"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    torch.save({"model": ref}, repo / "snapshots" / commit / "lingbot-map-long.pt")
    return root


def test_hub_cache_hit_offline(tmp_path, monkeypatch, ref):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = _hub_cache(tmp_path / "hub", ref)
    assert_same(load_model(REPO, preset="tiny", cache_dir=cache), ref)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    model = load_model(REPO, preset="tiny")
    assert_same(model, ref)
    assert "snapshots" in model.load_report.source


def test_hub_offline_miss_says_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubDownloadError) as err:
        load_model(REPO, filename="other.pt", preset="tiny", cache_dir=tmp_path / "empty")
    message = str(err.value)
    assert "'robbyant/lingbot-map'" in message and "'other.pt'" in message
    assert "HF_HUB_OFFLINE" in message
    assert "https://huggingface.co/robbyant/lingbot-map/resolve/main/other.pt" in message
    assert str(tmp_path / "empty") in message and "load_model('/path/to/other.pt')" in message


def test_hub_download_failure(tmp_path, monkeypatch):
    def unreachable(*args, **kwargs):
        raise hub.LocalEntryNotFoundError("connection error and no cached file")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hf_hub_download", unreachable)
    with pytest.raises(hub.HubDownloadError, match="could not be reached") as err:
        load_model(REPO, preset="tiny", cache_dir=tmp_path)
    assert "lingbot-map-long.pt" in str(err.value)


def test_hub_download_arguments(tmp_path, monkeypatch, pt_file, ref):
    calls = []

    def fake(repo_id, filename, **kwargs):
        calls.append((repo_id, filename, kwargs))
        return str(pt_file)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hf_hub_download", fake)
    assert_same(load_model(REPO, preset="tiny", revision="v1", cache_dir=tmp_path), ref)
    (repo_id, filename, kwargs), = calls
    assert (repo_id, filename) == (REPO, "lingbot-map-long.pt")
    assert kwargs["revision"] == "v1" and kwargs["local_files_only"] is False
    assert Path(kwargs["cache_dir"]) == tmp_path


@pytest.mark.parametrize("missing", ["nope.pt", "dir/nope.safetensors", "./robbyant/lingbot-map", "a/b/c"])
def test_missing_local_path(tmp_path, monkeypatch, no_hub, missing):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="Checkpoint file not found"):
        load_model(missing, preset="tiny")


def test_hub_file_path_hint(tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    hint = r"load_model\('robbyant/lingbot-map', filename='lingbot-map-long.pt'\)"
    with pytest.raises(FileNotFoundError, match=hint):
        load_model("robbyant/lingbot-map/lingbot-map-long.pt")


def test_local_path_wins_over_repo_id(tmp_path, monkeypatch, no_hub, ref):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "robbyant" / "lingbot-map"
    folder.mkdir(parents=True)
    torch.save(ref, folder / "lingbot-map-long.pt")
    assert_same(load_model(REPO, preset="tiny"), ref)  # a folder holding the default file
    with pytest.raises(FileNotFoundError, match="Checkpoints in .*: lingbot-map-long.pt"):
        load_model(REPO, filename="lingbot-map.pt", preset="tiny")


def test_looks_like_repo_id():
    assert hub.looks_like_repo_id("robbyant/lingbot-map")
    for text in ["model.pt", "a/b.safetensors", "./a/b", "/a/b", "a/b/c", "~/x", "../x", "a/.."]:
        assert not hub.looks_like_repo_id(text), text


def test_bad_arguments_fail_before_reading(tmp_path, pt_file, no_hub):
    with pytest.raises(ValueError, match="Unknown model argument 'not_an_option'"):
        load_model(tmp_path / "absent.pt", preset="tiny", not_an_option=1)
    with pytest.raises(ValueError, match="Unknown preset"):
        load_model(REPO, preset="huge")
    with pytest.raises(ValueError, match="filename='x.pt' only applies"):
        load_model(pt_file, filename="x.pt", preset="tiny")


# --------------------------------------------------------------------------- what users' files look like
def test_a_loaded_models_weights_do_not_follow_its_file(tmp_path, ref):
    """A .pt file's tensors are read through a memory map; the loaded model keeps copies of its
    own, so writing over the file (a trainer saving its next epoch, or the model saved back to
    the path it came from) changes nothing in the live model and leaves a readable file."""
    path = tmp_path / "live.pt"
    torch.save(ref, path)
    model = load_model(path, preset="tiny")
    torch.save({k: torch.zeros_like(v) for k, v in ref.items()}, path)
    assert_same(model, ref)
    torch.save(model.state_dict(), path)
    assert_same(load_model(path, preset="tiny"), ref)


def test_trusted_pickles_may_name_classes_that_are_not_installed(tmp_path, ref, monkeypatch):
    """A training checkpoint pickles its run's own config objects; with trust_pickle=True their
    classes need not be importable (only the tensors are read). A trusted file whose unpickling
    fails is a CheckpointError naming the file."""
    import sys

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "trainer_cfg.py").write_text(
        "import dataclasses, enum\n"
        "class Mode(enum.Enum):\n    FAST = 1\n"
        "@dataclasses.dataclass\nclass TrainConfig:\n    lr: float = 1e-3\n    mode: Mode = Mode.FAST\n"
    )
    monkeypatch.syspath_prepend(str(package))
    import trainer_cfg

    torch.save({"model": ref, "cfg": trainer_cfg.TrainConfig()}, tmp_path / "run.pt")
    monkeypatch.delitem(sys.modules, "trainer_cfg")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(package)])
    with pytest.raises(CheckpointError, match="trust_pickle=True"):
        load_model(tmp_path / "run.pt", preset="tiny")
    assert_same(load_model(tmp_path / "run.pt", preset="tiny", trust_pickle=True), ref)

    class Fails:
        def __reduce__(self):
            return int, ("not a number",)

    torch.save({"model": ref, "x": Fails()}, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=r"could not read .*bad\.pt.*ValueError"):
        load_model(tmp_path / "bad.pt", preset="tiny", trust_pickle=True)


@pytest.mark.parametrize("prefix", ["model.", "net.model.", "module.model."])
def test_a_training_wrappers_attribute_prefix_is_removed(tmp_path, ref, prefix):
    """PyTorch Lightning saves a module held as `self.model` under 'state_dict' with keys
    'model.aggregator...': a prefix every key shares above the model's own parts goes."""
    torch.save({"state_dict": {prefix + k: v for k, v in ref.items()}, "epoch": 2}, tmp_path / "l.ckpt")
    assert_same(load_model(tmp_path / "l.ckpt", preset="tiny"), ref)


def test_a_shared_prefix_that_is_the_models_own_or_reveals_no_model_is_kept():
    z = torch.zeros(1)
    assert list(checkpoint_filter_fn({"aggregator.a.w": z, "aggregator.b.w": z})) == ["aggregator.a.w", "aggregator.b.w"]
    assert list(checkpoint_filter_fn({"backbone.a.w": z, "backbone.b.w": z})) == ["backbone.a.w", "backbone.b.w"]
    assert list(checkpoint_filter_fn({"model.w": z})) == ["model.w"]


def test_preset_auto_reports_a_damaged_checkpoint_against_the_preset_it_came_from(tmp_path, ref):
    """A tiny checkpoint missing one key fits no preset; "auto" reports it against the tiny
    model (the one key), not as a foreign file against the official one."""
    torch.save({k: v for k, v in ref.items() if k != "aggregator.camera_token"}, tmp_path / "d.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "d.pt", preset="auto")
    assert err.value.report.missing == ["aggregator.camera_token"]
    assert not err.value.report.mismatched and not err.value.report.unexpected
    assert "does not look like" not in str(err.value)


def test_a_partial_point_head_is_named_as_such(tmp_path, ref, point_ref):
    """Some point_head keys but not all: neither 'it has a point head' nor 'it has none'."""
    some = [k for k in point_ref if k.startswith("point_head.")][:3]
    torch.save({**ref, **{k: point_ref[k] for k in some}}, tmp_path / "pp.pt")
    with pytest.raises(CheckpointError) as err:
        load_model(tmp_path / "pp.pt", preset="tiny")
    n = sum(k.startswith("point_head.") for k in point_ref)
    message = str(err.value)
    assert f"point head is not the model's ({n - 3} of its {n} point_head keys missing, 0 unexpected)" in message
    assert "has no point head" not in message and "has a point head" not in message


def test_a_folder_without_the_named_checkpoint_lists_every_checkpoint_it_holds(tmp_path, no_hub):
    for name in ("pytorch_model.bin", "last.ckpt", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="Checkpoints in .*: last.ckpt, pytorch_model.bin;"):
        load_model(tmp_path)


def _save_packed(path: Path, tensors: dict[str, torch.Tensor], storage: str | None) -> Path:
    from mapstream.weights import int8

    save_file(tensors, str(path), metadata=None if storage is None else {int8.STORAGE_KEY: storage})
    return path


def test_weights_stored_in_8_bits_load_within_half_a_step_of_the_source(tmp_path, ref):
    from mapstream.weights import int8

    packed = int8.quantize(ref)
    large = [k for k, v in ref.items() if v.is_floating_point() and v.ndim >= 2 and v.numel() >= int8.MIN_NUMEL]
    assert large and [k for k in ref if packed[k].dtype == torch.int8] == large
    assert set(packed) == set(ref) | {k + int8.SCALE_SUFFIX for k in large}
    pos = "aggregator.patch_embed.pos_embed"  # [1, tokens, dim]: a scale per token, not one for the table
    assert ref[pos].shape[0] == 1 and packed[pos + int8.SCALE_SUFFIX].shape == (ref[pos].shape[1],)
    model = load_model(_save_packed(tmp_path / "w8.safetensors", packed, int8.INT8_ROWS), preset="tiny")
    assert model.load_report.ok
    state = model.state_dict()
    for key, value in ref.items():
        if key not in large:
            assert torch.equal(state[key], value), key
            continue
        scale = packed[key + int8.SCALE_SUFFIX]
        rows = scale.numel()
        assert scale.dtype == torch.float32
        # each row spans the full int8 range, and every weight comes back within half a step
        assert (packed[key].reshape(rows, -1).abs().amax(1) == 127).all(), key
        error = (state[key] - value).reshape(rows, -1).abs().amax(1)
        assert (error <= scale / 2 + 1e-7).all(), key
    stored = sum(packed[k].numel() for k in large)
    assert stored == sum(ref[k].numel() for k in large)  # one byte a weight


def test_8_bit_files_that_do_not_say_how_they_are_scaled_are_refused(tmp_path, ref):
    from mapstream.weights import int8

    packed = int8.quantize(ref)
    with pytest.raises(CheckpointError, match="does not say how they are scaled"):
        load_model(_save_packed(tmp_path / "bare.safetensors", packed, None), preset="tiny")
    with pytest.raises(CheckpointError, match="'int4'.*upgrade mapstream"):
        load_model(_save_packed(tmp_path / "int4.safetensors", packed, "int4"), preset="tiny")
    key = next(k for k in ref if packed[k].dtype == torch.int8)
    no_scale = {k: v for k, v in packed.items() if k != key + int8.SCALE_SUFFIX}
    with pytest.raises(CheckpointError, match=f"damaged: 8-bit tensor '{re.escape(key)}' has no scales"):
        load_model(_save_packed(tmp_path / "cut.safetensors", no_scale, int8.INT8_ROWS), preset="tiny")
    orphan = {k: v for k, v in packed.items() if k != key}
    with pytest.raises(CheckpointError, match="have no tensor"):
        load_model(_save_packed(tmp_path / "orphan.safetensors", orphan, int8.INT8_ROWS), preset="tiny")
    damaged = dict(ref, **{key: torch.full_like(ref[key], float("nan"))})
    with pytest.raises(ValueError, match="NaN or infinite"):
        int8.quantize(damaged)


def test_the_width_a_file_records_its_weights_were_trained_at_travels_with_them(tmp_path, ref, pt_file):
    """A safetensors file may record the frame width its weights were trained at (mapstream
    train's exports do): `load_model` reports it, runs take it by default, conversion keeps
    it; a file without the record, and any .pt file, take the official 518."""
    from mapstream.checkpoint import DEFAULT_IMAGE_SIZE, model_image_size, recorded_image_size

    recorded = tmp_path / "w294.safetensors"
    save_file(dict(ref), str(recorded), metadata={"image_size": "294"})
    model = load_model(recorded, preset="tiny")
    assert recorded_image_size(recorded) == 294 and model.load_report.image_size == 294
    assert model_image_size(model) == 294
    converted = convert_checkpoint(recorded, tmp_path / "converted.safetensors")
    assert recorded_image_size(converted) == 294
    plain = tmp_path / "plain.safetensors"
    save_file(dict(ref), str(plain))
    for path in (plain, pt_file):
        assert recorded_image_size(path) is None and load_model(path, preset="tiny").load_report.image_size is None
        assert model_image_size(load_model(path, preset="tiny")) == DEFAULT_IMAGE_SIZE == 518
    assert model_image_size(mapstream.build_model("tiny")) == 518  # built, not loaded
    for bad in ("wide", "0", "-14", "29.4"):
        save_file(dict(ref), str(tmp_path / "bad.safetensors"), metadata={"image_size": bad})
        with pytest.raises(CheckpointError, match=f"image_size={bad!r}.*not a width in pixels"):
            load_model(tmp_path / "bad.safetensors", preset="tiny")


def test_the_clip_length_a_file_records_its_weights_were_trained_on_travels_with_them(tmp_path, ref, pt_file):
    """A safetensors file may record the most frames one training clip held (mapstream train's
    exports do): `load_model` reports it, conversion keeps it; a file without the record, any
    .pt file and a built model report None; a record that is not a count is refused."""
    from mapstream.checkpoint import model_trained_views, recorded_trained_views

    recorded = tmp_path / "v48.safetensors"
    save_file(dict(ref), str(recorded), metadata={"trained_views": "48", "image_size": "294"})
    model = load_model(recorded, preset="tiny")
    assert recorded_trained_views(recorded) == 48 == model.load_report.trained_views == model_trained_views(model)
    assert model.load_report.image_size == 294
    converted = convert_checkpoint(recorded, tmp_path / "converted.safetensors")
    assert recorded_trained_views(converted) == 48
    plain = tmp_path / "plain.safetensors"
    save_file(dict(ref), str(plain))
    for path in (plain, pt_file):
        assert recorded_trained_views(path) is None and model_trained_views(load_model(path, preset="tiny")) is None
    assert model_trained_views(mapstream.build_model("tiny")) is None
    for bad in ("many", "0", "-8", "4.5"):
        save_file(dict(ref), str(tmp_path / "bad.safetensors"), metadata={"trained_views": bad})
        with pytest.raises(CheckpointError, match=f"trained_views={bad!r}.*not a count of frames"):
            load_model(tmp_path / "bad.safetensors", preset="tiny")


def test_the_names_the_command_line_takes_load_in_python(ref):
    """`load_model("small")` is the shipped small weights, built as the preset they record;
    `load_model("tiny")` the tiny preset's seeded synthetic weights (`--model tiny`)."""
    from mapstream.weights import small_weights

    small = load_model("small")
    auto = load_model(small_weights(), preset="auto")
    assert small.load_report.ok and small.load_report.image_size == 294
    assert list(small.state_dict()) == list(auto.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(small.state_dict().values(), auto.state_dict().values()))
    assert_same(load_model("tiny"), ref)


def test_a_file_that_records_its_preset_loads_as_that_preset_by_default(tmp_path, ref):
    from mapstream.checkpoint import recorded_preset
    from mapstream.weights import small_weights

    assert recorded_preset(small_weights()) == "small-deep"
    assert load_model(small_weights()).load_report.ok  # no preset="auto" needed
    path = tmp_path / "trained.safetensors"
    save_file({k: v.contiguous() for k, v in ref.items()}, path, metadata={"format": "pt", "preset": "tiny"})
    assert recorded_preset(path) == "tiny"
    assert_same(load_model(path), ref)
    with pytest.raises(CheckpointError, match="matches preset 'tiny'"):  # a preset given still wins
        load_model(path, preset="lingbot-map")
    save_file({k: v.contiguous() for k, v in ref.items()}, path, metadata={"preset": "no-such-preset"})
    assert recorded_preset(path) is None
