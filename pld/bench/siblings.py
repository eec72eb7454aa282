"""n samples a prompt (best-of-n, self-consistency, RL rollouts), with and
without sibling drafts, side by side.

    python -m pld bench siblings --tasks summarization,rag --limit 8 --n 4 \\
        --temperature 0.7 --top-p 0.9 --max-new-tokens 128 --drafts linear,tree

Each prompt is repeated n times (as ``num_return_sequences`` does) and
sampled by ``pld.generate`` on that batch, per drafts mode (linear, tree):

  alone      every row drafts from its own prompt and output only
             (``sibling_drafts=False``)
  siblings   every row also drafts from what its siblings have written
             (pld.drafts.siblings)
  sample     plain batched sampling, ``model.generate(do_sample=True,
             num_return_sequences=n)`` (tokens/s reference; 1 token a forward)

and, from each ``alone`` run's samples, a replay bound (pld.bench.sibling_bound):
the tokens per forward with every candidate of the row's own tree verified,
against the same with its siblings' whole outputs as well -- the most sibling
drafts could add to these samples, whatever the budget or the order of writing.

The methods take turns per prompt (the order rotating), each seeded with
the prompt's seed. Samples differ between methods (the draws fall on
other rows once the steps differ), so the comparison is of rates over many
samples. Per task and mode: tokens per forward a row (a row's new tokens
over the forwards it took part in), tokens/s over the batch, and the
ratios siblings / alone (pooled, and the median of per-prompt ratios), and
the replay bound's ratio.
The table, with machine and versions, goes to OUT/siblings_table.md and
the rows to OUT/siblings_results.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable, Dict, List

from . import tasks as task_sources
from .options import DTYPES, at_least, positive_float, probability, threads
from .sibling_bound import replay_bound


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="", help="the spec-bench question.jsonl (default: found as for generation)")
    p.add_argument("--tasks", default="summarization,rag")
    p.add_argument("--limit", type=at_least(1), default=8, help="prompts per task (default 8)")
    p.add_argument("--skip", type=at_least(0), default=0, help="prompts per task to pass over first")
    p.add_argument("--n", type=at_least(1), default=4, help="samples a prompt (default 4)")
    p.add_argument("--temperature", type=positive_float, default=0.7)
    p.add_argument("--top-p", type=probability, default=0.9)
    p.add_argument("--max-new-tokens", type=at_least(1), default=128)
    p.add_argument("--num-pred-tokens", type=at_least(1), default=10)
    p.add_argument("--drafts", type=_modes, default="linear,tree", help="drafts modes: linear, tree, or linear,tree (the default: both)")
    p.add_argument("--no-sample-baseline", action="store_true", help="skip plain batched sampling")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--threads", type=threads, default=0)
    p.add_argument("--out", default="bench-out")


def _modes(text: str) -> List[str]:
    """--drafts: a non-empty comma-separated list of linear and tree (argparse type)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or set(modes) - {"linear", "tree"}:
        raise argparse.ArgumentTypeError(f"expected linear and/or tree, got {text!r}")
    return modes


def _methods(model: Any, args: argparse.Namespace) -> Dict[str, Callable]:
    """name -> fn(ids [n, L]) -> (rows' new tokens, row-forwards or None)."""
    import torch

    import pld

    eos = model.generation_config.eos_token_id
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p)

    def lookup(tree: bool, siblings: bool) -> Callable:
        def run(ids):
            gen = pld.generate(model, ids, max_new_tokens=args.max_new_tokens,
                               prompt_lookup_num_tokens=args.num_pred_tokens,
                               eos_token_id=eos, draft_tree=tree, sibling_drafts=siblings, **sampling)
            return gen.new_tokens, len(gen.stats.records)
        return run

    def sample(ids):
        with torch.no_grad():
            out = model.generate(ids[:1], num_return_sequences=ids.shape[0], max_new_tokens=args.max_new_tokens,
                                 pad_token_id=eos if isinstance(eos, int) else eos[0], **sampling)
        return _until_eos(out[:, ids.shape[1]:].tolist(), eos), None

    methods: Dict[str, Callable] = {}
    for mode in args.drafts:
        methods[f"alone_{mode}"] = lookup(mode == "tree", False)
        methods[f"siblings_{mode}"] = lookup(mode == "tree", True)
    if not args.no_sample_baseline:
        methods["sample"] = sample
    return methods


