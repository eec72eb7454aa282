"""Benchmarks for pld, run as ``python -m pld.bench <subcommand> [options]``.

Subcommands (see ``python -m pld.bench --help``):

  lookup   time per generation step of the draft lookup against context
           length: plain-torch and transformers baselines, a pure-Python
           dict index, pld's one-shot C scan and pld.NgramIndex.
  generation
           tokens/s of greedy, transformers' prompt lookup and pld on
           Spec-Bench prompts, methods alternating per prompt.

The modules here need the optional ``bench`` extras (numpy, matplotlib,
tqdm); torch and transformers are used when importable.
"""

#: subcommand name -> (module under pld.bench, one-line help)
SUBCOMMANDS = {
    "lookup": ("lookup", "time per step of the draft lookup vs context length"),
    "generation": ("generation", "greedy vs transformers' prompt lookup vs pld, side by side"),
}

__all__ = ["SUBCOMMANDS"]
