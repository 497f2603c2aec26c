"""Procedural posed RGB-D sequences for tests and oracles (exact depth, known poses, CPU only).

See :mod:`mapstream.synthetic.sequence` for the entry points and :mod:`mapstream.synthetic.scene`
for the ray caster.
"""
from mapstream.synthetic.scene import Box, Scene, Sphere, Texture, make_scene, make_twin_scene
from mapstream.synthetic.sequence import (
    FIRST_TRAINING_SEED,
    SyntheticSequence,
    camera_path,
    load_sequence,
    look_at,
    render_sequence,
    write_sequence,
)

__all__ = [
    "FIRST_TRAINING_SEED",
    "Box",
    "Scene",
    "Sphere",
    "SyntheticSequence",
    "Texture",
    "camera_path",
    "load_sequence",
    "look_at",
    "make_scene",
    "make_twin_scene",
    "render_sequence",
    "write_sequence",
]
