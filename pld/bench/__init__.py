"""Benchmarks for pld, run as ``python -m pld.bench <subcommand> [options]``.

Subcommands (see ``python -m pld.bench --help``):

  lookup   time per generation step of the draft lookup against context
           length: plain-torch and transformers baselines, a pure-Python
           dict index, pld's one-shot C scan and pld.NgramIndex.

The modules here need the optional ``bench`` extras (numpy, matplotlib,
tqdm); torch and transformers are used when importable.
"""

#: subcommand name -> (module under pld.bench, one-line help)
SUBCOMMANDS = {
    "lookup": ("lookup", "time per step of the draft lookup vs context length"),
}

__all__ = ["SUBCOMMANDS"]
