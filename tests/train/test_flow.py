import pytest
import torch

from mapstream.train.data import ProceduralClips
from mapstream.train.flow import FLOW_REFERENCES, PatchFlowHead, patch_flow_targets

PATCH = 14


def _sliding_clip(steps_m=(0.0, 0.5, 1.0)):
    """A camera sliding right (+x) in front of a wall 2 m away: 2 x 4 patches of 14 px,
    fx = 28, so a step of 0.5 m moves the wall 7 px (half a patch) left in the image."""
    S, H, W = len(steps_m), 28, 56
    depth = torch.full((1, S, H, W), 2.0)
    T = torch.eye(4).repeat(1, S, 1, 1)
    T[0, :, 0, 3] = torch.tensor(steps_m)
    K = torch.tensor([[28.0, 0, 28], [0, 28, 14], [0, 0, 1]]).expand(1, S, 3, 3)
    return depth, depth > 0, T, K


def test_a_sideways_slide_moves_every_patch_by_the_wall_s_parallax():
    flow, known = patch_flow_targets(*_sliding_clip(), PATCH)
    assert FLOW_REFERENCES == ("first", "previous")
    assert flow.shape == (1, 3, 8, 4) and known.shape == (1, 3, 8, 2)
    assert not known[0, 0].any()  # frame 0's references are itself
    columns = torch.arange(8) % 4  # patch centres at u = 7, 21, 35, 49
    # frame 1 (0.5 m right): its pixel u shows what frame 0 saw at u + 7
    assert known[0, 1, :, 0].tolist() == (columns < 3).tolist()  # u + 7 = 56 leaves the frame
    assert known[0, 1, :, 1].tolist() == (columns < 3).tolist()  # the previous frame is frame 0
    torch.testing.assert_close(flow[0, 1, columns < 3], torch.tensor([[0.5, 0.0, 0.5, 0.0]]).expand(6, 4))
    # frame 2 (1 m right): 14 px to frame 0, 7 px to frame 1
    assert known[0, 2, :, 0].tolist() == known[0, 2, :, 1].tolist() == (columns < 3).tolist()
    torch.testing.assert_close(flow[0, 2, columns < 3, 0], torch.ones(6))
    torch.testing.assert_close(flow[0, 2, columns < 3, 2], torch.full((6,), 0.5))
    torch.testing.assert_close(flow[..., 1::2], torch.zeros(1, 3, 8, 2), rtol=0, atol=1e-6)  # no vertical motion
    assert (flow[~known.repeat_interleave(2, -1)] == 0).all()


def test_a_point_hidden_from_the_reference_frame_has_no_known_flow():
    depth, valid, T, K = _sliding_clip()
    depth[0, 0, 6:9, 13:16] = 1.0  # something closer covers the wall where frame 1's patch (0, 0) looks
    flow, known = patch_flow_targets(depth, valid, T, K, PATCH)
    assert not known[0, 1, 0].any() and known[0, 1, 1].all()
    valid[0, 1, 7, 7] = False  # frame 1's centre pixel of patch (0, 0) without depth
    depth[0, 0] = 2.0
    _, known = patch_flow_targets(depth, valid, T, K, PATCH)
    assert not known[0, 1, 0].any() and known[0, 1, 1].all()


def test_known_flows_of_rendered_clips_land_on_the_same_surface_colour():
    batch = next(iter(ProceduralClips(2, 4, (56, 98), num_batches=1, start_step=3)))
    flow, known = patch_flow_targets(batch["depth"], batch["valid"], batch["T_world_cam"], batch["K"], PATCH)
    assert known.float().mean() > 0.3  # most patches of nearby frames are seen again
    images = batch["images"]
    rows = torch.arange(4) * PATCH + PATCH // 2
    cols = torch.arange(7) * PATCH + PATCH // 2
    v, u = (g.flatten() for g in torch.meshgrid(rows, cols, indexing="ij"))
    same, total = 0, 0
    for b in range(2):
        for s in range(1, 4):
            for r, ref in enumerate((0, s - 1)):
                for p in torch.nonzero(known[b, s, :, r]).flatten().tolist():
                    col = round(float(u[p] + PATCH * flow[b, s, p, 2 * r]))
                    row = round(float(v[p] + PATCH * flow[b, s, p, 2 * r + 1]))
                    here = images[b, s, :, v[p], u[p]]
                    there = images[b, ref, :, row - 1:row + 2, col - 1:col + 2].flatten(1)
                    same += bool(((there - here[:, None]).abs().max(0).values < 0.06).any())
                    total += 1
    assert total > 50 and same / total > 0.9


def test_the_flow_head_reads_four_numbers_per_patch():
    head = PatchFlowHead(16)
    assert head(torch.rand(2, 3, 5, 16)).shape == (2, 3, 5, 4)
    with pytest.raises(RuntimeError):
        head(torch.rand(2, 3, 5, 8))
