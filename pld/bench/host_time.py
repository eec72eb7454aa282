"""Host time per step: what a generation spends outside the model's
forwards, per forward, for pld and for transformers' own prompt lookup
(and plain greedy), at long contexts.

    python -m pld bench host-time --device cuda --contexts 1024,16384 --prompts 3

For each context T, each prompt is T tokens: Spec-Bench (or built-in)
documents run together and cut to length, then a request to summarise
them, through the chat template (a model without a tokenizer, such as
``shape:7b``, gets a periodic random prompt). Every method generates once
per context as a warm-up (pld's one-time cost calibration happens there),
then the methods take turns prompt by prompt. Forward time comes from
hooks on the model with the device synchronised before and after each
forward; host time is the wall time (the device synchronised at both
ends) minus the forward time, over the forward count (prefill included).
A cell is the median over prompts. Writes table.md and results.json into
--out.
"""
from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Dict, List

from . import methods as registry
from . import options, report, shapes
from . import tasks as task_sources

METHODS = "greedy,transformers,pld,pld_tree"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a folder, a .gguf or shape:NAME (default: the embedded model)")
    p.add_argument("--dtype", default="float32", choices=options.DTYPES)
    p.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--contexts", type=options.int_list(16), default=[1024, 16384], help="comma-separated prompt lengths in tokens (default 1024,16384)")
    p.add_argument("--prompts", type=options.at_least(1), default=3, help="prompts a context (default 3)")
    p.add_argument("--max-new-tokens", type=options.at_least(1), default=128)
    p.add_argument("--methods", default=METHODS, help=f"methods of pld.bench.methods (default {METHODS})")
    p.add_argument("--source", choices=("spec-bench", "builtin"), default="spec-bench",
                   help="where the documents come from (default spec-bench; builtin when it is missing)")
    p.add_argument("--data", default="", help="Spec-Bench question.jsonl (default: found as `bench` finds it)")
    p.add_argument("--out", default=os.path.join("bench-out", "host-time"))


def documents(args: argparse.Namespace) -> List[str]:
    """The summarization and rag prompts' texts of --source (the built-in
    set where Spec-Bench cannot be found); a ValueError naming --data where
    it has none."""
    source, data = args.source, args.data
    if source == "spec-bench" and not data:
        try:
            data = task_sources.default_spec_bench()
        except ValueError:
            source = "builtin"
    prompts = task_sources.load(source, ["summarization", "rag"], 40, data)
    if not prompts:
        raise ValueError(f"--data: {data!r} has no summarization or rag questions to make long prompts of")
    return [p.turns[0] for p in prompts]


def long_prompt(tokenizer: Any, texts: List[str], T: int, first: int) -> Any:
    """[1, ~T] ids: the texts from ``first`` on, run together and cut so
    that with the request to summarise, in the chat template, the prompt
    is about T tokens."""
    from pld.models import chat_template_ids

    ask = "\n\nSummarize the text above in a few sentences."
    body: List[int] = []
    i = first
    while len(body) < T:
        body += tokenizer(texts[i % len(texts)] + "\n\n", add_special_tokens=False).input_ids
        i += 1
    overhead = len(chat_template_ids(tokenizer, [{"role": "user", "content": ask}])[0])
    text = tokenizer.decode(body[:max(T - overhead, 1)])
    return chat_template_ids(tokenizer, [{"role": "user", "content": text + ask}])


def _prompt(tokenizer: Any, model: Any, texts: List[str], T: int, i: int) -> Any:
    import torch

    from .arch_zoo import periodic_prompt

    if tokenizer is None:
        return torch.tensor([periodic_prompt(f"host-{T}-{i}", T, model.config.vocab_size)])
    return long_prompt(tokenizer, texts, T, first=7 * i)


def timed(generate: Any, ids: Any, meter: Any) -> Dict[str, float]:
    """One generation: wall seconds (device synchronised at both ends),
    forward seconds and calls (the meter's hooks), new tokens."""
    from .generation import timed as run_timed

    seq, wall = run_timed(generate, ids, meter)
    calls = max(meter.calls, 1)
    return {"seconds": wall, "forward_seconds": meter.seconds, "forwards": meter.calls,
            "new_tokens": int(seq.shape[1] - ids.shape[1]),
            "host_ms_per_forward": (wall - meter.seconds) / calls * 1e3,
            "forward_ms": meter.seconds / calls * 1e3}


def run(args: argparse.Namespace) -> int:
    from .generation import ForwardMeter

    device = shapes.resolve_device(args.device)
    chosen = registry.select(args.methods)
    # (a shape:NAME model has no tokenizer: its prompts are token ids)
    texts = [] if (args.model or "").startswith(shapes.PREFIX) else documents(args)
    model, tokenizer, name = shapes.load_model(args.model, args.dtype, device)
    setup = registry.Setup(model, args.max_new_tokens, 10, 3)
    generators = registry.build(chosen, setup)
    meter = ForwardMeter(model, device)
    results: Dict[int, Dict[str, List[Dict[str, float]]]] = {}
    for T in args.contexts:
        prompts = [_prompt(tokenizer, model, texts, T, i).to(device) for i in range(args.prompts + 1)]
        for fn in generators.values():
            fn(prompts[-1])  # warm-up at this context (and pld's calibration)
        runs: Dict[str, List[Dict[str, float]]] = {m: [] for m in generators}
        for i, ids in enumerate(prompts[:-1]):
            names = list(generators)
            for m in names[i % len(names):] + names[:i % len(names)]:
                runs[m].append(timed(generators[m], ids, meter))
        results[T] = runs
        print(f"context {T}: " + ", ".join(
            f"{m} {statistics.median(r['host_ms_per_forward'] for r in rs):.2f} ms" for m, rs in runs.items()),
            flush=True)
    meter.remove()
    caption = (f"{name}, {args.dtype}, {device} ({shapes.describe_device(device)}); {shapes.versions_line()}; "
               f"{args.prompts} prompts a context, <= {args.max_new_tokens} new tokens, k=10")
    text = table(results) + f"\n\n{caption}\n"
    report.save(args.out, text, {"device": device, "caption": caption, "results": results})
    return 0


def table(results: Dict[int, Dict[str, List[Dict[str, float]]]]) -> str:
    lines = ["| context | method | forwards | tokens/forward | forward (ms) | host (ms) a forward "
             "| host vs transformers' |", "|--:|---|--:|--:|--:|--:|--:|"]
    for T, runs in results.items():
        med = {m: statistics.median(r["host_ms_per_forward"] for r in rs) for m, rs in runs.items()}
        for m, rs in runs.items():
            forwards = sum(r["forwards"] for r in rs)
            per_forward = sum(r["new_tokens"] for r in rs) / max(forwards, 1)
            ratio = f"{med[m] / med['transformers']:.2f}" if med.get("transformers") else "-"
            lines.append(f"| {T:,} | {m} | {forwards} | {per_forward:.2f} | "
                         f"{statistics.median(r['forward_ms'] for r in rs):.2f} | {med[m]:.2f} | {ratio} |")
    return "\n".join(lines)
