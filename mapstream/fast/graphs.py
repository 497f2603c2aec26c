"""Single-frame streaming steps replayed from CUDA graphs.

An eager step launches thousands of small kernels from Python and leaves the GPU idle most
of the time. A graphed step replays them instead, in one of two forms (`graphed_step` picks):

**Whole step** (`WholeStepGraphs`; fast with backends that have `device_range`, such as our
Triton kernel; others fall back to masked attention over the whole arena): the step is two
graphs. The first is embedding, frame block 0 and global block 0's q/k/v (no cache read),
launched as soon as the frame is loaded; the second is everything else: the cache writes and
attentions, the other blocks, the heads, the camera head with its own cache. What changes
from frame to frame lives in device tensors (`mapstream.cache.DeviceStep`: write offsets and
visible key ranges; the RoPE angles); the cache copies that do not involve the frame
(trajectory bookkeeping) run eagerly before the second replay. The second graph is captured
again only when a cache's storage moves (new lease). The host's work per frame is a few small
copies and two replays, and the GPU embeds the frame while the host checks it and plans the
cache step.

**Pieces** (`PiecewiseGraphs`, the form for other backends): the aggregator's cache
attentions run eagerly (exact key ranges, any backend's kernel); the rest, whose shapes are
fixed by the frame size, is captured in pieces between them, and the camera head (its own
cache read through a `DeviceStep`, as in the whole step) is one more graph: eager, its ~200
small kernels cost the host more time a frame than the GPU spends on them:

    graph 0:   embed (ViT, special tokens) -> frame block 0 -> global block 0 inputs (q, k, v)
    eager:     cache attention of layer 0 (exact visible range, fastest kernel)
    graph i:   global block i-1 output -> frame block i -> global block i inputs
    ...
    graph 24:  global block 23 output
    graph 25:  the heads' input layers -> DPT head(s)          } side by side, on two
    graph 26:  camera token -> camera head (its own cache, key } streams: the camera head's
               range and write slots in device tensors; its    } small kernels fill the
               own memory pool)                                } gaps; it starts first

The trunk and DPT graphs share one memory pool and are replayed in capture order. Inputs
that change per frame (the image, the frame's time index, the attention results) are copied
into static buffers before the replays that read them; graph 0 rewrites the 3D-RoPE table's
time columns from the time index itself, so that the host launches one fill instead of the
half-dozen small ops of the columns. Graph 0 needs nothing from the cache, so `start`
launches it before the rest: a session starts it before it waits for the frame's value check
and plans the cache step, and the GPU embeds the frame while the host works.

`capture=False` runs the same code eagerly (no CUDA needed): the CPU tests use it to show
both decompositions compute the network's function.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable

import torch

from ..cache import DeviceStep, open_steps
from .streams import shared_stream
from ..layers import Rotary, patch_positions_2d, rope2d, rope3d_time_columns, rope3d_time_inv_freq
from ..models.aggregator import kv_dtype, stack_rotary
from ..models.gct import heads_without_autocast
from ..validation import ValueCheck
from .piece import Piece, conv_search

__all__ = ["GraphedStep", "StartedStep"]

log = logging.getLogger(__name__)


class GraphedStep:
    """The single-frame step of one stream at one frame size, replayed from graphs (see
    module docstring); `WholeStepGraphs` and `PiecewiseGraphs` are its two forms.

    Valid after the scale phase (every frame gets the special tokens' second copy). Build one
    per session and frame size (`graphed_step`); a call replaces the network's forward for
    one frame.
    """

    whole: bool = False
    """Whether the step after the first graph is one graph (`WholeStepGraphs`)."""

    def __init__(
        self, model, image_hw: tuple[int, int], *, capture: bool = True, conv_search: bool = True,
        streams: int = 1,
    ) -> None:
        """capture: capture and replay CUDA graphs (False: run the same decomposition eagerly,
        on any device). conv_search: let cuDNN time its convolution algorithms for the dense
        heads once per shape (its benchmark mode) instead of taking its heuristics' first
        choice (`piece.conv_search`). streams: the batch of independent streams, one frame
        each, that a step serves (`BatchedPiecewiseGraphs`; the static tensors are that wide)."""
        agg = model.aggregator
        c = model.config
        self.model, self.agg, self.config = model, agg, c
        self.capture, self.streams = capture, streams
        device = agg.camera_token.device
        height, width = image_hw
        self.image_hw = image_hw
        grid_h, grid_w = height // c.patch_size, width // c.patch_size
        self.grid = (grid_h, grid_w)
        self.frame = torch.zeros(streams, 1, 3, height, width, device=device)
        if capture and kv_dtype(agg.camera_token) != agg.camera_token.dtype:
            log.warning(
                "fast path: the aggregator's weights are %s under %s autocast, so every replayed step "
                "casts them again (several GB of memory traffic a frame); model.cast_for_inference(...) "
                "to the autocast dtype removes that", agg.camera_token.dtype, kv_dtype(agg.camera_token),
            )
        # After the scale phase every frame takes copy 1 of the camera, register and scale tokens.
        special = agg.special_tokens(1, stored=1, num_frame_for_scale=1).detach()
        self.special = special.expand(streams, -1, -1).clone()
        self.pos2d = patch_positions_2d(grid_h, grid_w, c.num_special_tokens, device)
        self.frame_rotary = rope2d(self.pos2d, c.head_dim, c.rope2d_frequency)
        self.tokens_per_frame = self.pos2d.shape[0]
        # One table per stream ([streams, 1, tokens, D/2]; each stream has its own time).
        self.global_rotary: Rotary | None = stack_rotary(
            [agg.global_rotary(0, 1, grid_h, grid_w, self.pos2d) for _ in range(streams)]
        )
        # The 3D RoPE's time frequencies, kept, and each frame's time index on the device (a
        # scalar, or [streams, 1, 1, 1] to broadcast over a stacked table): the graphs rewrite
        # the table's time columns from it (`_rotate_to_time`).
        self._time_inv_freq = (
            rope3d_time_inv_freq(c.rope3d_dims, c.rope3d_theta, device)
            if self.global_rotary is not None and c.enable_3d_rope else None
        )
        self._time = torch.zeros(() if streams == 1 else (streams, 1, 1, 1), dtype=torch.float64, device=device)
        self._time_value: tuple[int, ...] = (0,) * streams  # what `_time` holds (host mirror)
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.camera_device_step = DeviceStep(1, device)
        # The second stream: the camera head beside the dense heads, and the session's value
        # check of the frame beside graph 0 (None without capture: everything runs in order).
        self.side_stream = shared_stream(device, "side") if capture else None
        self.conv_search = conv_search
        self._frame_loaded = torch.cuda.Event() if capture else None  # the frame's copy done
        # Graph 0 reads no cache: both modes launch it first (`start`).
        self._first_piece = Piece(self._first, capture, self.pool)

    def _head_tables(self) -> list:
        """The dense heads' position tables, which their graphs read (`DPTHead.position_tables`)."""
        heads = (self.model.depth_head, self.model.point_head)
        return [table for head in heads if head is not None for table in head.position_tables()]

    # ------------------------------------------------------------------ per-frame inputs
    def _load_frame(self, frame: torch.Tensor, caches) -> None:
        """Copy the frames (one a stream) and their time indices (each cache's frames stored
        so far) into the static inputs of the first graph."""
        self.frame.copy_(frame)
        self._set_time([cache.frames_stored for cache in caches])

    def _set_time(self, frames_stored: list[int]) -> None:
        """Make `_time` hold `frames_stored` (one count a stream). Each step sets it for the
        next frame once its own cache step is planned, while the GPU is busy (`StartedStep`):
        the next start then skips the fill unless a reset or a later keyframe decision changed
        the count."""
        value = tuple(frames_stored)
        # A fill a changed count: queued kernels, where a copy from host memory would make
        # the host wait for the GPU's queue.
        for b, (now, before) in enumerate(zip(value, self._time_value)):
            if now != before:
                (self._time if self.streams == 1 else self._time[b]).fill_(float(now))
        self._time_value = value

    @property
    def first_graph_captured(self) -> bool:
        """Whether starting a step replays the captured first graph (no capture pending)."""
        return self._first_piece.graph is not None

    def _rotate_to_time(self) -> None:
        """Point the global blocks' rotation table at the time in `_time`, in place (the
        captured graphs read these very buffers); runs inside the first graph. Only the 3D
        RoPE's time columns depend on the frame, and computing them on the device spares the
        host the small ops of rebuilding the table while the GPU waits."""
        if self._time_inv_freq is None:
            return  # no global RoPE, or a 2D one: the table is the same for every frame
        cos, sin = rope3d_time_columns(self._time, self._time_inv_freq)
        self.global_rotary.cos[..., : cos.shape[-1]].copy_(cos)
        self.global_rotary.sin[..., : sin.shape[-1]].copy_(sin)

    # ------------------------------------------------------------------ the first graph
    def _first(self) -> tuple:
        self._rotate_to_time()
        tokens = self.agg.embed(self.frame, self.special)
        return self.agg.enter_layer(0, tokens, self.frame_rotary, self.global_rotary, streams=self.streams)

    def _camera_token(self, frames: list[torch.Tensor], globals_: list[torch.Tensor]) -> torch.Tensor:
        """The camera head's input [streams, 1, 2C]: the camera token of the last selected layer,
        frame and global outputs side by side (what `_selected_layers` holds at token 0),
        built by the camera head's own graph so that it starts before the dense heads' input
        layers are assembled."""
        last = self.config.selected_layers[-1]
        token = globals_[last].view(self.streams, 1, self.tokens_per_frame, -1)[:, :, 0]
        return torch.cat((frames[last][:, :, 0], token), dim=-1).to(self.model.head_dtype)

    def _selected_layers(self, frames: list[torch.Tensor], globals_: list[torch.Tensor]) -> list[torch.Tensor]:
        """The layers the heads read: frame and global outputs side by side, heads' dtype."""
        return [
            torch.cat((frames[i], globals_[i].view(self.streams, 1, self.tokens_per_frame, -1)), dim=-1)
            .to(self.model.head_dtype)
            for i in self.config.selected_layers
        ]

    def _dense_heads(self, layers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The dense heads' outputs (fp32)."""
        # No timing inside a capture: a convolution whose search missed would time its candidates
        # there (synchronising, which breaks the capture); the warm-up before it did the search.
        search = self.conv_search and self.capture and not torch.cuda.is_current_stream_capturing()
        with heads_without_autocast(self.frame.device), conv_search(search):
            return self.model.dense_heads(layers, self.image_hw, self.config.num_special_tokens)

    def _camera_poses(self, token: torch.Tensor) -> list[torch.Tensor] | None:
        """The camera head on the camera token [1, 1, 2C] (`_camera_token`), its cache attention
        read through the camera DeviceStep (graph-safe). Per-iteration poses, fp32."""
        head = self.model.camera_head
        if head is None:
            return None
        backend = head.attention_backend(self.frame.device, self.model.head_dtype)
        with heads_without_autocast(self.frame.device):
            poses = head.refine(
                token,
                lambda layer, q, k, v: self.camera_device_step.attend(layer, q, k, v, backend),
            )
        return [p.float() for p in poses]

    def _camera_steps(self, state, store: bool):
        """Open the camera cache's step for this frame (none without a camera head); a
        context manager yielding the list of steps."""
        head = self.model.camera_head
        caches = [state.camera] if head is not None else []
        return open_steps(
            caches, [store] * len(caches), num_frames=1,
            layout=lambda _: head.cache_layout(2 * self.config.embed_dim), dtype=self.model.head_dtype,
            device=self.frame.device,
        )

    def _open_camera_steps(self, state, store: bool):
        """`_camera_steps`, each loaded into the camera DeviceStep (write slots, key range)."""
        return _prepared(self._camera_steps(state, store), self.camera_device_step)

    # ------------------------------------------------------------------ one step
    def __call__(self, frame: torch.Tensor, state, *, store: bool, backend) -> dict[str, torch.Tensor]:
        """frame [1, 1, 3, H, W], its values already checked; returns the model's outputs for
        it (pose_enc, depth, ...)."""
        with self._on_device():
            first = self._begin(frame, state)
        return StartedStep(self, frame, first, None)(frame, state, store=store, backend=backend)

    def start(self, frame: torch.Tensor, state) -> StartedStep:
        """Begin the step of `frame` [1, 1, 3, H, W] with what needs no cache: load the
        frame, launch the first graph, then the frame's value check beside it (on the second
        stream, `StartedStep.values`). Returns the step's second half, to call with the same
        frame and state once the check has passed; until then the caches are untouched, so a
        caller may still abandon the step, and meanwhile the GPU is busy with the first graph
        instead of waiting for the host (whose work before that launch is the step's only
        idle GPU time in a protocol that synchronizes after every frame)."""
        with self._on_device():
            first = self._begin(frame, state)
            values = ValueCheck(self.frame, stream=self.side_stream, ready=self._frame_loaded)
        return StartedStep(self, frame, first, values)

    def _begin(self, frame: torch.Tensor, state) -> tuple:
        """Load the frame (marking `_frame_loaded`) and launch the first graph."""
        self._load_frame(frame, [state.aggregator])
        if self._frame_loaded is not None:
            self._frame_loaded.record()
        return self._first_piece()

    def _on_device(self):
        """Streams, captures and replays belong to the model's GPU, whichever is current."""
        return torch.cuda.device(self.frame.device) if self.capture else contextlib.nullcontext()

    def _open_step(self, cache, store: bool):
        """Open the aggregator cache's step for the frame (a context manager yielding [step])."""
        return self._open_steps([cache], [store])

    def _open_steps(self, caches, stores):
        """Open each stream's aggregator cache step for its frame (a context manager yielding
        the steps, in stream order)."""
        def layout(cache):
            return self.agg.cache_layout(self.tokens_per_frame, cache, self.grid)

        return open_steps(caches, stores, num_frames=1, layout=layout, dtype=kv_dtype(self.special),
                          device=self.frame.device)

    def finish(self, first: tuple, state, store: bool, backend) -> dict[str, torch.Tensor]:
        """The step after the first graph (whose outputs are `first`): the cache attentions
        and the rest of the network, on `state`'s caches with the aggregator's `backend`."""
        raise NotImplementedError

    def _side_by_side(self, side: Callable[[], object], main: Callable[[], object]) -> tuple:
        """(side(), main()): `side` on the second stream while `main` runs on the current one,
        both after all work already queued; the current stream waits for both. Used for
        replays (pieces mode) and inside a capture (whole-step mode: the fork and join become
        parallel branches of the graph). The camera head is a chain of ~220 small kernels
        that leave much of the GPU idle; beside the dense head it costs less than after it."""
        if self.side_stream is None:
            return side(), main()
        current = torch.cuda.current_stream()
        self.side_stream.wait_stream(current)
        with torch.cuda.stream(self.side_stream):
            side_out = side()
        main_out = main()
        current.wait_stream(self.side_stream)
        return side_out, main_out


@contextlib.contextmanager
def _prepared(steps, device_step: DeviceStep):
    """Enter `steps` (a context manager of cache steps) and load each into `device_step`."""
    with steps as opened:
        for step in opened:
            device_step.prepare(step)
        yield opened


class StartedStep:
    """The second half of a `GraphedStep.start`ed step: call it once, with the frame and
    state the step was started with, to run the rest (the cache attentions, the heads)."""

    def __init__(self, graphed: GraphedStep, frame: torch.Tensor, first: tuple | None, values: ValueCheck | None) -> None:
        self._graphed, self._shape, self._first = graphed, frame.shape, first
        # The frame's value check started beside the first graph (`GraphedStep.start`; None
        # when the caller checked the values itself): wait for it before calling.
        self.values = values
        self._done = False

    def __call__(self, frame: torch.Tensor, state, *, store: bool, backend) -> dict[str, torch.Tensor]:
        if frame.shape != self._shape:
            raise ValueError(f"a started step finishes with its own frame {list(self._shape)}, got {list(frame.shape)}")
        if self._done:
            raise RuntimeError("this step has already run; start a new one for the next frame")
        self._done = True
        g = self._graphed
        with g._on_device():
            out = g.finish(self._first, state, store, backend)
            # Queued behind this step's work, off the next step's start (graph 0 of this
            # step has read `_time` already: same stream).
            g._set_time([state.aggregator.frames_stored])
        return out
