"""The ``lmckit`` argument parser, assembled from the commands' own modules (each adds its
subparser, declares the options that apply only in some cases and runs the command), with
one-line errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from lmckit import __version__
from lmckit.cli.arguments import RenamedOption


def commands() -> dict[str, ModuleType]:
    """The command modules by command name, in the order ``lmckit --help`` lists them."""
    from lmckit.cli import (
        analyze,
        demo,
        info,
        interpolate,
        match,
        merge,
        report,
        run,
        spec,
        status,
        train,
    )

    modules = (info, train, match, interpolate, analyze, demo, merge, run, spec, status, report)
    return {module.COMMAND: module for module in modules}


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors (usage is one ``--help`` away)."""

    _argv: list[str] | None = None  # what main() parses (sys.argv otherwise)

    def error(self, message: str) -> NoReturn:
        message = self._dash_value(message) or message
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

    def _dash_value(self, message: str) -> str | None:
        """argparse reads a value that starts with ``-`` (``--max-memory -1G``) as an option
        and says the option lacks its argument: say what was given instead."""
        import re

        found = re.fullmatch(r"argument (\S+): expected (one|at least one) argument", message)
        if found is None:
            return None
        names = found.group(1).split("/")
        argv = self._argv if self._argv is not None else sys.argv[1:]
        for i, token in enumerate(argv[:-1]):
            value = argv[i + 1]
            if (
                token in names
                and value.startswith("-")
                and value not in self._option_string_actions
            ):
                return (
                    f"argument {token}: {value!r} was read as an option, not as its value; "
                    f"write {token}={value} to give a value that starts with '-'"
                )
        return None


def build_parser() -> argparse.ArgumentParser:
    """The ``lmckit`` argument parser (method choices come from the registries, read from
    their plain-data catalog: help needs no torch)."""
    parser = OneLineParser(
        prog="lmckit",
        description="Align, merge and analyse neural networks modulo permutation symmetries.",
    )
    parser.add_argument("--version", action="version", version=f"lmckit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in commands().values():
        module.add_parser(sub)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.extend(_subparsers(sub))
    return out


def given_options(argv: Sequence[str]) -> frozenset[str]:
    """The destinations of the options ``argv`` sets explicitly (not by default): the same
    parser with every default suppressed leaves only those in the namespace."""
    shadow = build_parser()
    positionals = set()
    for parser in _subparsers(shadow):
        for action in parser._actions:
            if action.dest == "command":
                continue
            if isinstance(action, RenamedOption):
                action.announce = False  # the real parse says it once
            if action.option_strings:
                action.default = argparse.SUPPRESS
            else:  # argparse would run an optional positional's type on a string default
                action.default = None
                positionals.add(action.dest)
        parser._defaults.clear()
    namespace, _ = shadow.parse_known_args(list(argv))
    given = {k for k, v in vars(namespace).items() if k not in positionals or v is not None}
    return frozenset(given - {"command", "debug"})
