"""python -m pld COMMAND: `demo` (prompt lookup vs greedy on the embedded
model), `bench` (benchmarks, see `python -m pld bench --help`) or
`export-model DIR` (the embedded model as a folder vLLM loads)."""
import sys


def main() -> int:
    commands = {"demo": "pld.bench.demo", "bench": "pld.bench.__main__", "export-model": "pld.export_model"}
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
