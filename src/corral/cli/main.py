"""The entry point: parse the command line, dispatch, turn expected errors into exit statuses.

Kept to dispatch only, so that every command (`run`, `elect`, `status`, `release`,
`cache`, `lab`, and later `bench`) is a module that registers itself
through `add_parser(subparsers)`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

import corral
from corral.cli import _common, cache, elect, lab, release, run, status
from corral.errors import CorralError, LockError

__all__ = ["build_parser", "main"]

# One module per subcommand, in the order --help lists them. A module defines
# NAME, add_parser(subparsers) (which sets `handler` on its parser) and, when it
# runs a command given after `--`, TAKES_COMMAND = True.
COMMANDS: tuple[ModuleType, ...] = (run, elect, status, release, cache, lab)

EPILOG = f"""\
exit status (every command):
  0    success
{_common.COMMON_STATUSES}
see `corral COMMAND --help` for the statuses a command adds.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral",
        description="Distributed locks over Redis, SQLite and more, from the shell.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"corral {corral.__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(subparsers)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Cut `corral run NAME ... -- CMD ARGS` at the first `--`, before argparse sees it.

    argparse mangles a trailing command (it drops every `--` in it and can
    take its options for corral's own), so CMD must never reach it. Top-level
    options take no values, so the first word not starting with `-` is the
    subcommand.
    """
    takes_command = {module.NAME for module in COMMANDS if getattr(module, "TAKES_COMMAND", False)}
    for index, word in enumerate(argv):
        if word == "--":
            break
        if not word.startswith("-"):
            if word in takes_command and "--" in argv[index + 1 :]:
                cut = argv.index("--", index + 1)
                return argv[:cut], argv[cut + 1 :]
            break
    return argv, None


class _HideReportedLosses(logging.Filter):
    """The commands report a lost lock themselves, with what they did about it."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            record.name == "corral.lock"
            and isinstance(args, tuple)
            and len(args) == 1
            and isinstance(args[0], LockError)
        )


class _CliFormatter(logging.Formatter):
    """Marks the handler this module installed, so a second `main()` does not add another."""


def _setup_logging() -> None:
    """Show the library's warnings (renewal retries) as corral's own stderr lines."""
    logger = logging.getLogger("corral")
    if any(isinstance(h.formatter, _CliFormatter) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CliFormatter("corral: %(message)s"))
    handler.addFilter(_HideReportedLosses())
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run one corral command; returns the exit status instead of exiting, for embedding."""
    words = list(sys.argv[1:] if argv is None else argv)
    head, command = _split_command(words)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(head)
        if extra:
            hint = ""
            if getattr(args, "takes_command", False) and command is None:
                hint = "; give the command to run after --, as in `corral run NAME -- CMD`"
            parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else _common.EX_CONFIG
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return _common.EX_CONFIG
    args.command = command
    _setup_logging()
    try:
        result: int = handler(args)
    except _common.CliError as exc:
        _common.say(str(exc))
        return exc.status
    except CorralError as exc:
        _common.say(str(exc))
        return _common.status_for(exc)
    except KeyboardInterrupt:
        return _common.EX_INTERRUPTED
    return result
