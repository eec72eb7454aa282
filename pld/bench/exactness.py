"""Exactness on a device: the share of outputs identical to plain greedy
``generate`` on the same device, for every pld path and for transformers'
own prompt lookup.

    python -m pld bench exactness --device cuda --max-seconds 150

1. The architecture matrix's tiny models (pld.bench.arch_zoo), float32,
   on the device: prompts of 75-100 tokens, 40 new tokens, through
   ``pld.generate`` (linear drafts), ``draft_tree=True``,
   ``model.generate(prompt_lookup_num_tokens=10)`` under ``pld.enabled()``,
   a left-padded batch of 3 rows, transformers' own prompt lookup, and a
   seeded sampling run that must repeat; and whether greedy pld left
   torch's RNG states (the CPU's and the device's) as they were. Models
   run in the census's order, most used first, until --max-seconds.
2. A llama of real width (pld.bench.shapes ``wide``: hidden 2048, random
   weights) in each of --wide-dtypes, on --wide-prompts prompts: the same
   paths, greedy.

In float32 every path must be identical; in bfloat16 and float16 a wider
forward rounds differently from a one-token forward and a near tie can
flip (for transformers' prompt lookup as for pld's). Writes table.md and
results.json into --out.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
import warnings
from typing import Any, Callable, Dict, List

from . import arch_zoo, report, shapes

NEW = 40
LENGTHS = (90, 75, 100)
#: the architectures checked first (most used), then the rest of the census
FIRST = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "gpt2", "mixtral",
         "falcon+alibi", "mpt", "bloom", "gpt_neox", "starcoder2", "olmo2", "cohere2", "qwen2+sliding")
PATHS = ("pld.generate", "draft_tree", "enable", "batch", "transformers", "sampling repeats", "rng untouched")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--archs", default="all", help="'all' (the census) or comma-separated model types")
    p.add_argument("--max-seconds", type=float, default=150.0,
                   help="stop taking new architectures after this long (default 150)")
    p.add_argument("--wide-dtypes", default="float32,bfloat16,float16",
                   help="dtypes of the hidden-2048 llama ('' to skip; default %(default)s)")
    p.add_argument("--wide-shape", default="wide", help="its shape in pld.bench.shapes (default wide)")
    p.add_argument("--wide-prompts", type=int, default=6, help="its prompts a dtype (default 6)")
    p.add_argument("--out", default=os.path.join("bench-out", "exactness"))


class _PldLines(logging.Handler):
    """Collects the pld logger's warnings (the fallbacks' lines)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _outcome(check: Callable[[], bool]) -> str:
    try:
        return "identical" if check() else "differs"
    except Exception as error:  # noqa: BLE001 - every failure is reported, per path
        return f"error: {type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"


def _rng_states(device: Any) -> List[Any]:
    import torch

    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def check_model(model: Any, prompts: List[List[int]], pad: int, new: int = NEW,
                sampling: bool = True) -> Dict[str, str]:
    """Each path's outcome on ``model`` (on its device): "identical",
    "differs" or "error: ..."; {"refused": why} for a model pld's loop
    cannot serve."""
    import torch

    import pld
    from pld.hf_adapter import model_traits

    device = next(model.parameters()).device
    one = torch.tensor([prompts[0]], device=device)
    traits = model_traits(model)
    if traits.reason is not None:
        return {"refused": traits.reason}

    def generate(ids, **kw):
        with torch.no_grad():
            return model.generate(ids, pad_token_id=pad, max_new_tokens=new, eos_token_id=None, **kw)

    alone = [generate(torch.tensor([p], device=device), do_sample=False)[0, len(p):].tolist() for p in prompts]
    ids, mask = arch_zoo.left_padded(prompts, pad)

    def with_pld(**kw):
        return pld.generate(model, one, max_new_tokens=new, eos_token_id=None, **kw).new_tokens == alone[0]

    def enabled():
        with pld.enabled():
            return generate(one, do_sample=False, prompt_lookup_num_tokens=10)[0, one.shape[1]:].tolist() == alone[0]

    def batch():
        got = pld.generate(model, ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
                           eos_token_id=None)
        return got.new_tokens == alone

    def transformers_own():
        out = generate(one, do_sample=False, prompt_lookup_num_tokens=10)[0, one.shape[1]:].tolist()
        return out[:new] == alone[0]

    checks = {"pld.generate": with_pld, "draft_tree": lambda: with_pld(draft_tree=True), "enable": enabled,
              "batch": batch, "transformers": transformers_own,
              "sampling repeats": lambda: _sampling_repeats(model, one),
              "rng untouched": lambda: _rng_untouched(model, one, new)}
    return {name: _outcome(fn) if (sampling or name != "sampling repeats") else "not run"
            for name, fn in checks.items()}


def _sampling_repeats(model: Any, one: Any) -> bool:
    """Two seeded sampling runs of pld.generate give the same 12 tokens
    (the caller's RNG states come back after)."""
    import torch

    import pld

    runs = []
    forked = list(range(torch.cuda.device_count())) if one.device.type == "cuda" else []  # (manual_seed seeds every GPU)
    with torch.random.fork_rng(devices=forked):
        for _ in range(2):
            torch.manual_seed(11)
            runs.append(pld.generate(model, one, max_new_tokens=12, eos_token_id=None, do_sample=True,
                                     temperature=0.8).new_tokens)
    return runs[0] == runs[1] and len(runs[0]) == 12


