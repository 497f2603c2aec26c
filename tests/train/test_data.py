"""Training data: the torch renderer against mapstream.synthetic's CPU caster, the procedural
variety and its seeding, and users' posed folders in every format FolderClips reads."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mapstream.geometry import mat_to_quat, project_points, unproject_depth
from mapstream.synthetic import Box, Scene, Sphere, Texture, camera_path, make_scene, render_sequence, write_sequence
from mapstream.train.data import (
    FolderClips, ProceduralClips, model_intrinsics, seed_split, split_seed,
)
from mapstream.train.render import PATH_KINDS, render_clips, sample_clip

HW = (56, 56)


def _cpu(scene, cams, K, hw):
    out = [scene.render(K, T, hw) for T in cams]
    return np.stack([o[0] for o in out]), np.stack([o[1] for o in out])


def _compare(scene, cams, K, hw, dtype):
    rgb, depth = _cpu(scene, cams, K, hw)
    images, d = render_clips([scene], cams[None], K, hw, "cpu", dtype=dtype)
    assert images.shape == (1, len(cams), 3, *hw) and d.shape == (1, len(cams), *hw)
    ours = np.round(images[0].permute(0, 2, 3, 1).double().numpy() * 255)
    return rgb.astype(np.float64), depth, ours, d[0].double().numpy()


def _scenes():
    fx = (HW[1] / 2) / np.tan(np.radians(70) / 2)
    K = np.array([[fx, 0, HW[1] / 2], [0, fx, HW[0] / 2], [0, 0, 1.0]])
    spec = sample_clip(5, 3, HW)
    return [(make_scene(1), camera_path(3, 1), K), (spec.scene, spec.T_room_cam, spec.K)]


@pytest.mark.parametrize("case", [0, 1])
def test_render_float64_reproduces_the_cpu_caster(case):
    scene, cams, K = _scenes()[case]
    rgb, depth, ours, d = _compare(scene, cams, K, HW, torch.float64)
    assert ((d > 0) == (depth > 0)).all()
    np.testing.assert_allclose(d, depth, rtol=1e-9)
    assert np.abs(ours - rgb).max() <= 1 and (ours == rgb).mean() > 0.999


@pytest.mark.parametrize("case", [0, 1])
def test_render_float32_matches_the_cpu_caster(case):
    scene, cams, K = _scenes()[case]
    rgb, depth, ours, d = _compare(scene, cams, K, HW, torch.float32)
    both = (d > 0) & (depth > 0)
    assert (np.abs(d - depth)[both] <= 1e-4 * depth[both]).all()
    diff = np.abs(ours - rgb)
    assert diff.mean() < 0.05 and (diff <= 2).mean() > 0.995


def test_render_misses_match_except_at_silhouettes():
    """Objects without a room: the background is missed (depth 0), in the same pixels."""
    tex = Texture((0.8, 0.2, 0.1), (0.1, 0.3, 0.9), checker=0.2, noise=0.1, seed=3)
    R = np.array([[0.8, -0.6, 0.0], [0.6, 0.8, 0.0], [0.0, 0.0, 1.0]])
    scene = Scene([Box(np.array([0.3, 0.2, 0.4]), np.array([0.4, 0.3, 0.4]), tex, R=R),
                   Sphere(np.array([-0.5, 0.1, 1.2]), 0.35, tex)], lights=((0.2, 0.4, 0.9),), ambient=0.3)
    cams = np.tile(np.eye(4), (2, 1, 1))
    for i, pos in enumerate(([0.0, -1.8, 1.0], [1.4, -1.0, 1.5])):
        z = -np.asarray(pos) + [0, 0, 0.6]
        z /= np.linalg.norm(z)
        x = np.cross(z, [0, 0, 1.0])
        x /= np.linalg.norm(x)
        cams[i, :3, :3] = np.stack((x, np.cross(z, x), z), 1)
        cams[i, :3, 3] = pos
    K = np.array([[40.0, 0, 28], [0, 40.0, 28], [0, 0, 1]])
    rgb, depth, ours, d = _compare(scene, cams, K, HW, torch.float32)
    hit_cpu, hit = depth > 0, d > 0
    assert 0.1 < hit.mean() < 0.9
    edge = np.zeros_like(hit_cpu)
    edge[:, 1:] |= hit_cpu[:, 1:] != hit_cpu[:, :-1]
    edge[:, :, 1:] |= hit_cpu[:, :, 1:] != hit_cpu[:, :, :-1]
    edge[:, :-1] |= edge[:, 1:].copy()
    edge[:, :, :-1] |= edge[:, :, 1:].copy()
    assert ((hit != hit_cpu) & ~edge).sum() == 0
    assert (ours[~hit] == 0).all()


def test_render_chunks_and_batches_give_the_same_frames():
    specs = [sample_clip(s, 3, HW) for s in (2, 3)]
    cams, K = np.stack([s.T_room_cam for s in specs]), np.stack([s.K for s in specs])
    im, d = render_clips([s.scene for s in specs], cams, K, HW)
    im1, d1 = render_clips([specs[1].scene], cams[1:], K[1:], HW, chunk_frames=2)
    torch.testing.assert_close(im[1:], im1)
    torch.testing.assert_close(d[1:], d1)


def test_sampled_clips_vary_and_keep_cameras_clear():
    specs = [sample_clip(s, 6, HW) for s in range(40)]
    assert {s.path for s in specs} == set(PATH_KINDS)
    fovs = [s.fov_x_deg for s in specs]
    assert 45 <= min(fovs) and max(fovs) <= 90 and np.ptp(fovs) > 30
    rooms = np.array([s.scene.primitives[0].half_size for s in specs])
    assert np.ptp(rooms[:, 0]) > 2 and np.ptp(rooms[:, 2]) > 0.5
    counts = {len(s.scene.primitives) for s in specs}
    assert len(counts) >= 4
    assert {type(p) for s in specs for p in s.scene.primitives[1:]} == {Box, Sphere}
    assert len({s.scene.ambient for s in specs}) == 40 and {len(s.scene.lights) for s in specs} == {1, 2}
    assert len({s.scene.primitives[0].texture.noise for s in specs}) == 40
    for s in specs:
        pos = s.T_room_cam[:, :3, 3]
        half = s.scene.primitives[0].half_size
        assert (np.abs(pos[:, :2]) <= half[:2] - 0.5 + 1e-9).all()
        assert (pos[:, 2] >= 0.5 - 1e-9).all() and (pos[:, 2] <= 2 * half[2] - 0.5 + 1e-9).all()
        R = s.T_room_cam[:, :3, :3]
        np.testing.assert_allclose(R @ R.transpose(0, 2, 1), np.broadcast_to(np.eye(3), R.shape), atol=1e-12)
        assert np.allclose(np.linalg.det(R), 1)
        for p in s.scene.primitives[1:]:
            if isinstance(p, Sphere):
                assert (np.linalg.norm(pos - p.center, axis=1) - p.radius > 0.3).all()
            else:
                q = np.maximum(np.abs((pos - p.center) @ p.R) - p.half_size, 0)
                assert (np.linalg.norm(q, axis=1) > 0.3).all()


def test_splits_are_disjoint_and_ranks_share_out_one_batch():
    seeds = {sp: {split_seed(sp, i) for i in range(1000)} for sp in ("train", "val", "test")}
    assert not (seeds["train"] & seeds["val"]) and not (seeds["train"] & seeds["test"])
    assert not (seeds["val"] & seeds["test"])
    assert all(seed_split(s) == sp for sp, ss in seeds.items() for s in ss)
    one = ProceduralClips(4, 2, HW)
    two = [ProceduralClips(2, 2, HW, rank=r, world_size=2) for r in (0, 1)]
    for step in range(3):
        assert one.seeds(step) == two[0].seeds(step) + two[1].seeds(step)
    assert not set(ProceduralClips(2, 2, HW, split="val").seeds(0)) & set(one.seeds(0))
    with pytest.raises(ValueError):
        ProceduralClips(1, 2, (50, 56))
    with pytest.raises(ValueError):
        ProceduralClips(1, 2, HW, split="holdout")


def test_procedural_batches_are_reproducible_and_geometric():
    data = ProceduralClips(2, 3, (42, 56), num_batches=2, start_step=5)
    batches = list(data)
    assert len(batches) == len(data) == 2
    b = batches[0]
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in b.items()}
    assert shapes == {
        "images": ((2, 3, 3, 42, 56), torch.float32), "depth": ((2, 3, 42, 56), torch.float32),
        "valid": ((2, 3, 42, 56), torch.bool), "T_world_cam": ((2, 3, 4, 4), torch.float32),
        "K": ((2, 3, 3, 3), torch.float32), "seed": ((2,), torch.int64),
    }
    assert b["seed"].tolist() == data.seeds(5) and batches[1]["seed"].tolist() == data.seeds(6)
    again = ProceduralClips(2, 3, (42, 56)).batch(5)
    assert all(torch.equal(b[k], again[k]) for k in b)
    assert b["images"].min() >= 0 and b["images"].max() <= 1 and b["valid"].all()
    assert torch.equal(b["valid"], b["depth"] > 0)
    _reprojects(b)


def _reprojects(b) -> None:
    """Frame 0's surface seen from frame 1 lands where frame 1 sees it (poses camera-to-world,
    OpenCV axes, K of the integer pixel grid)."""
    clips, _, height, width = b["depth"].shape
    pts = unproject_depth(b["depth"][:, 0].double(), b["K"][:, 0].double(), b["T_world_cam"][:, 0].double())
    uv, z = project_points(pts.reshape(clips, -1, 3), b["K"][:, 1].double(), b["T_world_cam"][:, 1].double())
    u, v = uv[..., 0].round().long(), uv[..., 1].round().long()
    inside = (u >= 0) & (u < width) & (v >= 0) & (v < height) & (z > 0)
    assert inside.float().mean() > 0.3
    for c in range(clips):
        seen = b["depth"][c, 1][v[c][inside[c]], u[c][inside[c]]].double()
        rel = ((seen - z[c][inside[c]]).abs() / z[c][inside[c]])
        assert rel.median() < 0.02


def test_reused_batches_come_back_reversed_and_render_every_other_step():
    plain = ProceduralClips(2, 4, [(28, 42), (42, 56)])
    reused = ProceduralClips(2, 4, [(28, 42), (42, 56)], reuse_reversed=True)
    renders = []
    original = reused._render
    reused._render = lambda r: renders.append(r) or original(r)
    for step in range(4):
        got = reused.batch(step)
        want = plain.batch(step // 2)  # step k shows rendering k // 2: its seeds and its size
        assert got["seed"].tolist() == want["seed"].tolist() == reused.seeds(step)
        for key in ("images", "depth", "valid", "T_world_cam", "K"):
            assert torch.equal(got[key], want[key].flip(1) if step % 2 else want[key]), (step, key)
    assert renders == [0, 1]  # each rendering serves two steps


def test_mirrored_clips_are_posed_clips_of_the_mirrored_world():
    from mapstream.train.data import mirror_clips
    from mapstream.train.normalize import gt_pose_encoding, normalize_clip

    plain = ProceduralClips(2, 3, (42, 56)).batch(0)
    mirrored = mirror_clips(plain)
    assert torch.equal(mirrored["images"], plain["images"].flip(-1)) and torch.equal(mirrored["depth"][..., 0],
                                                                                       plain["depth"][..., -1])
    R = mirrored["T_world_cam"][..., :3, :3].double()
    assert torch.allclose(torch.linalg.det(R), torch.ones(2, 3, dtype=torch.float64), atol=1e-5)
    assert torch.equal(mirrored["K"][..., 0, 2], 55 - plain["K"][..., 0, 2])
    _reprojects(mirrored)  # the mirrored depth, poses and K agree with each other
    a, b = (gt_pose_encoding(normalize_clip(x), (42, 56)) for x in (plain, mirrored))
    torch.testing.assert_close(b[..., 0], -a[..., 0])  # the centres mirrored in x
    torch.testing.assert_close(b[..., 1:3], a[..., 1:3])
    torch.testing.assert_close(b[..., 3:7] * torch.tensor([1.0, -1, -1, 1]), a[..., 3:7], atol=1e-6, rtol=0)
    torch.testing.assert_close(b[..., 7:], a[..., 7:])  # same fields of view
    torch.testing.assert_close(normalize_clip(mirrored)["scale"], normalize_clip(plain)["scale"])

    both = ProceduralClips(2, 3, (42, 56), reuse_reversed=True, reuse_mirrored=True)
    renders = []
    original = both._render
    both._render = lambda r: renders.append(r) or original(r)
    views = [both.batch(step) for step in range(8)]
    assert renders == [0, 1]  # one rendering serves four steps
    want = [plain, {k: v.flip(1) for k, v in plain.items() if k != "seed"}, mirrored,
            {k: v.flip(1) for k, v in mirrored.items() if k != "seed"}]
    for view, expected in zip(views[:4], want):
        assert all(torch.equal(view[k], expected[k]) for k in ("images", "depth", "T_world_cam", "K"))
    assert views[4]["seed"].tolist() == both.seeds(4) == ProceduralClips(2, 3, (42, 56)).seeds(1)


def test_path_kinds_limit_the_camera_paths_drawn():
    assert {sample_clip(s, 4, HW, ["pan", "orbit"]).path for s in range(30)} == {"pan", "orbit"}
    assert {sample_clip(s, 4, HW).path for s in range(30)} == set(PATH_KINDS)
    assert sample_clip(3, 4, HW, ()).path == sample_clip(3, 4, HW).path  # empty means all
    data = ProceduralClips(2, 3, HW, path_kinds=["pan"])
    assert data.path_kinds == ("pan",) and data.batch(0)["images"].shape[:2] == (2, 3)
    with pytest.raises(ValueError, match=r"unknown camera path kinds \['spin'\]"):
        ProceduralClips(2, 3, HW, path_kinds=["spin"])


# ----------------------------------------------------------------------------- folders
@pytest.fixture(scope="module")
def sequence():
    """Three 168x126 frames: a 3x reduction lands each model pixel on one source pixel's centre."""
    return render_sequence(num_frames=3, image_hw=(126, 168), seed=4, fov_x_deg=60)


