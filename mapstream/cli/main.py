"""Entry point: `mapstream <command> [options]` (also `python -m mapstream`)."""
from __future__ import annotations

import logging
import sys
from typing import Annotated, Union

from .bench import Bench
from .export import Export
from .info import Info
from .render import Render
from .run import Run
from .tools import Convert, Eval
from .view import View


def _commands():
    import tyro

    commands = {
        "run": Run, "export": Export, "view": View, "render": Render, "eval": Eval, "convert": Convert,
        "bench": Bench, "info": Info,
    }
    return Union[tuple(Annotated[cls, tyro.conf.subcommand(name)] for name, cls in commands.items())]  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    import tyro

    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["--version"], ["-V"]):
        from .. import __version__

        print(f"mapstream {__version__}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)  # library warnings (e.g. windowed alignment) print as log lines
    command = tyro.cli(_commands(), args=args, prog="mapstream")
    try:
        return int(command.main() or 0)
    except (ValueError, OSError, RuntimeError, ImportError) as err:  # ImportError: an optional package
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; {getattr(command, 'ON_INTERRUPT', 'nothing was left half-written')}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
