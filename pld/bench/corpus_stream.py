"""A stream of calls with one corpus kept across them, against no corpus.

    python -m pld bench corpus-stream --limit 8 --max-new-tokens 128 --drafts linear

The first turns of Spec-Bench's six categories (multi-turn conversation,
translation, summarization, question answering, math reasoning, RAG), in
that order, ``--limit`` prompts each, are generated greedily one after
another by ``pld.generate``:

  none        no corpus (drafts from the prompt and output only)
  none_again  the same again: an A/A pair that sizes the run-to-run noise
  corpus      one pld.Corpus for the whole stream; every output is added
              to it when it finishes (``corpus_add``), so later calls draft
              from what earlier ones wrote

The methods take turns per prompt (the order rotating). Greedy gives the
same tokens whatever the drafts: every output is checked against none's.
Per category: tokens per forward, tokens/s, corpus / none and the A/A
ratio none_again / none (pooled and the spread of per-prompt ratios), and
over the stream a plot of tokens per forward (a moving mean) against the
call's place in the stream. Files: OUT/corpus_stream_table.md,
OUT/corpus_stream_results.jsonl, OUT/corpus_stream.png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Dict, List, Tuple

from . import tasks as task_sources
from .options import DTYPES, at_least, threads

#: Spec-Bench's six categories in stream order (its eight MT-Bench
#: categories are the multi-turn conversation set)
CATEGORIES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("mt_bench", ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")),
    ("translation", ("translation",)),
    ("summarization", ("summarization",)),
    ("qa", ("qa",)),
    ("math_reasoning", ("math_reasoning",)),
    ("rag", ("rag",)),
)
METHODS = ("none", "none_again", "corpus")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="", help="the spec-bench question.jsonl (default: found as for generation)")
    p.add_argument("--limit", type=at_least(1), default=8, help="prompts per category (default 8)")
    p.add_argument("--skip", type=at_least(0), default=0, help="prompts per category to pass over first")
    p.add_argument("--max-new-tokens", type=at_least(1), default=128)
    p.add_argument("--num-pred-tokens", type=at_least(1), default=10)
    p.add_argument("--drafts", choices=("linear", "tree"), default="linear")
    p.add_argument("--max-tokens", type=at_least(1), default=1 << 22, help="the corpus's max_tokens")
    p.add_argument("--window", type=at_least(1), default=4, help="calls in the plot's moving mean (default 4)")
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--threads", type=threads, default=0)
    p.add_argument("--out", default="bench-out")


def stream(path: str, limit: int, skip: int = 0) -> List[Tuple[str, str, str]]:
    """(category, question id, first turn) of the stream, in order."""
    if limit < 1 or skip < 0:
        raise ValueError(f"limit, skip: expected limit >= 1 and skip >= 0, got {limit} and {skip}")
    items: Dict[str, List[Tuple[str, str]]] = {name: [] for name, _ in CATEGORIES}
    of = {c: name for name, cats in CATEGORIES for c in cats}
    for qid, category, turns in task_sources.spec_bench_questions(path):
        if category in of:
            items[of[category]].append((qid, turns[0]))
    return [(name, qid, text) for name, _ in CATEGORIES for qid, text in items[name][skip:skip + limit]]


def run(args: argparse.Namespace) -> int:
    import torch

    import pld
    from pld import forward_cost, models

    from .generation import chat_input_ids
    from .report import caption

    calls = stream(args.data or task_sources.default_spec_bench(), args.limit, args.skip)
    if not calls:
        raise ValueError(f"--skip: no prompt of the stream's categories is left after skipping {args.skip} "
                         "a category")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model, tokenizer = models.load(args.model, dtype=args.dtype, device=device)
    wait = forward_cost.waiter(device)
    corpus = pld.Corpus(max_tokens=args.max_tokens)
    common = dict(max_new_tokens=args.max_new_tokens, prompt_lookup_num_tokens=args.num_pred_tokens,
                  draft_tree=args.drafts == "tree")
    options = {"none": {}, "none_again": {}, "corpus": {"corpus": corpus}}
    warm = chat_input_ids(tokenizer, ["Repeat exactly: the quick brown fox jumps over the lazy dog."], [])
    for m in METHODS:  # warm-up (the corpus learns nothing from it)
        pld.generate(model, warm.to(device), **common, **{**options[m], "corpus_add": False})
    os.makedirs(args.out, exist_ok=True)
    results = []
    with open(os.path.join(args.out, "corpus_stream_results.jsonl"), "w", encoding="utf-8") as log:
        for i, (category, qid, text) in enumerate(calls):
            ids = chat_input_ids(tokenizer, [text], []).to(device)
            outs = {}
            for m in METHODS[i % 3:] + METHODS[:i % 3]:
                wait()
                t0 = time.perf_counter()
                gen = pld.generate(model, ids, **common, **options[m])
                wait()  # (the clock is read with the device done)
                seconds = time.perf_counter() - t0
                outs[m] = gen.new_tokens
                row = {"place": i, "category": category, "id": qid, "method": m, "new_tokens": len(gen.new_tokens),
                       "forwards": gen.stats.steps, "seconds": seconds, "corpus_tokens": len(corpus)}
                results.append(row)
            for r in results[-3:]:
                r["identical"] = outs[r["method"]] == outs["none"]
                log.write(json.dumps(r) + "\n")
            print(f"{i + 1}/{len(calls)} {category} {qid}: corpus {len(corpus)} tokens", flush=True)
    config = {"model": args.model or models.EMBEDDED_NAME, "dtype": args.dtype, "device": device,
              "num_pred_tokens": args.num_pred_tokens, "max_ngram": 3, "max_new_tokens": args.max_new_tokens,
              "source": "spec-bench"}
    cap = (f"{caption(config, torch, model)}; {args.drafts} drafts; corpus max_tokens {args.max_tokens}, "
           f"{len(corpus)} tokens held at the end ({corpus.nbytes / 2**20:.1f} MiB)")
    text = table(results) + f"\n\n{cap}\n"
    with open(os.path.join(args.out, "corpus_stream_table.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    plot(results, os.path.join(args.out, "corpus_stream.png"), args.window, cap)
    print(text)
    return 0


def _per_forward(rows: List[Dict[str, Any]]) -> float:
    return sum(r["new_tokens"] for r in rows) / max(1, sum(r["forwards"] for r in rows))


def _rate(rows: List[Dict[str, Any]]) -> float:
    return sum(r["new_tokens"] for r in rows) / sum(r["seconds"] for r in rows)


def _ratios(rows: List[Dict[str, Any]], method: str) -> str:
    """``method`` / none: pooled tokens/s, and the middle of per-call ratios
    (median, min-max)."""
    by = {(r["method"], r["place"]): r for r in rows}
    mine = [r for r in rows if r["method"] == method]
    base = [by[("none", r["place"])] for r in mine]
    each = [_rate([a]) / _rate([b]) for a, b in zip(mine, base)]
    return f"{_rate(mine) / _rate(base):.2f}x ({statistics.median(each):.2f}x, {min(each):.2f}-{max(each):.2f})"


def table(results: List[Dict[str, Any]]) -> str:
    lines = ["| category | calls | tokens/forward none / corpus | tokens/s none / corpus "
             "| corpus / none tokens/s (median, min-max) | A/A none_again / none tokens/s | identical |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    groups = [(name, [r for r in results if r["category"] == name]) for name, _ in CATEGORIES]
    for name, rows in groups + [("all", results)]:
        if not rows:
            continue
        none = [r for r in rows if r["method"] == "none"]
        corpus = [r for r in rows if r["method"] == "corpus"]
        same = sum(r["identical"] for r in rows if r["method"] != "none")
        lines.append(f"| {name} | {len(none)} | {_per_forward(none):.2f} / {_per_forward(corpus):.2f} | "
                     f"{_rate(none):.2f} / {_rate(corpus):.2f} | {_ratios(rows, 'corpus')} | "
                     f"{_ratios(rows, 'none_again')} | {same}/{2 * len(none)} |")
    return "\n".join(lines)


def plot(results: List[Dict[str, Any]], path: str, window: int, caption_text: str) -> None:
    """Tokens per forward (moving mean over ``window`` calls) against the
    call's place in the stream, with and without the corpus; categories
    shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.8))
    for method, style in (("none", "--"), ("corpus", "-")):
        rows = sorted((r for r in results if r["method"] == method), key=lambda r: r["place"])
        ys = [r["new_tokens"] / max(1, r["forwards"]) for r in rows]
        smooth = [statistics.mean(ys[max(0, j - window + 1):j + 1]) for j in range(len(ys))]
        ax.plot([r["place"] for r in rows], smooth, style, label=f"{method} (moving mean of {window})")
    places = sorted({(r["place"], r["category"]) for r in results})
    for j, (name, _) in enumerate(CATEGORIES):
        span = [p for p, c in places if c == name]
        if span:
            ax.axvspan(span[0] - 0.5, span[-1] + 0.5, alpha=0.08 if j % 2 else 0.0, color="grey")
            ax.text((span[0] + span[-1]) / 2, ax.get_ylim()[1], name, ha="center", va="top", fontsize=8)
    ax.set_xlabel("call in the stream")
    ax.set_ylabel("tokens per forward")
    ax.legend(loc="lower right")
    ax.set_title("one corpus across a stream of calls (Spec-Bench, six categories)")
    fig.text(0.01, 0.01, caption_text[:220], fontsize=6)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
