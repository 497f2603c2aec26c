"""Import the optional export libraries (``pip install 'mapstream[export]'``) with a clear error."""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["import_optional"]


def import_optional(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise ImportError saying what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = module.split(".")[0]
        raise ImportError(
            f"{purpose} needs the '{package}' package: pip install 'mapstream[export]'"
        ) from error
