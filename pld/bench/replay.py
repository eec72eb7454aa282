"""A large model's speed under prompt lookup, replayed: the drafts and
acceptance of a real model's runs, timed on a bigger model's forwards.

    python -m pld bench replay --device cuda --target shape:7b@bfloat16 \\
        --tasks summarization,rag --prompts 6

1. The source model (default: the embedded SmolLM2-135M, float32) runs
   ``pld.loop.run`` on Spec-Bench prompts, linear drafts and token trees,
   recording every step: how many draft tokens it verified and how many
   it accepted.
2. The target model (e.g. ``shape:7b``: Llama-2-7B's shape with random
   weights; timing does not depend on the weights) replays each run's
   forwards at the same contexts: prefill a prompt of the same length,
   then per step a forward over 1 + verified tokens and a crop back to
   the 1 + accepted ones kept; plain greedy is one one-token forward a
   new token. Every run is timed with the device synchronised at both
   ends; methods alternate per prompt.

What this measures is the forwards alone: the loop's own host time per
step is measured apart (``python -m pld bench host-time``), and a tree's
forward is replayed as a causal block of the same width (its 4D mask may
pick another attention kernel). Writes table.md and results.json into
--out.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Dict, List

from . import report, shapes
from . import tasks as task_sources
from .forward_curve import _ids, _prefill, parse_models

KINDS = {"pld": dict(), "pld_tree": dict(draft_tree=True)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source-model", default="embedded@float32",
                   help="MODEL[@DTYPE] whose runs give the drafts and acceptance (default embedded@float32)")
    p.add_argument("--target", default="shape:7b@bfloat16", help="MODEL[@DTYPE] that replays them")
    p.add_argument("--device", default="auto")
    p.add_argument("--source", choices=("spec-bench", "builtin"), default="spec-bench")
    p.add_argument("--data", default="", help="Spec-Bench question.jsonl (default: found as `bench` finds it)")
    p.add_argument("--tasks", default="summarization,rag")
    p.add_argument("--prompts", type=int, default=6, help="prompts a task (default 6)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--out", default=os.path.join("bench-out", "replay"))


def record_runs(model: Any, tokenizer: Any, prompts: List[Any], max_new_tokens: int) -> List[Dict[str, Any]]:
    """Each prompt's runs on the source model: prompt length, greedy's new
    tokens, and for each kind its steps as (verified, accepted, kept)."""
    import torch

    from pld import loop

    from .generation import chat_input_ids

    device = next(model.parameters()).device
    out = []
    for p in prompts:
        ids = chat_input_ids(tokenizer, list(p.turns[:1]), []).to(device)
        item: Dict[str, Any] = {"id": p.id, "task": p.task, "prompt_tokens": int(ids.shape[1])}
        for kind, options in KINDS.items():
            with torch.no_grad():
                result = loop.run(model, ids, max_new_tokens=max_new_tokens, record_steps=True, **options)
            item[kind] = [(r.proposed, r.accepted, len(r.tokens)) for r in result.stats.records]
            item["new_tokens"] = int(result.sequences.shape[1] - ids.shape[1])
        out.append(item)
    return out


def replay(model: Any, prompt_tokens: int, steps: List[Any], wait: Any) -> float:
    """Seconds of the target's forwards for one run: the prefill, then each
    step's forward over its pending token and the verified ones, and a crop
    to the kept ones (the pending token and the accepted path)."""
    import torch

    from pld.hf_adapter import model_traits

    keyword = model_traits(model).cache_argument
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    block = _ids(1 + max(v for v, _, _ in steps), vocab, seed=prompt_tokens + 1).to(device)
    with torch.no_grad():
        wait()
        t0 = time.perf_counter()
        # the prompt but its last token, which each run's first step feeds
        cache = _prefill(model, keyword, _ids(prompt_tokens - 1, vocab, seed=prompt_tokens).to(device))
        for verified, _, kept in steps:
            model(block[:, :1 + verified], **{keyword: cache}, use_cache=True)
            drop = verified + 1 - kept
            if drop > 0:
                cache.crop(-drop)
        wait()
        return time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    import torch

    from pld import forward_cost

    device = shapes.resolve_device(args.device)
    src_name, src_dtype, src_label = one_model(args.source_model, "float32", "--source-model")
    tgt_name, tgt_dtype, tgt_label = one_model(args.target, "bfloat16", "--target")
    data = args.data
    if args.source == "spec-bench" and not data:
        data = task_sources.default_spec_bench()
    prompts = task_sources.load(args.source, task_sources.parse_tasks(args.tasks, args.source), args.prompts, data)
    source, tokenizer, _ = shapes.load_model(src_name, src_dtype, device)
    runs = record_runs(source, tokenizer, prompts, args.max_new_tokens)
    del source
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    target, _, described = shapes.load_model(tgt_name, tgt_dtype, device)
    wait = forward_cost.waiter(device)
    replay(target, 64, [(10, 3, 4)], wait)  # warm-up
    for i, item in enumerate(runs):
        plans = {"greedy": [(0, 0, 1)] * item["new_tokens"], **{k: item[k] for k in KINDS}}
        order = list(plans)[i % len(plans):] + list(plans)[:i % len(plans)]
        item["seconds"] = {m: replay(target, item["prompt_tokens"], plans[m], wait) for m in order}
    caption = (f"steps recorded on {src_label}, replayed on {tgt_label} ({described}), {device} "
               f"({shapes.describe_device(device)}); {shapes.versions_line()}; <= {args.max_new_tokens} new tokens")
    text = table(runs) + f"\n\n{caption}\n"
    report.save(args.out, text, {"device": device, "caption": caption, "runs": runs})
    return 0


def one_model(spec: str, dtype: str, option: str) -> Any:
    """The one (model, dtype, label) of ``spec`` (forward_curve.parse_models):
    a ValueError naming ``option`` for none or several."""
    models = parse_models(spec, dtype, option)
    if len(models) > 1:
        raise ValueError(f"{option}: expected one MODEL[@DTYPE], got {spec!r}")
    return models[0]


def table(runs: List[Dict[str, Any]]) -> str:
    lines = ["| task | method | prompts | tokens/forward | forward tokens/s | vs greedy (mean of prompts) |",
             "|---|---|--:|--:|--:|--:|"]
    for task in dict.fromkeys(r["task"] for r in runs):
        mine = [r for r in runs if r["task"] == task]
        for m in ("greedy", *KINDS):
            steps = [len(r[m]) if m in r else r["new_tokens"] for r in mine]
            new = sum(r["new_tokens"] for r in mine)
            rate = new / sum(r["seconds"][m] for r in mine)
            ratio = statistics.mean(r["seconds"]["greedy"] / r["seconds"][m] for r in mine)
            lines.append(f"| {task} | {m} | {len(mine)} | {new / max(sum(steps), 1):.2f} | {rate:.1f} | "
                         f"{ratio:.2f}x |")
    return "\n".join(lines)
