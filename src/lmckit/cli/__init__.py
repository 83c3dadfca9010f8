"""The ``lmckit`` command line: parse and check the arguments, call one library function,
print what it returns. One module per command (its parser, the options that apply only in
some cases, the command itself); the argument types, progress bars and applicability checks
in their own modules.

Exit status: 0 on success; 2 for a command line that cannot be carried out (an argument out
of range, a path of the wrong kind, inputs that do not fit each other); 1 when a valid
command fails (an unreadable file, a diverged training run); 130 after Ctrl-C and 143 after
SIGTERM where a command handles it (``lmckit run``). Errors are one line on
stderr; ``lmckit --debug COMMAND ...`` shows the traceback instead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lmckit.cli.applicability import check_applicable, method_rules
from lmckit.cli.parser import OneLineParser, build_parser, commands, given_options
from lmckit.errors import LmcError, UsageError

__all__ = ["build_parser", "given_options", "main"]


def _fail(message: str, status: int) -> int:
    print(f"lmckit: error: {' '.join(message.split())}", file=sys.stderr)
    return status


def _check(args) -> None:
    module = commands()[args.command]
    family = getattr(module, "METHOD_FAMILY", None)
    rules = method_rules(family, args) if family else []
    check_applicable(args, [*rules, *module.APPLIES], module.NO_REPEATS)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    OneLineParser._argv = argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a one-line usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        args.given = given_options(argv)
        _check(args)
        return int(args.func(args) or 0)
    except Exception as exc:
        if args.debug:
            raise
        if isinstance(exc, UsageError):
            return _fail(str(exc), 2)
        if isinstance(exc, LmcError):
            return _fail(str(exc), 1)
        if isinstance(exc, BrokenPipeError):  # `lmckit info | head`
            sys.stderr.close()
            return 0
        if isinstance(exc, OSError):
            return _fail(f"{exc.strerror or exc}: {exc.filename or ''}", 1)
        return _fail(
            f"internal error ({type(exc).__name__}: {exc}); rerun with --debug for the "
            "traceback and please report it",
            1,
        )
    except KeyboardInterrupt as stop:
        from lmckit.errors import Terminated

        print("lmckit: interrupted; finished results are kept", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
