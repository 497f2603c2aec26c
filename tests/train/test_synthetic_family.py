"""Training clips of mapstream.synthetic's own family (render_sequence's rooms and orbit): a
share of the procedural draw, with scene seeds scoring never uses."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mapstream.synthetic import FIRST_TRAINING_SEED, camera_path, make_scene, render_sequence
from mapstream.synthetic.sequence import world_from_room
from mapstream.train.config import TrainConfig, load_config
from mapstream.train.data import ProceduralClips
from mapstream.train.render import SYNTHETIC_PATH, render_clips, sample_clip, synthetic_clip

HW = (56, 98)


def _angles(T_room_cam: np.ndarray) -> np.ndarray:
    """The cameras' angles on render_sequence's ellipse (radii 2.0 and 1.8 m)."""
    centres = T_room_cam[:, :3, 3]
    return np.unwrap(np.arctan2(centres[:, 1] / 1.8, centres[:, 0] / 2.0))


def test_a_family_clip_is_render_sequences_scene_and_path_with_a_training_seed():
    for seed in (0, 3, 101):
        clip = synthetic_clip(seed, 6, HW)
        scene_seed = FIRST_TRAINING_SEED + seed
        assert clip.path == SYNTHETIC_PATH and clip.seed == seed
        room = clip.scene.primitives[0]
        expected = make_scene(scene_seed, room_half_size=tuple(room.half_size))
        assert len(clip.scene.primitives) == len(expected.primitives) == 6
        for ours, theirs in zip(clip.scene.primitives, expected.primitives):
            assert ours.texture == theirs.texture
            np.testing.assert_array_equal(ours.center, theirs.center)
        # The room holds the path (ellipse radii 2.0 / 1.8 m, 1.3-1.5 m high) with room to spare.
        assert room.half_size[0] > 2.4 and room.half_size[1] > 2.2 and 2 * room.half_size[2] > 2.3
        np.testing.assert_array_equal(clip.T_world_room, world_from_room(scene_seed))
        # The path's start does not depend on the arc drawn; its steps are equal, 0.4-2 rad in all.
        np.testing.assert_allclose(clip.T_room_cam[0], camera_path(6, scene_seed)[0], atol=1e-12)
        steps = np.diff(_angles(clip.T_room_cam))
        np.testing.assert_allclose(steps, steps[0], atol=1e-9)
        assert 0.4 <= abs(steps.sum()) <= 2.0
        assert 50.0 <= clip.fov_x_deg <= 90.0
        np.testing.assert_allclose(clip.K[0, 0], (HW[1] / 2) / np.tan(np.radians(clip.fov_x_deg) / 2))
        # Not the scene scoring renders with the same small seed.
        assert clip.scene.primitives[0].texture != make_scene(seed).primitives[0].texture


def test_a_frame_step_multiplies_the_motion_between_frames():
    one, three = synthetic_clip(4, 5, HW), synthetic_clip(4, 5, HW, frame_step=3)
    np.testing.assert_allclose(np.diff(_angles(three.T_room_cam)), 3 * np.diff(_angles(one.T_room_cam)), rtol=1e-9)
    np.testing.assert_array_equal(three.T_room_cam[0], one.T_room_cam[0])


def test_the_share_decides_per_seed_and_leaves_the_other_clips_as_drawn_without_it():
    drawn = [sample_clip(s, 4, HW, synthetic_share=0.5) for s in range(200)]
    family = [c.path == SYNTHETIC_PATH for c in drawn]
    assert 70 <= sum(family) <= 130
    for seed, clip in enumerate(drawn):
        if family[seed]:
            np.testing.assert_array_equal(clip.T_room_cam, synthetic_clip(seed, 4, HW).T_room_cam)
        else:
            np.testing.assert_array_equal(clip.T_room_cam, sample_clip(seed, 4, HW).T_room_cam)
    assert all(sample_clip(s, 4, HW, synthetic_share=1.0).path == SYNTHETIC_PATH for s in range(20))
    assert not any(sample_clip(s, 4, HW, synthetic_share=0.0).path == SYNTHETIC_PATH for s in range(50))
    # A larger share keeps every clip a smaller share took from the family.
    wider = [sample_clip(s, 4, HW, synthetic_share=0.8).path == SYNTHETIC_PATH for s in range(200)]
    assert all(w for f, w in zip(family, wider) if f) and sum(wider) > sum(family)


def test_family_clips_render_as_render_sequence_renders_its_scenes():
    clip = synthetic_clip(2, 3, HW)
    K = np.repeat(clip.K[None], 3, 0)
    images, depth = render_clips([clip.scene], clip.T_room_cam[None], K[None], HW, "cpu", dtype=torch.float64)
    for i in range(3):
        rgb, d = clip.scene.render(clip.K, clip.T_room_cam[i], HW)
        np.testing.assert_allclose(depth[0, i].numpy(), d, rtol=1e-9)
        ours = np.round(images[0, i].permute(1, 2, 0).numpy() * 255)
        assert np.abs(ours - rgb).max() <= 1
        assert (d > 0).all()  # inside a closed room every ray hits
    # At render_sequence's own settings a family clip is render_sequence's frame for that seed.
    seq = render_sequence(2, HW, seed=FIRST_TRAINING_SEED + 2)
    rgb, d = make_scene(FIRST_TRAINING_SEED + 2).render(seq.K[0], camera_path(2, FIRST_TRAINING_SEED + 2)[0], HW)
    np.testing.assert_array_equal(seq.rgb[0], rgb)
    np.testing.assert_allclose(seq.depth[0], d, rtol=1e-6)


def test_procedural_batches_and_the_configuration_carry_the_share(tmp_path):
    data = ProceduralClips(4, 3, HW, synthetic_share=1.0, num_batches=1)
    batch = next(iter(data))
    for b, seed in enumerate(batch["seed"].tolist()):
        clip = synthetic_clip(seed, 3, HW)
        np.testing.assert_allclose(batch["T_world_cam"][b].numpy(), clip.T_world_cam, atol=1e-5)
        _, d = clip.scene.render(clip.K, clip.T_room_cam[1], HW)
        np.testing.assert_allclose(batch["depth"][b, 1].numpy(), d, rtol=1e-4)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("synthetic_share: 0.25\n")
    assert load_config(recipe).synthetic_share == 0.25
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="synthetic_share must lie in"):
            TrainConfig(synthetic_share=bad)
        with pytest.raises(ValueError, match="synthetic_share must lie in"):
            ProceduralClips(1, 2, HW, synthetic_share=bad)


def test_a_long_clip_travels_up_to_the_short_clips_fastest_pace_and_a_short_one_as_before():
    """Clips of up to 24 frames draw their arc from 0.4-2 rad whatever their length; a longer
    clip draws the same uniform number over 0.4 to 2 rad per 23 steps, so its first 24 frames
    are never faster than a 24-frame clip's fastest."""
    short = [abs(np.diff(_angles(synthetic_clip(s, 24, HW).T_room_cam)).sum()) for s in range(40)]
    assert all(0.4 <= a <= 2.0 for a in short)
    for seed in range(40):
        # At 6 frames the same arc as at 24: the draw does not depend on the length there.
        six = abs(np.diff(_angles(synthetic_clip(seed, 6, HW).T_room_cam)).sum())
        np.testing.assert_allclose(six, short[seed], atol=1e-9)
        # At 47 frames (46 steps) the bound doubles: arc = 0.4 + u (4 - 0.4) where the
        # 24-frame arc is 0.4 + u (2 - 0.4), u the same draw.
        long = abs(np.diff(_angles(synthetic_clip(seed, 47, HW).T_room_cam)).sum())
        u = (short[seed] - 0.4) / 1.6
        np.testing.assert_allclose(long, 0.4 + u * 3.6, atol=1e-9)
    longs = [abs(np.diff(_angles(synthetic_clip(s, 47, HW).T_room_cam)).sum()) for s in range(40)]
    assert max(longs) > 2.5 and min(longs) < 1.5  # long clips span slow and fast paces alike
