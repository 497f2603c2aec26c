"""Entry point: `mapstream <command> [options]` (also `python -m mapstream`)."""
from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Annotated, Union

from .bench import Bench
from .export import Export
from .info import Info
from .render import Render
from .run import Run
from .serve import Serve
from .stream import Stream
from .tools import Convert, Eval
from .train import Train
from .view import View


def _commands():
    import tyro

    commands = {
        "run": Run, "export": Export, "view": View, "render": Render, "eval": Eval, "convert": Convert,
        "bench": Bench, "info": Info, "train": Train, "serve": Serve, "stream": Stream,
    }
    return Union[tuple(Annotated[cls, tyro.conf.subcommand(name)] for name, cls in commands.items())]  # type: ignore[return-value]


def _configure_logging() -> None:
    """Log lines on stderr, one per record. huggingface_hub gives its loggers a handler of
    their own, and its records reach the root's handler as well: each of its warnings would
    print twice, so its handler goes and the root's prints them."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)  # library warnings (e.g. windowed alignment) print as log lines
    import huggingface_hub.utils.logging  # noqa: F401 - adds the handler, once, on import

    hub = logging.getLogger("huggingface_hub")
    for handler in list(hub.handlers):
        hub.removeHandler(handler)


def _logs_above_the_bars():
    """Log lines printed above the progress bars, which stay on the last line (a job's bar over
    its inputs lives through every input's log lines), where the log prints on the console;
    a context that changes nothing where it does not (the log captured elsewhere)."""
    import contextlib

    from tqdm.contrib.logging import logging_redirect_tqdm

    console = any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stderr, sys.stdout)
                  for h in logging.getLogger().handlers)
    return logging_redirect_tqdm() if console else contextlib.nullcontext()


def _bars_only_on_a_terminal(command, args: list[str]):
    """The command, made quiet when its stderr is no terminal (a log file, a pipe, CI) unless
    `--no-quiet` asks for bars there: a progress bar redraws itself, which a terminal shows in
    place and a log keeps line after line. An explicit `--quiet` is quiet everywhere."""
    from ..progress import stderr_is_terminal

    if getattr(command, "quiet", None) is False and "--no-quiet" not in args and not stderr_is_terminal():
        return dataclasses.replace(command, quiet=True)
    return command


def main(argv: list[str] | None = None) -> int:
    import tyro

    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["--version"], ["-V"]):
        from .. import __version__

        print(f"mapstream {__version__}")
        return 0
    _configure_logging()
    if args[:1] == ["train"]:
        from .train import parse_train

        try:
            parsed = parse_train(args[1:])  # a --config file's values are the flags' defaults
        except (ValueError, OSError) as err:  # the --config file: missing, not YAML, an unknown key
            print(f"error: {err}", file=sys.stderr)
            return 2
    else:
        parsed = tyro.cli(_commands(), args=args, prog="mapstream")
    command = _bars_only_on_a_terminal(parsed, args)
    try:
        with _logs_above_the_bars():
            return int(command.main() or 0)
    except (ValueError, OSError, RuntimeError, ImportError) as err:  # ImportError: an optional package
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; {getattr(command, 'ON_INTERRUPT', 'nothing was left half-written')}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