def _rng_untouched(model: Any, one: Any, new: int) -> bool:
    """A greedy tree run leaves every RNG state of the device as it was."""
    import torch

    import pld

    before = _rng_states(one.device)
    pld.generate(model, one, max_new_tokens=new, eos_token_id=None, draft_tree=True)
    return all(torch.equal(a, b) for a, b in zip(before, _rng_states(one.device)))


def _zoo(args: argparse.Namespace, device: str, lines: _PldLines) -> Dict[str, Any]:
    import torch

    known = arch_zoo.model_types()
    chosen = known if args.archs == "all" else [a.strip() for a in args.archs.split(",") if a.strip()]
    unknown = [a for a in chosen if a not in known]
    if unknown:
        raise ValueError(f"--archs: unknown model types {unknown}; 'all' or some of {', '.join(known)}")
    order = [a for a in FIRST if a in chosen] + [a for a in chosen if a not in FIRST]
    results: Dict[str, Any] = {}
    start = time.perf_counter()
    for model_type in order:
        if time.perf_counter() - start > args.max_seconds:
            results[model_type] = {"left out": f"past --max-seconds {args.max_seconds:g}"}
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, reason = arch_zoo.census_one(model_type)
            if model is None:
                results[model_type] = {"left out": reason}
                continue
            del lines.lines[:]
            prompts = [arch_zoo.periodic_prompt(f"{model_type}-{i}", n) for i, n in enumerate(LENGTHS)]
            try:
                model.to(device)
                outcome = check_model(model, prompts, arch_zoo.VOCAB - 1)
            finally:
                model.to("cpu")  # (the census keeps its models)
        outcome["fallbacks"] = sorted(set(lines.lines))
        results[model_type] = outcome
        odd = ", ".join(f"{k} {v}" for k, v in outcome.items() if v != "identical" and k != "fallbacks")
        print(f"{model_type}: {odd or 'all identical'}", flush=True)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return results


def _wide(args: argparse.Namespace, device: str) -> Dict[str, Any]:
    import torch

    results: Dict[str, Any] = {}
    for dtype in [d.strip() for d in args.wide_dtypes.split(",") if d.strip()]:
        model = shapes.random_llama(args.wide_shape, getattr(torch, dtype), device)
        vocab = model.config.vocab_size
        per_prompt = []
        for i in range(args.wide_prompts):
            prompts = [arch_zoo.periodic_prompt(f"wide-{i}-{j}", 200 + 37 * j, vocab) for j in range(3)]
            per_prompt.append(check_model(model, prompts, 0, new=64, sampling=False))
        results[dtype] = per_prompt
        print(f"{args.wide_shape} {dtype}: " + ", ".join(
            f"{p} {sum(r[p] == 'identical' for r in per_prompt)}/{len(per_prompt)}" for p in PATHS[:5]), flush=True)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return results


def table(zoo: Dict[str, Any], wide: Dict[str, Any], wide_shape: str) -> str:
    """Identical outputs per path: the zoo's architectures, then the wide llama a dtype."""
    ran = {k: v for k, v in zoo.items() if "left out" not in v and "refused" not in v}
    refused = sorted(k for k, v in zoo.items() if "refused" in v)
    lines = ["| models | dtype | " + " | ".join(PATHS) + " |", "|---|---|" + "--:|" * len(PATHS)]
    if ran:
        lines.append(f"| architecture matrix ({len(ran)} tiny models) | float32 | " + " | ".join(
            _share([r[p] for r in ran.values()]) for p in PATHS) + " |")
    hidden = shapes.SHAPES.get(wide_shape, {}).get("hidden_size")
    for dtype, rows in wide.items():
        lines.append(f"| llama '{wide_shape}' (hidden {hidden}, random), {len(rows)} prompts | {dtype} | "
                     + " | ".join(_share([r[p] for r in rows]) for p in PATHS) + " |")
    odd = [f"- {name}: " + "; ".join(f"{p} {r[p]}" for p in PATHS if r[p] != "identical")
           for name, r in ran.items() if any(r[p] != "identical" for p in PATHS)]
    if refused:
        odd.append(f"- refused by pld's loop with a clear error (stateful or uncroppable): {', '.join(refused)}")
    return "\n".join(lines + ([""] + odd if odd else []))


def _share(outcomes: List[str]) -> str:
    counted = [o for o in outcomes if o != "not run"]
    if not counted:
        return "-"
    return f"{sum(o == 'identical' for o in counted)}/{len(counted)}"


def run(args: argparse.Namespace) -> int:
    device = shapes.resolve_device(args.device)
    lines = _PldLines()
    logging.getLogger("pld").addHandler(lines)
    try:
        zoo = _zoo(args, device, lines) if args.archs else {}
        wide = _wide(args, device)
    finally:
        logging.getLogger("pld").removeHandler(lines)
    caption = f"{device} ({shapes.describe_device(device)}); {shapes.versions_line()}"
    text = table(zoo, wide, args.wide_shape) + f"\n\n{caption}\n"
    report.save(args.out, text, {"device": device, "caption": caption, "zoo": zoo, "wide": wide})
    return 0
