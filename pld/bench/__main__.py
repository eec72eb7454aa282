"""Entry point: ``python -m pld.bench [subcommand] [options]``; without a
subcommand (or with only options) it runs ``generation``."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from . import DEFAULT_SUBCOMMAND, SUBCOMMANDS
from .options import device_problem, out_folder_problem


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pld bench",
        description=f"pld benchmarks. Without a subcommand (options only): {DEFAULT_SUBCOMMAND}.")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    modules, parsers = {}, {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(f"{__package__}.{module_name}")
        modules[name] = module
        parsers[name] = p = sub.add_parser(name, help=help_text, description=module.__doc__,
                                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, DEFAULT_SUBCOMMAND)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    check_common(parsers[args.command], args)
    return int(modules[args.command].run(args) or 0)


def check_common(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options many subcommands share, checked before any of them
    loads a model: --out a folder that is or can be made, --device one
    this machine has. A usage error (SystemExit 2) naming the option."""
    for option, problem in (("out", out_folder_problem), ("device", device_problem)):
        value = getattr(args, option, None)
        message = problem(value) if value is not None else None
        if message:
            parser.error(f"argument --{option}: {message}")


if __name__ == "__main__":
    from pld.__main__ import run_command

    sys.exit(run_command("bench", sys.argv[1:]))