def _tum(seq, root):
    (root / "rgb").mkdir(parents=True)
    (root / "depth").mkdir()
    lines = {"rgb.txt": [], "depth.txt": [], "groundtruth.txt": []}
    for i, ts in enumerate(seq.timestamps + 100):
        Image.fromarray(seq.rgb[i]).save(root / "rgb" / f"{ts:.6f}.png")
        Image.fromarray(np.round(seq.depth[i] * 5000).astype(np.uint16)).save(root / "depth" / f"{ts:.6f}.png")
        lines["rgb.txt"].append(f"{ts:.6f} rgb/{ts:.6f}.png")
        lines["depth.txt"].append(f"{ts:.6f} depth/{ts:.6f}.png")
        q = mat_to_quat(torch.from_numpy(seq.T_world_cam[i, :3, :3])).tolist()
        lines["groundtruth.txt"].append(f"{ts:.6f} " + " ".join(f"{x:.12g}" for x in [*seq.T_world_cam[i, :3, 3], *q]))
    for name, content in lines.items():
        (root / name).write_text("# header\n" + "\n".join(content) + "\n")


def _images_and_depth(seq, root):
    (root / "images").mkdir(parents=True)
    (root / "depth").mkdir()
    for i in range(len(seq)):
        Image.fromarray(seq.rgb[i]).save(root / "images" / f"frame{i}.png")
        np.save(root / "depth" / f"frame{i}.npy", seq.depth[i])


