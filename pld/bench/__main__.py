"""Entry point: ``python -m pld.bench [subcommand] [options]``; without a
subcommand (or with only options) it runs ``generation``."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from . import DEFAULT_SUBCOMMAND, SUBCOMMANDS


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pld bench",
        description=f"pld benchmarks. Without a subcommand (options only): {DEFAULT_SUBCOMMAND}.")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(f"{__package__}.{module_name}")
        modules[name] = module
        p = sub.add_parser(name, help=help_text, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, DEFAULT_SUBCOMMAND)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
