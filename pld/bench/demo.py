"""The main job: prompt lookup against plain greedy on one prompt that copies
from its input, on the embedded model (offline) or a model you name."""
from __future__ import annotations

import argparse
import inspect
import os
import platform
import sys
import time
from typing import Any, Dict, List, Optional

from .options import DTYPES, at_least

DEFAULT_TASK = (
    "Here is a Python function:\n\n```python\n{code}```\n\n"
    "Rewrite this function with the parameter `text` renamed to `source`. "
    "Keep everything else the same and output the complete function."
)


def default_prompt() -> str:
    """A code-editing request over standard-library source (on every machine)."""
    import textwrap

    return DEFAULT_TASK.format(code=inspect.getsource(textwrap.indent))


def build_input_ids(tokenizer: Any, prompt: str) -> Any:
    from ..models import chat_template_ids

    ids = chat_template_ids(tokenizer, [{"role": "user", "content": prompt}])
    return ids if ids is not None else tokenizer(prompt, return_tensors="pt").input_ids


#: Plain runs whose times differ among themselves by more than this (the
#: A/A pair's spread, over their median) mean a machine too busy to tell.
NOISE = 0.10


def _timed(fn) -> tuple:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def alternating(plain, lookup, repeats: int) -> tuple:
    """([(output, seconds)] of plain, the same of lookup): ``repeats``
    pairs, the one going first alternating (plain first in even pairs), so
    that a machine's drift hits both alike."""
    plains, lookups = [], []
    for i in range(repeats):
        for fn, into in ((plain, plains), (lookup, lookups))[::(1 if i % 2 == 0 else -1)]:
            into.append(_timed(fn))
    return plains, lookups


def verdict(plain_seconds, lookup_seconds, n_plain: int, n_lookup: int) -> dict:
    """The comparison of alternating runs: each pair's speedup (tokens/s of
    pld over plain), their median, min and max; the spread of the plain
    runs among themselves ((max - min) / median, the A/A noise); and
    ``noisy`` when that spread passes NOISE or the pairs disagree on
    which is faster."""
    import statistics

    ratios = [(n_lookup / tl) / (n_plain / tp) for tp, tl in zip(plain_seconds, lookup_seconds)]
    spread = (max(plain_seconds) - min(plain_seconds)) / statistics.median(plain_seconds)
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "pairs": len(ratios),
            "spread": spread, "noisy": spread > NOISE or min(ratios) < 1.0 < max(ratios)}


#: draft sources the demo cannot show: "corpus" drafts from a pld.Corpus of
#: earlier calls, and the demo makes one call
NOT_IN_DEMO = ("corpus",)


def _sources() -> Dict[str, str]:
    """The draft sources --drafts offers: name -> what it drafts."""
    from ..drafts import describe

    return {n: t for n, t in describe().items() if n not in NOT_IN_DEMO}


def _drafts(value: str) -> str:
    """--drafts: 'linear', 'tree' or registered source names (argparse type)."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if value in ("linear", "tree") or (names and all(n in _sources() for n in names)):
        return value
    raise argparse.ArgumentTypeError(f"expected 'linear', 'tree' or sources from {list(_sources())}, got {value!r}")


def _draft_options(drafts: str) -> dict:
    if drafts in ("linear", "tree"):
        return {"draft_tree": drafts == "tree"}
    return {"draft_sources": tuple(n.strip() for n in drafts.split(",") if n.strip())}


def _parser() -> argparse.ArgumentParser:
    """The demo's command line: `python -m pld demo` options."""
    parser = argparse.ArgumentParser(prog="python -m pld demo", description=__doc__)
    parser.add_argument("--model", default=None,
                        help="a local folder, a .gguf file, or a Hub id (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--prompt-file", default=None, help="read the prompt from this file")
    parser.add_argument("-k", "--num-pred-tokens", type=at_least(1), default=10, help="draft length (default 10)")
    parser.add_argument("--max-ngram", type=at_least(1), default=3, help="largest n-gram to match (default 3)")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=256)
    parser.add_argument("--drafts", default="linear", type=_drafts,
                        help="'linear' (one draft a step, the default), 'tree' (a token tree of "
                             "several under a width budget), or draft sources by name, comma-separated: "
                             + "; ".join(f"{n}: {t}" for n, t in _sources().items()))
    parser.add_argument("--sample", action="store_true", help="sample (temperature 0.7, top-p 0.9) instead of greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--color", choices=["auto", "ansi", "plain"], default="auto")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--repeats", type=at_least(1), default=3,
                        help="pairs of plain and pld runs, alternating (default 3): the median speedup, "
                             "its spread, and whether the machine was too busy to tell")
    return parser


