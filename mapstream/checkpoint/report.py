"""How a checkpoint's tensors match a model's: the report `load_model` attaches and the error
it raises."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

LIST_LIMIT = 8  # keys listed one by one before they are grouped by prefix


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked: not a state dict, pickled objects
    without `trust_pickle=True`, or keys/shapes that do not match the model (then
    `report` holds the details)."""

    def __init__(self, message: str, report: LoadReport | None = None) -> None:
        super().__init__(message)
        self.report = report



@dataclass
class LoadReport:
    """How a checkpoint's keys matched a model's state dict."""

    source: str
    model_keys: int
    missing: list[str] = field(default_factory=list)
    """In the model, not in the checkpoint (model order)."""
    unexpected: list[str] = field(default_factory=list)
    """In the checkpoint, not in the model (checkpoint order)."""
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    """(key, checkpoint shape, model shape) for keys in both with different shapes."""
    non_finite: list[str] = field(default_factory=list)
    """Keys of the model whose checkpoint tensor holds NaN or Inf (a damaged file, or one
    saved from a diverged run: every prediction would be NaN)."""
    point_head_keys: int = 0
    """The model's `point_head.*` keys (0 without a point head)."""
    image_size: int | None = None
    """The frame width the checkpoint records its weights were trained at (`IMAGE_SIZE_KEY`),
    None when it records none (the official checkpoints: trained at `DEFAULT_IMAGE_SIZE`)."""
    trained_views: int | None = None
    """The most frames one training clip held, as the checkpoint records (`TRAINED_VIEWS_KEY`);
    None when it records none (the official checkpoints)."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched or self.non_finite)

    @property
    def loaded(self) -> int:
        """Tensors taken from the checkpoint."""
        return self.model_keys - len(self.missing) - len(self.mismatched) - len(self.non_finite)

    def describe(self, *, preset: str | None = None, fits_preset: str | None = None) -> str:
        """A multi-line account of the differences, with what to do about them.

        `preset`: the model's preset; `fits_preset`: another preset the checkpoint matches."""
        if self.ok:
            return f"{self.source}: all {self.model_keys} tensors match the model"
        lines = [f"Checkpoint {self.source} does not match the model:"]
        if self.missing:
            lines.append(f"  {_count(self.missing, 'missing key')} (in the model, not in the checkpoint): "
                         f"{summarize_keys(self.missing)}")
        if self.unexpected:
            lines.append(f"  {_count(self.unexpected, 'unexpected key')} (in the checkpoint, not in the model): "
                         f"{summarize_keys(self.unexpected)}")
        if self.mismatched:
            shown = [f"{k}: checkpoint {list(c)} vs model {list(m)}" for k, c, m in self.mismatched[:LIST_LIMIT]]
            more = len(self.mismatched) - len(shown)
            lines.append(f"  {_count(self.mismatched, 'key')} with a different shape: " + "; ".join(shown)
                         + (f"; and {more} more" if more > 0 else ""))
        if self.non_finite:
            lines.append(f"  {_count(self.non_finite, 'tensor')} holding NaN or Inf values: "
                         f"{summarize_keys(self.non_finite)}")
        lines.extend(f"  -> {hint}" for hint in self._hints(preset, fits_preset))
        return "\n".join(lines)

    def _hints(self, preset: str | None, fits_preset: str | None) -> list[str]:
        hints = []
        found = self.model_keys - len(self.missing)
        if fits_preset is not None:
            hints.append(f"the checkpoint matches preset {fits_preset!r}: pass preset={fits_preset!r} "
                         "(or preset='auto')")
        elif found < self.model_keys / 2:
            hints.append(
                f"only {found} of the model's {self.model_keys} keys are in the checkpoint: it does not look "
                f"like a LingBot-Map checkpoint{f' for preset {preset!r}' if preset else ''} (wrong file or model?)"
            )
        extra_point = sum(k.startswith("point_head.") for k in self.unexpected)
        missing_point = sum(k.startswith("point_head.") for k in self.missing)
        if extra_point and not missing_point:
            hints.append("the checkpoint has a point head: build it with enable_point=True (or 'auto')")
        elif missing_point and not extra_point and missing_point == self.point_head_keys:
            hints.append("the checkpoint has no point head: use enable_point=False (or 'auto')")
        elif missing_point:
            hints.append(
                f"the checkpoint's point head is not the model's ({missing_point} of its {self.point_head_keys} "
                f"point_head keys missing, {extra_point} unexpected): a damaged file or another version of the head"
            )
        if self.mismatched:
            hints.append("different shapes mean another architecture: check the preset and overrides "
                         "(img_size, embed_dim, depth, ...)")
        if self.non_finite:
            hints.append("NaN or Inf weights make every prediction NaN: the file is damaged or comes from a "
                         "diverged training run; download or copy it again")
        if self.loaded:
            hints.append("in Python, load_model(..., strict=False) loads the matching tensors anyway (missing ones "
                         "keep their initial values, as do those holding NaN or Inf; unexpected ones are ignored)")
        return hints


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def summarize_keys(keys: list[str], limit: int = LIST_LIMIT) -> str:
    """All keys when few; else one entry per top-level module, e.g. "62 under point_head.*"
    (the prefix is the longest one the group's keys share)."""
    if len(keys) <= limit:
        return ", ".join(keys)
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(key.split(".", 1)[0], []).append(key)
    parts = []
    for members in groups.values():
        if len(members) == 1:
            parts.append(members[0])
            continue
        split = [m.split(".") for m in members]
        common = []
        for pieces in zip(*(s[:-1] for s in split)):
            if len(set(pieces)) > 1:
                break
            common.append(pieces[0])
        parts.append(f"{len(members)} under {'.'.join(common) or members[0].split('.')[0]}.*")
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f", and {more} more groups" if more > 0 else "")


def compare_keys(
    model_shapes: Mapping[str, torch.Size], state_dict: Mapping[str, torch.Tensor], source: str,
    *, check_values: bool = True,
) -> LoadReport:
    """Match a checkpoint's keys and shapes against the model's, and (`check_values`) find the
    tensors holding NaN or Inf."""
    report = LoadReport(source=source, model_keys=len(model_shapes),
                        point_head_keys=sum(k.startswith("point_head.") for k in model_shapes))
    for key, shape in model_shapes.items():
        if key not in state_dict:
            report.missing.append(key)
        elif tuple(state_dict[key].shape) != tuple(shape):
            report.mismatched.append((key, tuple(state_dict[key].shape), tuple(shape)))
        elif check_values and not _finite(state_dict[key]):
            report.non_finite.append(key)
    report.unexpected = [key for key in state_dict if key not in model_shapes]
    return report


def _finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in `t` (integer and boolean tensors always are); reads every page of a
    memory-mapped tensor, which loading does anyway."""
    if not (t.is_floating_point() or t.is_complex()) or t.is_meta:
        return True
    return bool(torch.isfinite(t).all())

