"""The step in graphs between the aggregator's eager cache attentions (`PiecewiseGraphs`)."""
from __future__ import annotations

import functools

import torch

from .graphs import GraphedStep
from .piece import KeyedPiece, Piece, weakly

__all__ = ["PiecewiseGraphs"]


class PiecewiseGraphs(GraphedStep):
    """Graph 0, the aggregator's cache attentions eagerly (exact key ranges, any backend's
    kernel) with a graph between each two, then the dense heads' graph beside the camera
    head's. The trunk serves a batch of streams (`BatchedPiecewiseGraphs`): one is the case
    of a session's own step."""

    def __init__(self, model, image_hw: tuple[int, int], *, capture: bool = True, conv_search: bool = True,
                 streams: int = 1) -> None:
        super().__init__(model, image_hw, capture=capture, conv_search=conv_search, streams=streams)
        depth = self.config.depth
        self.attended: list[torch.Tensor | None] = [None] * depth
        self.pieces = [self._first_piece]
        self.pieces += [Piece(weakly(self._middle, i), capture, self.pool) for i in range(1, depth)]
        self.pieces.append(Piece(self._last, capture, self.pool))
        self._dense_piece = Piece(self._dense, capture, self.pool, self._head_tables)
        # The camera head runs beside the dense heads on a second stream, so it needs
        # its own pool: graphs of one pool may reuse each other's temporaries, which is
        # only safe when they run one after the other.
        camera_pool = torch.cuda.graph_pool_handle() if capture else None
        self._camera = KeyedPiece(self._camera_head, capture, camera_pool, "camera head")
        self._outputs: list[tuple] = []

    def _run_trunk(self, first: tuple, steps: list, backend) -> None:
        """The trunk after graph 0 (whose outputs are `first`): each layer's cache attention
        eagerly, stream b (row b of the batch) against `steps[b]` only, then the piece that
        reads the results. Fills `_outputs`."""
        # The copies that do not involve this frame (window eviction into the trajectory
        # memory), for all layers at once: one kernel a cache instead of one between every layer.
        for step in steps:
            step.apply_moves()
        self._outputs = [first]
        key_norms = self.agg.key_norms()
        for i in range(self.config.depth):
            q, k, v = self._qkv(i)
            attend = functools.partial(backend.attend, key_norm=key_norms[i])
            if self.attended[i] is None or not self.capture:
                rows = [step.attend(i, q[b : b + 1], k[b : b + 1], v[b : b + 1], attend, moves_done=True)
                        for b, step in enumerate(steps)]
                self.attended[i] = _static_rows(rows) if self.capture else _joined(rows)
            else:  # straight into the static input of the graph that reads it
                for b, step in enumerate(steps):
                    into = self.attended[i][b : b + 1]
                    step.attend(i, q[b : b + 1], k[b : b + 1], v[b : b + 1],
                                lambda q, k, v: backend.attend_into(q, k, v, into, key_norm=key_norms[i]),
                                moves_done=True)
            self._outputs.append(self.pieces[i + 1]())

    def _middle(self, i: int) -> tuple:
        """The piece between cache attentions i - 1 and i."""
        return self.agg.between_layers(
            i, self._seq(i - 1), self.attended[i - 1], self.tokens_per_frame, self.frame_rotary,
            self.global_rotary, streams=self.streams,
        )

    def _camera_head(self) -> list[torch.Tensor] | None:
        return self._camera_poses(self._camera_token(*self._layer_outputs()))

    def _last(self) -> tuple:
        depth = self.config.depth
        return (self.agg.leave_layer(depth - 1, self._seq(depth - 1), self.attended[depth - 1]),)

    def _layer_outputs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's frame and global block outputs, from the pieces' static outputs."""
        depth = self.config.depth
        return [self._frame_out(i) for i in range(depth)], [self._outputs[i + 1][0] for i in range(depth)]

    def _dense(self) -> tuple:
        return (self._dense_heads(self._selected_layers(*self._layer_outputs())),)

    # Piece 0 returns a `LayerEntry`; piece i >= 1 a `LayerExit` (global block i-1's output,
    # then layer i's entry); piece `depth` a 1-tuple of the last global block's output.
    def _seq(self, i: int) -> torch.Tensor:
        return self._outputs[i].seq

    def _frame_out(self, i: int) -> torch.Tensor:
        return self._outputs[i].frame_out

    def _qkv(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self._outputs[i]
        return out.q, out.k, out.v

    def finish(self, first: tuple, state, store: bool, backend) -> dict[str, torch.Tensor]:
        # Graph 0 (embedding, frame block 0, global block 0's q/k/v) reads no cache: launched
        # by `start`, the GPU works on it while the host plans the cache step below, whose
        # copies queue behind it and still precede the first attention.
        with self._open_step(state.aggregator, store) as steps:
            self._run_trunk(first, steps, backend)
        if self.model.camera_head is None:
            (heads,) = self._dense_piece()
            return {k: v.clone() for k, v in heads.items()}
        with self._open_camera_steps(state, store):
            camera = self._camera.for_key(self.camera_device_step.storage_ptr)
            poses, (heads,) = self._side_by_side(camera, self._dense_piece)
            out: dict[str, torch.Tensor] = {k: v.clone() for k, v in heads.items()}
            poses = [p.clone() for p in poses]
        out["pose_enc"], out["pose_enc_list"] = poses[-1], poses
        return out


def _joined(rows: list[torch.Tensor]) -> torch.Tensor:
    """The streams' attention results [1, H, P, D] as one batch (`attend_streams`'s join)."""
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def _static_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """A buffer of its own holding the streams' attention results, for a graph to read and
    the later steps' attentions to write into. Row b is laid out as a kernel writes one
    stream's result (token-major, what `attend_into` fills without a copy): a single row
    keeps its own strides, several are stacked token-major."""
    if len(rows) == 1:
        return rows[0].clone()
    return torch.cat([row.transpose(1, 2) for row in rows]).transpose(1, 2)