#: the longest prompt file read (bytes)
MAX_PROMPT_BYTES = 16 << 20


def read_prompt(path: str) -> str:
    """The prompt in ``path``: a regular UTF-8 text file of at most
    MAX_PROMPT_BYTES (a ValueError naming --prompt-file otherwise; read
    before the model loads)."""
    if not os.path.isfile(path):
        raise ValueError(f"--prompt-file: {path!r} is not a regular file")
    with open(path, "rb") as fh:
        raw = fh.read(MAX_PROMPT_BYTES + 1)
    if len(raw) > MAX_PROMPT_BYTES:
        raise ValueError(f"--prompt-file: {path!r} is longer than {MAX_PROMPT_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--prompt-file: {path!r} is not UTF-8 text ({error.reason})") from None


def _print_setup(args: argparse.Namespace, input_ids: Any) -> None:
    """Print the model/versions line and the prompt/settings line (then a
    blank line)."""
    import torch
    import transformers

    import pld
    from .. import models

    name = args.model or models.EMBEDDED_NAME
    print(f"model: {name} | {args.dtype} | CPU threads {torch.get_num_threads()} | "
          f"torch {torch.__version__} | transformers {transformers.__version__} | pld {pld.__version__} | "
          f"Python {platform.python_version()}")
    print(f"prompt: {input_ids.shape[1]} tokens; k={args.num_pred_tokens}, max n-gram {args.max_ngram}, "
          f"{'sampling' if args.sample else 'greedy'}, {args.drafts} drafts, "
          f"up to {args.max_new_tokens} new tokens\n")


def _plain_and_lookup(args: argparse.Namespace, model: Any, input_ids: Any) -> tuple:
    """(plain, lookup): zero-argument callables that generate from input_ids
    with model.generate() and with pld.generate(), each reseeding torch with
    --seed first, greedy or (--sample) temperature 0.7, top-p 0.9."""
    import torch

    import pld

    sampling = dict(do_sample=True, temperature=0.7, top_p=0.9) if args.sample else dict(do_sample=False)
    plain_kwargs = dict(max_new_tokens=args.max_new_tokens, **sampling)
    if not args.sample:
        plain_kwargs.update(temperature=None, top_p=None, top_k=None)

    def plain():
        torch.manual_seed(args.seed)
        with torch.no_grad():
            return model.generate(input_ids, **plain_kwargs)

    def lookup():
        torch.manual_seed(args.seed)
        return pld.generate(model, input_ids, max_new_tokens=args.max_new_tokens,
                            prompt_lookup_num_tokens=args.num_pred_tokens,
                            max_matching_ngram_size=args.max_ngram,
                            **_draft_options(args.drafts),
                            **({"do_sample": True, "temperature": 0.7, "top_p": 0.9} if args.sample else {}))

    return plain, lookup


def _warm_up(model: Any, input_ids: Any, drafts: str) -> None:
    """Generate 8 tokens from the last 64 prompt tokens with model.generate()
    and pld.generate(): first calls pay for allocation and lazy
    initialisation, kept out of the timings."""
    import torch

    import pld

    warm = input_ids[:, -64:]
    with torch.no_grad():
        model.generate(warm, max_new_tokens=8, do_sample=False)
    pld.generate(model, warm, max_new_tokens=8, **_draft_options(drafts))