def _colmap(seq, root):
    _images_and_depth(seq, root)
    model = root / "sparse" / "0"
    model.mkdir(parents=True)
    K = seq.K[0]
    params = " ".join(repr(float(v)) for v in (K[0, 0], K[1, 1], K[0, 2] + 0.5, K[1, 2] + 0.5))
    (model / "cameras.txt").write_text(f"# cams\n1 PINHOLE 168 126 {params}\n")
    lines = ["# images"]
    for i in reversed(range(len(seq))):  # COLMAP lists images in any order
        T = np.linalg.inv(seq.T_world_cam[i])
        x, y, z, w = mat_to_quat(torch.from_numpy(T[:3, :3])).tolist()
        pose = " ".join(repr(float(v)) for v in (w, x, y, z, *T[:3, 3]))
        lines += [f"{i + 1} {pose} 1 frame{i}.png", ""]
    (model / "images.txt").write_text("\n".join(lines) + "\n")


def _transforms(seq, root):
    _images_and_depth(seq, root)
    K = seq.K[0]
    frames = [{"file_path": f"images/frame{i}", "depth_file_path": f"depth/frame{i}.npy",
               "transform_matrix": (seq.T_world_cam[i] @ np.diag([1.0, -1, -1, 1])).tolist()} for i in range(len(seq))]
    meta = {"fl_x": K[0, 0], "fl_y": K[1, 1], "cx": K[0, 2] + 0.5, "cy": K[1, 2] + 0.5, "w": 168, "h": 126,
            "frames": frames[::-1]}
    (root / "transforms.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("fmt", ["benchmark", "tum", "colmap", "transforms"])
def test_folder_clips_read_every_format(fmt, sequence, tmp_path):
    root = tmp_path / fmt
    if fmt == "benchmark":
        write_sequence(sequence, root, depth_format="npy")
    else:
        {"tum": _tum, "colmap": _colmap, "transforms": _transforms}[fmt](sequence, root)
    data = FolderClips(tmp_path, batch_size=1, num_frames=2, image_size=56, shuffle=False, clip_step=1, epochs=1)
    assert data.image_hw == (42, 56) and len(data.clips) == 2 and len(data) == 2
    b = next(iter(data))
    assert b["images"].shape == (1, 2, 3, 42, 56) and b["seed"].tolist() == [0]
    torch.testing.assert_close(b["T_world_cam"][0], torch.tensor(sequence.T_world_cam[:2], dtype=torch.float32))
    if fmt == "tum":  # TUM's fixed 640x480 intrinsics, carried to the 168x126 photos and then to 56x42
        K_src, src_hw = np.array([[525.0, 0, 319.5], [0, 525.0, 239.5], [0, 0, 1]]), (480, 640)
        assert torch.equal(b["K"][0, 0], torch.tensor(model_intrinsics(K_src, src_hw, (126, 168), 56), dtype=torch.float32))
        depth_tol = 1e-4  # 16-bit PNG at 5000 per metre
    else:
        s = 56 / 168
        K = sequence.K[0]
        expected = np.array([[K[0, 0] * s, 0, (K[0, 2] + 0.5) * s - 0.5], [0, K[1, 1] * s, (K[1, 2] + 0.5) * s - 0.5],
                             [0, 0, 1]])
        assert torch.equal(b["K"][0, 0], torch.tensor(expected, dtype=torch.float32))
        depth_tol = 1e-5
        # The model-frame depth is what the caster sees through the carried K.
        K_model = model_intrinsics(K, (126, 168), (126, 168), 56)
        _, exact = _cpu(make_scene(4), camera_path(3, 4)[:2], K_model, (42, 56))
        rel = np.abs(b["depth"][0].double().numpy() - exact) / exact
        assert (rel < depth_tol).mean() > 0.995
    assert b["valid"].all() and b["depth"].max() < 20
    reference = torch.stack([torch.from_numpy(sequence.rgb[i]).permute(2, 0, 1) for i in range(2)]).float() / 255
    small = torch.nn.functional.avg_pool2d(reference, 3)
    assert (b["images"][0] - small).abs().mean() < 0.03


def test_folder_clips_split_between_ranks_and_epochs(sequence, tmp_path):
    write_sequence(sequence, tmp_path / "a", depth_format="npy")
    (tmp_path / "b").mkdir()
    for i in range(len(sequence)):  # a folder without depth: depth 0, valid False
        Image.fromarray(sequence.rgb[i]).save(tmp_path / "b" / f"{i}.png")
    meta = {"camera_angle_x": 1.0, "frames": [{"file_path": f"{i}.png", "transform_matrix": np.eye(4).tolist()}
                                              for i in range(len(sequence))]}
    (tmp_path / "b" / "transforms.json").write_text(json.dumps(meta))
    kw = dict(num_frames=1, image_size=28, seed=7, epochs=2)
    ranks = [FolderClips(tmp_path, 1, rank=r, world_size=2, **kw) for r in (0, 1)]
    assert ranks[0].steps_per_epoch == 3 and len(ranks[0]) == 6
    for epoch in range(2):
        ids = [i for d in ranks for s in range(3) for i in d.clip_ids(epoch * 3 + s)]
        assert sorted(ids) == list(range(6))
    assert ranks[0].clip_ids(0) != ranks[0].clip_ids(3) or ranks[0].clip_ids(1) != ranks[0].clip_ids(4)
    whole = FolderClips(tmp_path, 2, **kw)
    assert whole.clip_ids(1) == ranks[0].clip_ids(1) + ranks[1].clip_ids(1)
    b_clip = next(c for c, (i, _) in enumerate(whole.clips) if whole.sequences[i].name == "b")
    loaded = whole.load_clip(b_clip)
    assert not loaded["valid"].any() and (loaded["depth"] == 0).all()
    fx = 0.5 * 168 / np.tan(0.5) * (28 / 168)
    assert loaded["K"][0, 0, 0].item() == pytest.approx(fx, rel=1e-6)


def test_the_number_of_objects_follows_its_range():
    from mapstream.train.render import sample_clip

    counts = {len(sample_clip(s, 4, HW).scene.primitives) - 1 for s in range(30)}  # less the room
    assert min(counts) >= 3 and max(counts) <= 12 and len(counts) > 3
    busy = [len(sample_clip(s, 4, HW, objects=(20, 24)).scene.primitives) - 1 for s in range(10)]
    assert min(busy) >= 15 and max(busy) <= 24  # a few may find no place clear of the cameras
    assert [len(sample_clip(s, 4, HW, objects=(0, 0)).scene.primitives) for s in range(3)] == [1, 1, 1]
    # The default is the range (3, 12).
    a, b = sample_clip(7, 4, HW).scene.primitives, sample_clip(7, 4, HW, objects=(3, 12)).scene.primitives
    assert len(a) == len(b) and all(np.array_equal(p.center, q.center) for p, q in zip(a, b))
    data = ProceduralClips(2, 3, HW, objects=(20, 24))
    assert data.objects == (20, 24) and data.batch(0)["images"].shape[:2] == (2, 3)
    for bad in ((5, 2), (-1, 3)):
        with pytest.raises(ValueError, match="objects' number must be a range"):
            sample_clip(0, 4, HW, objects=bad)
    from mapstream.train.config import TrainConfig, from_dict

    assert from_dict({"scene_objects": [12, 30]}).scene_objects == (12, 30)
    with pytest.raises(ValueError, match="objects' number"):
        TrainConfig(scene_objects=(4, 1))


def test_a_frame_step_takes_every_kth_camera_of_a_longer_path():
    from mapstream.train.config import TrainConfig
    from mapstream.train.render import PATH_KINDS, sample_clip

    for seed in range(8):  # every path kind among them
        long = sample_clip(seed, 7, HW).T_room_cam
        stepped = sample_clip(seed, 3, HW, frame_step=3)
        np.testing.assert_array_equal(stepped.T_room_cam, long[::3])
        assert stepped.path == sample_clip(seed, 7, HW).path
    assert {sample_clip(s, 2, HW).path for s in range(8)} == set(PATH_KINDS)
    data = ProceduralClips(2, 3, HW, frame_step=2)
    poses = data.batch(0)["T_world_cam"].double().numpy()
    for b, seed in enumerate(data.seeds(0)):  # the clips' second frames are their paths' third cameras
        long = sample_clip(seed, 5, HW)
        np.testing.assert_allclose(poses[b, 1], long.T_world_room @ long.T_room_cam[2], atol=1e-5)
    with pytest.raises(ValueError, match="frame_step"):
        sample_clip(0, 3, HW, frame_step=0)
    with pytest.raises(ValueError, match="frame_step"):
        TrainConfig(frame_step=0)


def test_prefetched_scenes_give_the_same_batches_and_the_worker_stops():
    """--prefetch-scenes: the next rendering's clips are drawn in a worker process; every batch,
    through renderings, a jump to another step (a resume) and the dataset's end, equals the
    batch drawn in place, and close() ends the worker."""
    kwargs = dict(batch_size=2, num_frames=2, image_hw=(28, 42), reuse_reversed=True, frame_step=2, num_batches=5)
    plain = ProceduralClips(**kwargs)
    ahead = ProceduralClips(**kwargs, prefetch_scenes=True)
    try:
        for step in [0, 1, 2, 3, 4, 1, 0]:  # three renderings, then back (out of order)
            a, b = plain.batch(step), ahead.batch(step)
            assert all(torch.equal(a[k], b[k]) for k in a), step
        assert ahead._prefetch._ahead is not None and ahead._prefetch._ahead[0] == 1  # one rendering ahead
        ahead.batch(4)  # the last rendering (steps 4-5 of num_batches 5): nothing to draw past it
        assert ahead._prefetch._ahead is None
        pool = ahead._prefetch._pool
        workers = list(pool._processes.values())
        assert len(workers) == 1 and workers[0].is_alive()
    finally:
        ahead.close()
    workers[0].join(timeout=30)
    assert not workers[0].is_alive() and ahead._prefetch._pool is None
