"""The planted look-alike: a room that looks the same after a half turn."""
import numpy as np

from mapstream.synthetic import make_scene, make_twin_scene, render_sequence
from mapstream.synthetic.sequence import look_at, pinhole_intrinsics


def test_two_cameras_half_a_turn_apart_see_the_same_image():
    scene = make_twin_scene(11)
    K = pinhole_intrinsics((42, 70), 70.0)
    here = look_at(np.array([2.0, 0.6, 1.3]), np.array([0.3, -0.2, 1.0]))
    there = look_at(np.array([-2.0, -0.6, 1.3]), np.array([-0.3, 0.2, 1.0]))
    rgb_here, depth_here = scene.render(K, here, (42, 70))
    rgb_there, depth_there = scene.render(K, there, (42, 70))
    np.testing.assert_array_equal(rgb_here, rgb_there)
    np.testing.assert_allclose(depth_here, depth_there, atol=1e-9)
    # ... while the same camera elsewhere sees something else, and a plain room is no twin.
    elsewhere = look_at(np.array([-2.0, 0.6, 1.3]), np.array([-0.3, -0.2, 1.0]))
    assert np.abs(scene.render(K, elsewhere, (42, 70))[0].astype(int) - rgb_here).mean() > 5
    plain = make_scene(11)
    assert np.abs(plain.render(K, here, (42, 70))[0].astype(int) - plain.render(K, there, (42, 70))[0]).mean() > 5


def test_a_twin_sequence_is_deterministic_and_differs_from_the_plain_one():
    a = render_sequence(3, (28, 42), seed=4, twin=True)
    b = render_sequence(3, (28, 42), seed=4, twin=True)
    np.testing.assert_array_equal(a.rgb, b.rgb)
    np.testing.assert_array_equal(a.T_world_cam, render_sequence(3, (28, 42), seed=4).T_world_cam)
    assert (a.rgb != render_sequence(3, (28, 42), seed=4).rgb).any()
