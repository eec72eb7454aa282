"""Fit the token tree's acceptance prior (pld.token_tree.PRIOR) on prompts
the reported benchmarks do not use.

    python -m pld bench tree-prior --source spec-bench --tasks summarization,rag,translation \\
        --skip 40 --limit 40 --max-new-tokens 96

Every prompt is decoded with token-tree drafts whose width budget is off
(every node the index proposes is verified, up to --width), so
every kind of node is tried, not only those the prior favours. For every
verified node whose parent was accepted, the bucket (n-gram size, support,
depth, agreement with the model's successors) counts a trial, and a hit if
the model accepted it. The rates print as a table and as the PRIOR
literal, each bucket shrunk toward its smaller neighbours and each
agreement toward its bucket's pooled rate (see :func:`fitted`). The generation bench's reported runs use the first
prompts of each task (--skip 0), so fit with --skip at least their --limit.
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, List, Tuple

from . import tasks as task_sources
from .options import positive_float, threads


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", choices=task_sources.SOURCES, default="spec-bench")
    p.add_argument("--data", default="", help="the spec-bench question.jsonl (default: found as "
                   "for the generation bench)")
    p.add_argument("--tasks", default="summarization,rag,translation")
    p.add_argument("--skip", type=int, default=40, help="prompts per task to pass over first "
                   "(default 40: the reported runs use fewer)")
    p.add_argument("--limit", type=int, default=40, help="prompts per task fitted on (default 40)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--num-pred-tokens", type=int, default=10)
    p.add_argument("--width", type=int, default=48, help="nodes verified a step (default 48)")
    p.add_argument("--successors", action="store_true",
                   help="also offer the model's remembered successors (tree_successors)")
    p.add_argument("--scale-width", type=int, default=12,
                   help="then decode the prompts again with the fitted prior, the likeliest "
                   "--scale-width nodes a step, and report accepted per predicted node "
                   "(PRIOR_SCALE; 0: skip)")
    p.add_argument("--strength", type=positive_float, default=10.0,
                   help="trials a bucket's neighbours are worth in its fit (default 10)")
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=threads, default=0)
    p.add_argument("--no-progress", action="store_true")


def _pooled_rates(model: Any) -> Tuple[float, float]:
    """(overall, row0): an AcceptanceModel's hit rate over all its buckets
    (0.5 with no trials), and over row 0's, the model's successors (the
    overall rate when row 0 has no trials)."""
    hits, trials = model.counts()
    total_hits = sum(hits.values())
    total_trials = sum(trials.values())
    overall = total_hits / total_trials if total_trials else 0.5
    row_trials = sum(v for b, v in trials.items() if b[0] == 0)
    row0 = (sum(v for b, v in hits.items() if b[0] == 0) / row_trials) if row_trials else overall
    return overall, row0


def fitted(model: Any, strength: float) -> Tuple[tuple, List[str]]:
    """(PRIOR literal, table lines) from an AcceptanceModel's raw counts.

    First each (source or n-gram, support, depth) bucket's rate over every
    agreement is shrunk toward its neighbours' (the largest rate among the
    buckets one step smaller in n-gram size, support or depth: more of
    each makes a node likelier, not less; the model's successors, row 0,
    whose support is a rank, shrink toward their row's pooled rate instead),
    worth ``strength`` trials, so buckets with few trials borrow from
    better-observed ones. That pooled rate is the UNKNOWN agreement's; each
    known agreement's rate is then its own counts shrunk toward it, worth
    ``strength`` trials again."""
    from pld import token_tree as tt

    depth_buckets = len(tt.DEPTH_EDGES) + 1
    agreements = range(tt.AGREEMENT_BUCKETS)

    def pooled(counts: Dict, n: int, s: int, d: int) -> float:
        return sum(counts[(n, s, d, a)] for a in agreements)

    overall, row0 = _pooled_rates(model)
    model_hits, model_trials = model.counts()
    rates: Dict[Tuple[int, int, int], float] = {}
    out: Dict[Tuple[int, int, int, int], float] = {}
    lines = ["n-gram support depth agreement  trials  observed  fitted"]
    for n in range(tt.NGRAM_BUCKETS):
        for s in range(tt.SUPPORT_BUCKETS):
            for d in range(depth_buckets):
                trials, hits = pooled(model_trials, n, s, d), pooled(model_hits, n, s, d)
                if n == 0:  # the successors: rank and depth make a node less likely
                    base = row0
                else:       # row 0 is no smaller n-gram
                    below = ((n - 1, s, d),) if n > 1 else ()
                    smaller = [rates[b] for b in below + ((n, s - 1, d), (n, s, d - 1)) if b in rates]
                    base = max(smaller) if smaller else overall
                rate = (hits + strength * base) / (trials + strength)
                rates[(n, s, d)] = rate
                for a in agreements:
                    b = (n, s, d, a)
                    t, h = model_trials[b], model_hits[b]
                    out[b] = round(rate if a == tt.UNKNOWN else (h + strength * rate) / (t + strength), 2)
                    observed = f"{h / t:.3f}" if t else "   -"
                    lines.append(f"{n + 1:>6} {s + 1:>7} {d + 1:>5} {a + 1:>9} {int(t):>7}  "
                                 f"{observed:>8}  {out[b]:.3f}")
    prior = tuple(tuple(tuple(tuple(out[(n, s, d, a)] for a in agreements)
                              for d in range(depth_buckets))
                        for s in range(tt.SUPPORT_BUCKETS)) for n in range(tt.NGRAM_BUCKETS))
    return prior, lines


def prior_literal(prior: tuple) -> str:
    """``PRIOR = (...)`` as pld/token_tree.py writes it: a block per source
    or n-gram bucket, one per support bucket, a line per depth bucket
    (its rates by agreement)."""
    lines = ["PRIOR = ("]
    for n, supports in enumerate(prior):
        lines.append(f"    (  # {'successors' if n == 0 else f'{n}-grams'}: by support, depth, agreement")
        for depths in supports:
            lines.append("        (")
            lines.extend(f"            {rates}," for rates in depths)
            lines.append("        ),")
        lines.append("    ),")
    lines.append(")")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    from pld import loop, models
    from pld.config import DecodeConfig
    from pld.kv_cache import cache_for
    from pld.token_tree import AcceptanceModel
    from pld.width_budget import FirstNodes

    from .generation import _progress, chat_input_ids

    tasks = task_sources.parse_tasks(args.tasks, args.source)
    data = args.data or (task_sources.default_spec_bench() if args.source == "spec-bench" else "")
    prompts = task_sources.load(args.source, tasks, args.limit, data, skip=args.skip)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = models.load(args.model)
    counts = AcceptanceModel(prior_weight=0.0)  # the counts gather over all prompts
    # the first --width nodes of every tree (creation order: ancestor-closed),
    # whatever the prior or the budget would choose
    every_node = FirstNodes(args.width)
    config = DecodeConfig(max_new_tokens=args.max_new_tokens, prompt_lookup_num_tokens=args.num_pred_tokens,
                          draft_tree=True, tree_width=args.width, cost_aware=False,
                          tree_successors=args.successors,
                          eos_token_id=model.generation_config.eos_token_id)
    bar = _progress(sum(len(p.turns[:1]) for p in prompts), disable=args.no_progress)
    for p in prompts:
        ids = chat_input_ids(tokenizer, list(p.turns[:1]), [])
        adapter, decoder = loop.prepare(model, ids, config.with_model_eos(model),
                                        cache=cache_for(model, ids.shape[1] + args.max_new_tokens + 64),
                                        acceptance=counts, budget=every_node)
        with torch.no_grad(), adapter.kernels():
            while decoder.step():
                pass
        bar.update(1)
    bar.close()
    prior, lines = fitted(counts, args.strength)
    print(f"# {len(prompts)} prompts: tasks {tasks}, skip {args.skip}, limit {args.limit}, "
          f"{args.max_new_tokens} new tokens, width {args.width}")
    print("\n".join(lines))
    print(prior_literal(prior))
    if args.scale_width:
        predicted, accepted, steps = _scale(model, tokenizer, prompts, config, prior, args)
        print(f"# scale: {accepted} accepted for {predicted:.0f} predicted over {steps} steps "
              f"(the {args.scale_width} likeliest nodes a step, the fitted prior)")
        print(f"PRIOR_SCALE = {accepted / max(predicted, 1e-9):.2f}")
    return 0


def _scale(model: Any, tokenizer: Any, prompts: list, config: Any, prior: tuple,
           args: argparse.Namespace) -> Tuple[float, int, int]:
    """(predicted, accepted, steps): the chosen nodes' summed reach under
    ``prior`` (no scale) and the nodes accepted, over every drafted step
    after the prefill, each step verifying the --scale-width likeliest
    nodes."""
    import torch

    from pld import loop
    from pld.kv_cache import cache_for
    from pld.token_tree import AcceptanceModel

    from .generation import chat_input_ids

    totals = [0.0, 0, 0]

    def count(record: Any) -> None:
        if record.chosen and decoder.stats.steps > 0:  # the first step carries the prompt
            totals[0] += record.predicted  # the chosen nodes' reach, unscaled
            totals[1] += len(record.path)
            totals[2] += 1

    config = config.replace(tree_width=args.scale_width, cost_aware=False)
    for p in prompts:
        ids = chat_input_ids(tokenizer, list(p.turns[:1]), [])
        adapter, decoder = loop.prepare(model, ids, config.with_model_eos(model),
                                        cache=cache_for(model, ids.shape[1] + args.max_new_tokens + 64),
                                        acceptance=AcceptanceModel(prior=prior), on_step=count)
        with torch.no_grad(), adapter.kernels():
            while decoder.step():
                pass
    return totals[0], totals[1], totals[2]