def _until_eos(rows: List[List[int]], eos: Any) -> List[List[int]]:
    stop = set(eos if isinstance(eos, (list, tuple)) else [eos])
    out = []
    for row in rows:
        end = next((j + 1 for j, t in enumerate(row) if t in stop), len(row))
        out.append(row[:end])
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from pld import forward_cost, models

    from .generation import chat_input_ids
    from .report import caption

    data = args.data or task_sources.default_spec_bench()
    prompts = task_sources.load("spec-bench", task_sources.parse_tasks(args.tasks, "spec-bench"), args.limit, data, skip=args.skip)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model, tokenizer = models.load(args.model, dtype=args.dtype, device=device)
    wait = forward_cost.waiter(device)
    methods = _methods(model, args)
    names = list(methods)
    batches = [(p, chat_input_ids(tokenizer, list(p.turns[:1]), []).to(device).repeat(args.n, 1)) for p in prompts]
    for fn in methods.values():  # warm-up, and the width budget's calibration at this batch size
        torch.manual_seed(args.seed)
        fn(batches[0][1])
    os.makedirs(args.out, exist_ok=True)
    results = []
    with open(os.path.join(args.out, "siblings_results.jsonl"), "w", encoding="utf-8") as log:
        for i, (prompt, ids) in enumerate(batches):
            for m in names[i % len(names):] + names[:i % len(names)]:
                torch.manual_seed(args.seed + i)
                wait()
                t0 = time.perf_counter()
                rows, row_forwards = methods[m](ids)
                wait()  # (the clock is read with the device done)
                seconds = time.perf_counter() - t0
                row = {"task": prompt.task, "prompt": prompt.id, "method": m, "new_tokens": sum(map(len, rows)),
                       "seconds": seconds, "row_forwards": row_forwards}
                if m.startswith("alone_"):
                    row["bound"] = list(replay_bound(ids[0].tolist(), rows, depth=args.num_pred_tokens))
                results.append(row)
                log.write(json.dumps(row) + "\n")
            print(f"{i + 1}/{len(batches)} {prompt.id}", flush=True)
    config = {"model": args.model or models.EMBEDDED_NAME, "dtype": args.dtype, "device": device,
              "num_pred_tokens": args.num_pred_tokens, "max_ngram": 3, "max_new_tokens": args.max_new_tokens,
              "source": "spec-bench"}
    cap = caption(config, torch, model).replace("; greedy,", "; sampling,")
    text = (table(results, names) + f"\n\n{cap}; n = {args.n} samples a prompt, "
            f"temperature {args.temperature}, top-p {args.top_p}, seed {args.seed}\n")
    with open(os.path.join(args.out, "siblings_table.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return 0


def table(results: List[Dict[str, Any]], names: List[str]) -> str:
    """Per task and method: tokens/s, tokens per forward a row, and for
    sibling drafts the ratios to the same mode's drafts from the row alone
    and the replay bound of that ratio (from the alone runs' samples)."""
    lines = ["| task | method | prompts | tokens/s | tokens/forward a row | siblings/alone tokens/forward "
             "(pooled; median per prompt) | siblings/alone tokens/s (pooled; median per prompt) "
             "| replay bound: siblings/alone tokens/forward |",
             "|---|---|--:|--:|--:|--:|--:|--:|"]
    for task in dict.fromkeys(r["task"] for r in results):
        rows = [r for r in results if r["task"] == task]
        by = {(r["method"], r["prompt"]): r for r in rows}
        for m in names:
            mine = [r for r in rows if r["method"] == m]
            rate = sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)
            tpf = f"{_per_forward(mine):.2f}"
            cells = ["", "", ""]
            if m.startswith("siblings_"):
                base = [by[("alone_" + m.split("_", 1)[1], r["prompt"])] for r in mine]
                cells = [_ratio(mine, base, _per_forward), _ratio(mine, base, _rate), _bound(base)]
            lines.append(f"| {task} | {m} | {len(mine)} | {rate:.2f} | {tpf} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _bound(rows: List[Dict[str, Any]]) -> str:
    """The replay bound pooled over ``rows`` (alone runs): forwards alone over
    forwards with the siblings' outputs, i.e. the tokens/forward ratio."""
    if not all(r.get("bound") for r in rows):
        return ""
    tokens, alone, with_siblings = (sum(r["bound"][j] for r in rows) for j in range(3))
    return f"{alone / max(1, with_siblings):.2f}x ({tokens / max(1, alone):.2f} -> {tokens / max(1, with_siblings):.2f})"


def _rate(rows: List[Dict[str, Any]]) -> float:
    return sum(r["new_tokens"] for r in rows) / sum(r["seconds"] for r in rows)


def _per_forward(rows: List[Dict[str, Any]]) -> float:
    """New tokens over the forwards the rows took part in (1 for plain sampling)."""
    if any(r["row_forwards"] is None for r in rows):
        return 1.0
    return sum(r["new_tokens"] for r in rows) / max(1, sum(r["row_forwards"] for r in rows))


def _ratio(mine: List[Dict[str, Any]], base: List[Dict[str, Any]], measure: Callable) -> str:
    pooled = measure(mine) / measure(base)
    each = [measure([a]) / measure([b]) for a, b in zip(mine, base)]
    return f"{pooled:.2f}x; {statistics.median(each):.2f}x"