def _print_comparison(args: argparse.Namespace, tokenizer: Any, input_ids: Any, plains: list,
                      lookups: list, on_kernel: Optional[tuple]) -> bool:
    """Print pld's rendered output, then the comparison lines (identical
    text, both rates, the median speedup of the alternating pairs and its
    spread, a line when the machine was too noisy to tell, the kernel's
    share when on_kernel is given, tokens per forward). plains, lookups:
    (output, seconds) as _timed returns, a pair each. Returns whether
    every pld output is token for token plain's."""
    import statistics

    base, result = plains[0][0], lookups[0][0]
    n_base = base.shape[1] - input_ids.shape[1]
    n_pld = len(result.new_tokens)
    mode = args.color if args.color != "auto" else ("ansi" if sys.stdout.isatty() else "plain")
    print(result.render(tokenizer, mode=mode))
    print()
    same = all(b[0, input_ids.shape[1]:].tolist() == r.new_tokens for (b, _), (r, _) in zip(plains, lookups))
    stats = result.stats
    t_base = statistics.median(t for _, t in plains)
    t_pld = statistics.median(t for _, t in lookups)
    v = verdict([t for _, t in plains], [t for _, t in lookups], n_base, n_pld)
    print(f"identical text:        {'yes' if same else 'no'}"
          + ("" if same or not args.sample else " (sampling: a different draw is expected)"))
    print(f"plain generate():      {n_base} tokens in {t_base:.2f} s = {n_base / t_base:.1f} tokens/s"
          f"{_median_of(len(plains))}")
    print(f"prompt lookup (pld):   {n_pld} tokens in {t_pld:.2f} s = {n_pld / t_pld:.1f} tokens/s"
          f"{_median_of(len(lookups))}")
    print(f"speedup:               {v['median']:.2f}x" + (
        f" (median of {v['pairs']} alternating pairs: {v['min']:.2f}-{v['max']:.2f}x; plain runs "
        f"{100 * v['spread']:.0f}% apart)" if v["pairs"] > 1 else ""))
    if v["pairs"] > 1 and v["noisy"]:
        print(f"noise:                 the machine was too busy to tell: plain runs differed by "
              f"{100 * v['spread']:.0f}% among themselves"
              + (" and the pairs disagree on which is faster" if v["min"] < 1.0 < v["max"] else "")
              + "; run again when it is idle (or with more --repeats)")
    if on_kernel is not None:
        rate_kernel = (on_kernel[0].shape[1] - input_ids.shape[1]) / on_kernel[1]
        print(f"  of which the kernel: {rate_kernel / (n_base / t_base):.2f}x (plain generate() with pld's "
              f"oneDNN linear layers: {rate_kernel:.1f} tokens/s), prompt lookup: "
              f"{(n_pld / t_pld) / rate_kernel:.2f}x")
    print(f"tokens per forward:    {stats.tokens_per_step:.2f} "
          f"({n_pld} tokens in {stats.steps} forward passes; {stats.accepted_draft_tokens}/"
          f"{stats.proposed_tokens} draft tokens accepted; {100 * stats.forward_share:.0f}% of the "
          f"time in the forward pass)")
    return same


def _median_of(n: int) -> str:
    return f" (median of {n})" if n > 1 else ""


def main(argv: Optional[List[str]] = None) -> int:
    """Run the demo; 0 when pld's text is greedy's (or --sample), else 1."""
    args = _parser().parse_args(argv)

    import torch

    from .. import models
    from ..cpu_kernels import LinearKernel

    torch.manual_seed(args.seed)
    prompt = read_prompt(args.prompt_file) if args.prompt_file else default_prompt()
    model, tokenizer = models.load(args.model, dtype=args.dtype)
    input_ids = build_input_ids(tokenizer, prompt)
    _print_setup(args, input_ids)
    plain, lookup = _plain_and_lookup(args, model, input_ids)
    _warm_up(model, input_ids, args.drafts)

    # plain greedy on the linear kernel pld's loop uses: what the kernel
    # alone gives (on a CPU where oneDNN beats torch's default product)
    kernel = LinearKernel(model)

    def plain_on_kernel():
        with kernel.routing():
            return plain()

    plains, lookups = alternating(plain, lookup, args.repeats)
    on_kernel = _timed(plain_on_kernel) if kernel.active and not args.sample else None
    same = _print_comparison(args, tokenizer, input_ids, plains, lookups, on_kernel)
    return 0 if (same or args.sample) else 1


if __name__ == "__main__":
    sys.exit(main())
