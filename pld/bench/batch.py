"""Batched prompt lookup against batched greedy, at the same batch size.

    python -m pld bench --source spec-bench --tasks summarization,rag --limit 16 \\
        --max-new-tokens 128 --batch-size 4

(``generation`` with ``--batch-size`` B > 1 runs this.) The prompts of each
task go in batches of B (in order, left-padded with the tokenizer's pad
id); per batch the methods take turns (the order rotating), each after a
warm-up batch:

  greedy      batched ``model.generate(do_sample=False)`` (the reference)
  pld         ``pld.generate`` on the batch: one index a row, one forward a
              step for the batch, the width budget from the measured cost
  pld_tree    the same with token-tree drafts (every row's tree in the one
              forward, the width budget over rows and nodes)
  pld_full    linear drafts, every draft verified in full (``cost_aware=False``)
  greedy_onednn
              batched greedy with the model's linear layers on oneDNN, where
              pld's loop picks that kernel on this machine (what the kernel
              alone gives; pld.cpu_kernels)

Per task: tokens/s over the whole batch (all new tokens, eos included, over
the batch's wall time; mean of per-batch ratios to greedy, and the pooled
ratio), tokens per forward a row (new tokens over forward passes x B: below
1 for greedy when rows finish early), and rows identical to batched
greedy's. The table, with machine and versions, goes to OUT/batch_table.md
and the rows to OUT/batch_results.jsonl.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable, Dict, List

METHODS = ("greedy", "pld", "pld_tree", "pld_full", "greedy_onednn")


def left_padded(tokenizer: Any, rows: List[Any], device: Any = "cpu") -> Any:
    """(ids, mask, pad id) of the [1, L_i] ``rows``, left-padded, on ``device``."""
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    L = max(r.shape[1] for r in rows)
    ids = torch.full((len(rows), L), pad, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), L), dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        ids[i, L - r.shape[1]:] = r[0]
        mask[i, L - r.shape[1]:] = 1
    return ids, mask, pad


def _methods(model: Any, args: Any, pad: int) -> Dict[str, Callable]:
    import torch

    import pld

    eos = model.generation_config.eos_token_id
    common = dict(max_new_tokens=args.max_new_tokens, prompt_lookup_num_tokens=args.num_pred_tokens,
                  max_matching_ngram_size=args.max_ngram, eos_token_id=eos)

    def greedy(ids, mask):
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=args.max_new_tokens,
                                  pad_token_id=pad, temperature=None, top_p=None, top_k=None)

    def lookup(**options):
        def run(ids, mask):
            from pld import loop

            with torch.no_grad():
                return loop.run_batch(model, ids, attention_mask=mask, pad_token_id=pad,
                                      **options, **common)[0]
        return run

    from pld.cpu_kernels import LinearKernel

    kernel = LinearKernel(model, "auto")  # the choice pld's loop makes on this machine

    def greedy_kernel(ids, mask):
        with kernel.routing():
            return greedy(ids, mask)

    del pld
    methods = {"greedy": greedy, "pld": lookup(), "pld_tree": lookup(draft_tree=True),
               "pld_full": lookup(cost_aware=False)}
    if kernel.active:
        methods["greedy_onednn"] = greedy_kernel
    return methods


def _rows_of(seq: Any, width: int, eos: Any, pad: int) -> List[List[int]]:
    """Each row's new tokens: up to and with its first eos (the rest is fill)."""
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))
    out = []
    for row in seq[:, width:].tolist():
        end = len(row)
        for j, t in enumerate(row):
            if t in eos_ids:
                end = j + 1
                break
        out.append(row[:end])
    return out


def run(args: Any, prompts: List[Any], model: Any, tokenizer: Any, meter: Any, caption: str) -> int:
    from .generation import chat_input_ids

    B = args.batch_size
    by_task: Dict[str, List[Any]] = {}
    for p in prompts:
        by_task.setdefault(p.task, []).append(chat_input_ids(tokenizer, list(p.turns[:1]), []))
    batches = [(task, rows[i:i + B]) for task, rows in by_task.items() for i in range(0, len(rows), B)]
    device = next(model.parameters()).device
    _, _, pad = left_padded(tokenizer, batches[0][1])
    methods = _methods(model, args, pad)
    names = list(methods)
    eos = model.generation_config.eos_token_id
    warm_ids, warm_mask, _ = left_padded(tokenizer, batches[0][1], device)
    for fn in methods.values():  # warm-up (and the budget's calibration at this batch size)
        fn(warm_ids, warm_mask)
    results = []
    path = os.path.join(args.out, "batch_results.jsonl")
    with open(path, "w", encoding="utf-8") as log:
        for b, (task, rows) in enumerate(batches):
            ids, mask, _ = left_padded(tokenizer, rows, device)  # on the model's device
            order = names[b % len(names):] + names[:b % len(names)]
            outs = {}
            for m in order:
                meter.sync()
                meter.reset()
                t0 = time.perf_counter()
                seq = methods[m](ids, mask)
                meter.sync()  # a GPU's queued work is part of the time
                seconds = time.perf_counter() - t0
                new = _rows_of(seq, ids.shape[1], eos, pad)
                outs[m] = new
                row = {"task": task, "batch": b, "method": m, "rows": len(rows),
                       "new_tokens": sum(map(len, new)), "seconds": seconds,
                       "forward_calls": meter.calls}
                results.append(row)
            for r in results[-len(names):]:
                r["identical_rows"] = sum(a == g for a, g in zip(outs[r["method"]], outs["greedy"]))
                log.write(json.dumps(r) + "\n")
    text = table(results, names, B) + f"\n\n{caption}; batch size {B}\n"
    with open(os.path.join(args.out, "batch_table.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return 0


def table(results: List[Dict[str, Any]], names: List[str], B: int) -> str:
    lines = ["| task | method | batches | rows | tokens/s (batch) | vs batched greedy | pooled vs greedy "
             "| tokens/forward a row | identical rows |", "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for task in dict.fromkeys(r["task"] for r in results):
        rows = [r for r in results if r["task"] == task]
        base = {r["batch"]: r for r in rows if r["method"] == "greedy"}
        for m in names:
            mine = [r for r in rows if r["method"] == m]
            rates = [r["new_tokens"] / r["seconds"] for r in mine]
            ratios = [(r["new_tokens"] / r["seconds"]) / (base[r["batch"]]["new_tokens"] / base[r["batch"]]["seconds"])
                      for r in mine]
            pooled = (sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)) / \
                (sum(r["new_tokens"] for r in base.values()) / sum(r["seconds"] for r in base.values()))
            per_forward = sum(r["new_tokens"] for r in mine) / max(1, sum(r["forward_calls"] * r["rows"] for r in mine))
            spread = f" ± {statistics.stdev(ratios):.2f}" if len(ratios) > 1 else ""
            lines.append(f"| {task} | {m} | {len(mine)} | {sum(r['rows'] for r in mine)} | "
                         f"{statistics.mean(rates):.2f} | {statistics.mean(ratios):.2f}x{spread} | "
                         f"{pooled:.2f}x | {per_forward:.2f} | "
                         f"{sum(r['identical_rows'] for r in mine)}/{sum(r['rows'] for r in mine)} |")
    return "\n".join(lines)
