"""usage: python -m pld COMMAND [OPTIONS]

commands:
  demo              prompt lookup against greedy on the embedded model
  bench             benchmarks (python -m pld bench --help; without a
                    subcommand, its `generation` speedup tables)
  export-model DIR  the embedded model as a folder vLLM loads

Each command takes --help."""
import sys


def main() -> int:
    commands = {"demo": "pld.bench.demo", "bench": "pld.bench.__main__", "export-model": "pld.export_model"}
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    import importlib

    command = sys.argv[1]
    try:
        return importlib.import_module(commands[command]).main(sys.argv[2:]) or 0
    except ValueError as error:  # a bad option or input file: the message names it
        print(f"python -m pld {command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
