"""usage: python -m pld COMMAND [OPTIONS]

commands:
  demo              prompt lookup against greedy on the embedded model
  bench             benchmarks (python -m pld bench --help; without a
                    subcommand, its `generation` speedup tables)
  export-model DIR  the embedded model as a folder vLLM loads

Each command takes --help."""
import sys
from typing import List

COMMANDS = {"demo": "pld.bench.demo", "bench": "pld.bench.__main__", "export-model": "pld.export_model"}


def main() -> int:
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return run_command(sys.argv[1], sys.argv[2:])


def run_command(command: str, argv: List[str]) -> int:
    """Run COMMAND's main on ``argv``: a ValueError (a bad option or input
    file, its message naming it) is a usage error, 2, not a traceback."""
    import importlib

    try:
        return importlib.import_module(COMMANDS[command]).main(argv) or 0
    except ValueError as error:
        print(f"python -m pld {command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
