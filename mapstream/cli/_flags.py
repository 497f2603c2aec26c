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
    for name in (f.name for f in dataclasses.fields(command) if "_" in f.name):
        message = re.sub(rf"(?:(?<=^)|(?<=[\s(])){name}(?=$|[\s,:;)])", "--" + name.replace("_", "-"), message)
    return message
