"""DPT dense head: four aggregator layers -> a per-pixel map (depth + confidence, or points).

Per frame, independently: each of the four token maps is normalised, projected (1x1 conv),
given a sin/cos position embedding and resampled to 4x, 2x, 1x and 1/2x of the patch grid;
a RefineNet-style fusion walks from coarse to fine, then two conv stages produce the
output at full image resolution.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.conv_epilogue import conv_epilogue
from ..layers.output_head import pointwise_output
from ..layers.resize import SeparableAddend, resize_bilinear

__all__ = ["DPTHead", "dpt_position_embedding", "dpt_position_tables"]


def _sincos_1d(coords: torch.Tensor, channels: int) -> torch.Tensor:
    """[N] coordinates -> [N, channels]: sines then cosines, frequencies 100^(-k/(channels/2))."""
    k = torch.arange(channels // 2, dtype=torch.float64, device=coords.device)
    omega = 1.0 / 100.0 ** (k / (channels / 2.0))
    angles = coords.to(torch.float64)[:, None] * omega[None]
    return torch.cat((angles.sin(), angles.cos()), dim=-1).float()


def dpt_position_embedding(
    channels: int, rows: int, cols: int, aspect: float, device: torch.device, ratio: float = 0.1
) -> torch.Tensor:
    """[channels, rows, cols] embedding of a centred uv grid spanning the image's aspect.

    x spans +-aspect/diag, y spans +-1/diag (diag = sqrt(aspect^2 + 1)), both shrunk by
    (n - 1)/n so that samples sit at cell centres; x-embedding first, then y.
    """
    return dpt_position_tables(channels, rows, cols, aspect, device, ratio).dense()


def dpt_position_tables(
    channels: int, rows: int, cols: int, aspect: float, device: torch.device, ratio: float = 0.1
) -> SeparableAddend:
    """`dpt_position_embedding` as its two tables: the first half of the channels varies
    along x only ([cols, channels / 2]), the second along y only ([rows, channels / 2])."""
    diag = math.sqrt(aspect**2 + 1.0)
    span_x, span_y = aspect / diag, 1.0 / diag
    u = torch.linspace(-span_x * (cols - 1) / cols, span_x * (cols - 1) / cols, cols, device=device)
    v = torch.linspace(-span_y * (rows - 1) / rows, span_y * (rows - 1) / rows, rows, device=device)
    half = channels // 2
    return SeparableAddend(_sincos_1d(u, half) * ratio, _sincos_1d(v, half) * ratio)


class _ResidualConvUnit(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(features, features, 3, padding=1)
        self.conv2 = nn.Conv2d(features, features, 3, padding=1)

    def forward(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """conv2(relu(conv1(relu(x)))) + relu(x), plus `extra` if given (the fusion block's
        running map, added in the same pass)."""
        # NOTE: the trained weights expect relu(x) on the skip path, not x (the original
        # implementation applied an in-place ReLU to its input).
        x = F.relu(x)
        hidden = conv_epilogue(self.conv1, x, relu=True)
        return conv_epilogue(self.conv2, hidden, adds=(x,) if extra is None else (x, extra))


class _FusionBlock(nn.Module):
    def __init__(self, features: int, *, has_skip: bool) -> None:
        super().__init__()
        self.out_conv = nn.Conv2d(features, features, 1)
        if has_skip:
            self.resConfUnit1 = _ResidualConvUnit(features)
        self.resConfUnit2 = _ResidualConvUnit(features)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None, size: tuple[int, int]) -> torch.Tensor:
        if skip is not None:
            x = self.resConfUnit1(skip, extra=x)  # x + unit(skip): addition commutes exactly
        x = self.resConfUnit2(x)
        return conv_epilogue(self.out_conv, resize_bilinear(x, size))


class _Scratch(nn.Module):
    def __init__(self, in_channels: tuple[int, ...], features: int, head_features: int, output_dim: int) -> None:
        super().__init__()
        for i, channels in enumerate(in_channels, start=1):
            setattr(self, f"layer{i}_rn", nn.Conv2d(channels, features, 3, padding=1, bias=False))
        for i in range(1, 5):
            setattr(self, f"refinenet{i}", _FusionBlock(features, has_skip=i != 4))
        self.output_conv1 = nn.Conv2d(features, features // 2, 3, padding=1)
        self.output_conv2 = nn.Sequential(
            nn.Conv2d(features // 2, head_features, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(head_features, output_dim, 1),
        )


class DPTHead(nn.Module):
    """Dense prediction from four [B, S, P, dim_in] token maps.

    activation "exp" (depth) or "inv_log" (points); the confidence is 1 + exp(last channel).
    """

    def __init__(
        self,
        dim_in: int,
        *,
        patch_size: int = 14,
        output_dim: int = 2,
        activation: str = "exp",
        features: int = 256,
        out_channels: tuple[int, int, int, int] = (256, 512, 1024, 1024),
        head_features: int = 32,
        chunk_frames: int = 8,
    ) -> None:
        super().__init__()
        if activation not in ("exp", "inv_log"):
            raise ValueError(f"activation must be 'exp' or 'inv_log', got {activation!r}")
        self.patch_size = patch_size
        self.activation = activation
        self.chunk_frames = chunk_frames
        self.norm = nn.LayerNorm(dim_in)
        self.projects = nn.ModuleList(nn.Conv2d(dim_in, oc, 1) for oc in out_channels)
        self.resize_layers = nn.ModuleList(
            [
                nn.ConvTranspose2d(out_channels[0], out_channels[0], 4, stride=4),
                nn.ConvTranspose2d(out_channels[1], out_channels[1], 2, stride=2),
                nn.Identity(),
                nn.Conv2d(out_channels[3], out_channels[3], 3, stride=2, padding=1),
            ]
        )
        self.scratch = _Scratch(tuple(out_channels), features, head_features, output_dim)
        # Position embeddings depend only on the frame size: computed once per size (about 10
        # small kernels each, five per frame) and kept; not a buffer, so not in the state dict.
        # The full-resolution one is kept as its two tables (`dpt_position_tables`), which the
        # resize to that size adds itself: as a map it would be features/2 x H x W floats,
        # ~100 MB at 504x378, read in full every frame.
        self._positions: dict[tuple, torch.Tensor | SeparableAddend] = {}

    def position_tables(self) -> list[torch.Tensor | SeparableAddend]:
        """The position embeddings kept now. A CUDA graph captured with this head reads them
        by address and holds this list: the cache may drop them for new frame sizes (it is
        bounded), and memory the graph still reads must not be freed and reused."""
        return list(self._positions.values())

    def _position(self, channels: int, rows: int, cols: int, aspect: float, like: torch.Tensor,
                  separable: bool = False) -> torch.Tensor | SeparableAddend:
        key = (channels, rows, cols, aspect, like.device, like.dtype, separable)
        emb = self._positions.get(key)
        if emb is None:
            if len(self._positions) >= 20:  # a stream of ever-new sizes must not grow memory
                self._positions.clear()
            tables = dpt_position_tables(channels, rows, cols, aspect, like.device)
            tables = SeparableAddend(tables.cols.to(like.dtype), tables.rows.to(like.dtype))
            emb = self._positions[key] = tables if separable else tables.dense()
        return emb

    def forward(
        self, layers: list[torch.Tensor], image_hw: tuple[int, int], patch_start_idx: int, trace=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (values [B, S, H, W, output_dim - 1], confidence [B, S, H, W])."""
        batch, num_frames = layers[0].shape[:2]
        flat = [t.reshape(batch * num_frames, *t.shape[2:]) for t in layers]
        values, confs = [], []
        for start in range(0, batch * num_frames, self.chunk_frames):
            chunk = [t[start : start + self.chunk_frames] for t in flat]
            value, conf = self._forward_frames(chunk, image_hw, patch_start_idx, trace)
            values.append(value)
            confs.append(conf)
        value = torch.cat(values).unflatten(0, (batch, num_frames))
        conf = torch.cat(confs).unflatten(0, (batch, num_frames))
        return value, conf

    @classmethod
    def for_config(cls, config, *, output_dim: int, activation: str) -> "DPTHead":
        """The head of a network of architecture `config` (a `ModelConfig`) reading its trunk's
        [frame, global] outputs, 2 x embed_dim wide."""
        return cls(
            2 * config.embed_dim, patch_size=config.patch_size, output_dim=output_dim, activation=activation,
            features=config.dpt_features, out_channels=config.dpt_out_channels,
            head_features=config.dpt_head_features_2, chunk_frames=config.dpt_chunk_frames,
        )

    def compile_parts(self, compile) -> None:
        """Use a compiled form of the per-chunk work (called once, when the network is built
        to be compiled with its heads)."""
        self._forward_frames = compile(self._forward_frames)

    def _forward_frames(self, layers, image_hw, patch_start_idx, trace):
        height, width = image_hw
        grid_h, grid_w = height // self.patch_size, width // self.patch_size
        aspect = width / height
        maps = []
        for i, tokens in enumerate(layers):
            x = self.norm(tokens[:, patch_start_idx:])
            # [N, h*w, C] -> [N, C, h, w] as a channels-last view, no copy: with the weights
            # channels-last too (`GCTStream.cast_for_inference`), cuDNN's NHWC convolutions
            # run without converting layouts around every call.
            x = x.reshape(x.shape[0], grid_h, grid_w, x.shape[-1]).permute(0, 3, 1, 2)
            x = conv_epilogue(self.projects[i], x)
            if trace:
                trace(f"dpt.projects.{i}", x)
            x = x + self._position(x.shape[1], grid_h, grid_w, aspect, x)
            resize = self.resize_layers[i]
            x = resize(x) if isinstance(resize, nn.Identity) else conv_epilogue(resize, x)
            if trace:
                trace(f"dpt.resize.{i}", x)
            maps.append(x)
        s = self.scratch
        r1, r2, r3, r4 = s.layer1_rn(maps[0]), s.layer2_rn(maps[1]), s.layer3_rn(maps[2]), s.layer4_rn(maps[3])
        if trace:
            for i, r in enumerate((r1, r2, r3, r4), start=1):
                trace(f"dpt.layer{i}_rn", r)
        out = s.refinenet4(r4, None, r3.shape[-2:])
        if trace:
            trace("dpt.refinenet4", out)
        out = s.refinenet3(out, r3, r2.shape[-2:])
        if trace:
            trace("dpt.refinenet3", out)
        out = s.refinenet2(out, r2, r1.shape[-2:])
        if trace:
            trace("dpt.refinenet2", out)
        out = s.refinenet1(out, r1, (2 * r1.shape[-2], 2 * r1.shape[-1]))
        if trace:
            trace("dpt.refinenet1", out)
        out = conv_epilogue(s.output_conv1, out)
        if trace:
            trace("dpt.output_conv1", out)
        size = (grid_h * self.patch_size, grid_w * self.patch_size)
        out = resize_bilinear(out, size, add=self._position(out.shape[1], *size, aspect, out, separable=True))
        # output_conv2 = (conv, ReLU, conv): the ReLU rides on the first convolution's pass.
        hidden = conv_epilogue(s.output_conv2[0], out, relu=True)
        if self.activation == "exp" and not trace:
            # the last convolution and both activations in one pass (the depth head)
            return pointwise_output(s.output_conv2[2], hidden)
        out = conv_epilogue(s.output_conv2[2], hidden)
        if trace:
            trace("dpt.output_conv2_logits", out)
        out = out.permute(0, 2, 3, 1)
        value, conf = out[..., :-1], out[..., -1]
        if self.activation == "exp":
            value = torch.exp(value)
        else:  # inverse of log(1 + |x|), sign kept
            value = torch.sign(value) * torch.expm1(value.abs())
        return value, 1 + torch.exp(conf)
