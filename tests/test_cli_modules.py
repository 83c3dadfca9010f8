"""One module per command: each `lmckit` command lives in `lmckit/cli/<command>.py` with its
parser, its applicability rules and its command function, and no CLI module outgrows a
reading (400 lines)."""

import argparse
import inspect
from pathlib import Path

from lmckit.cli import build_parser
from lmckit.cli.parser import commands


def test_every_command_is_one_module_with_its_parser_rules_and_function():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    modules = commands()
    assert list(modules) == list(sub.choices)
    for name, module in modules.items():
        assert module.__name__ == f"lmckit.cli.{name}"
        assert callable(module.add_parser)
        assert isinstance(module.APPLIES, list) and isinstance(module.NO_REPEATS, tuple)
        func = sub.choices[name].get_default("func")
        assert func is getattr(module, f"cmd_{name}") and inspect.getmodule(func) is module


def test_no_cli_module_is_over_400_lines():
    import lmckit.cli

    folder = Path(lmckit.cli.__file__).parent
    sizes = {p.name: len(p.read_text().splitlines()) for p in folder.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}
