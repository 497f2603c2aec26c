"""Library errors in the command line's words."""
from __future__ import annotations

import dataclasses
import re


def as_flags(message: str, command) -> str:
    """``message`` with the option names the library gives as Python fields (`sliding_window`)
    written as the flags of ``command`` (a command's dataclass: `--sliding-window`). Only names
    with an underscore, standing as words of the sentence (at its start or after a space or an
    opening bracket, before a space, a comma, a colon or a closing bracket), so that plain
    words such as "model" and file names such as `image_size.png` stay as they are."""
    for name in (name for name in _flag_names(command) if "_" in name):
        message = re.sub(rf"(?:(?<=^)|(?<=[\s(])){name}(?=$|[\s,:;)])", "--" + name.replace("_", "-"), message)
    return message


def _flag_names(command) -> list[str]:
    """The field names of ``command`` that are flags, a nested dataclass's fields in its place
    (our nested flag groups, such as :class:`~mapstream.cli._cloud.PointCloudFlags`, are
    spelled without a prefix)."""
    names = []
    for f in dataclasses.fields(command):
        group = f.default_factory
        if group is not dataclasses.MISSING and dataclasses.is_dataclass(group):
            names += _flag_names(group)
        else:
            names.append(f.name)
    return names
