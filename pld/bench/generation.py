"""Side-by-side generation benchmark: plain greedy, transformers' prompt
lookup, and pld (enabled through transformers, and its variants), on the same
prompts in one process.

Methods alternate per prompt (the order rotates from prompt to prompt) so
that machine drift hits all alike; one warm-up generation per method comes
first. Every method's output is compared with greedy's, token for token.
Results are appended to a JSONL file as they come, so an interrupted run
resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any, Callable, Dict, List

DEFAULT_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
                            "spec_bench", "question.jsonl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=os.path.normpath(DEFAULT_DATA),
                   help="a Spec-Bench style jsonl (question_id, category, turns)")
    p.add_argument("--categories", default="summarization,rag")
    p.add_argument("--limit", type=int, default=20, help="prompts per category")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-pred-tokens", type=int, default=10)
    p.add_argument("--max-ngram", type=int, default=3)
    p.add_argument("--methods", default="greedy,transformers,pld,pld_adaptive")
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--out", default="bench-out/generation")
    p.add_argument("--max-prompt-chars", type=int, default=0, help="truncate prompts (0: keep)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")


def _methods(model: Any, args: argparse.Namespace) -> Dict[str, Callable[[Any], Dict[str, Any]]]:
    import torch

    import pld
    from pld import loop
    from transformers import DynamicCache

    k, n = args.num_pred_tokens, args.max_ngram
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False,
                  temperature=None, top_p=None, top_k=None)
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])

    def greedy(ids):
        with torch.no_grad():
            return {"sequences": model.generate(ids, **common)}

    def transformers_pl(ids):
        with torch.no_grad():
            return {"sequences": model.generate(ids, prompt_lookup_num_tokens=k,
                                                max_matching_ngram_size=n, **common)}

    def pld_enabled(ids):
        with torch.no_grad(), pld.enabled():
            return {"sequences": model.generate(ids, prompt_lookup_num_tokens=k,
                                                max_matching_ngram_size=n, **common)}

    def loop_variant(**kw):
        def run(ids):
            with torch.no_grad():
                r = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=args.max_new_tokens,
                             num_pred_tokens=k, max_ngram_size=n, eos_token_ids=eos, **kw)
            s = r.stats
            return {"sequences": r.sequences, "steps": s.steps, "tokens_per_step": s.tokens_per_step,
                    "forward_share": s.forward_share}
        return run

    table = {
        "greedy": greedy,
        "transformers": transformers_pl,
        "pld": pld_enabled,
        "pld_loop": loop_variant(),
        "pld_adaptive": loop_variant(adaptive=True),
        "pld_recent": loop_variant(policy="recent"),
        "pld_frequent": loop_variant(policy="frequent"),
    }
    chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in table]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {sorted(table)}")
    if "greedy" not in chosen:
        chosen.insert(0, "greedy")
    return {m: table[m] for m in chosen}


def _prompts(args: argparse.Namespace) -> List[Dict[str, Any]]:
    wanted = [c.strip() for c in args.categories.split(",")]
    out: List[Dict[str, Any]] = []
    counts = {c: 0 for c in wanted}
    with open(args.data, encoding="utf-8") as fh:
        for line in fh:
            q = json.loads(line)
            c = q["category"]
            if c in counts and counts[c] < args.limit:
                text = q["turns"][0]
                if args.max_prompt_chars:
                    text = text[:args.max_prompt_chars]
                out.append({"id": q["question_id"], "category": c, "text": text})
                counts[c] += 1
    return out


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    import pld
    from pld import models
    from pld.demo import build_input_ids

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        def tqdm(x, **_):
            return x

    if args.threads:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.jsonl")
    done = set()
    if os.path.exists(results_path):
        with open(results_path) as fh:
            done = {(r["id"], r["method"]) for r in map(json.loads, fh)}
    model, tokenizer = models.load(args.model)
    methods = _methods(model, args)
    prompts = _prompts(args)
    names = list(methods)
    warm = build_input_ids(tokenizer, "Repeat: the quick brown fox jumps over the lazy dog.")
    for fn in methods.values():
        fn(warm)
    with open(results_path, "a") as log:
        for i, p in enumerate(tqdm(prompts, desc="prompts")):
            ids = build_input_ids(tokenizer, p["text"])
            reference = None
            order = names[i % len(names):] + names[:i % len(names)]
            outputs = {}
            for m in order:
                if (p["id"], m) in done:
                    continue
                start = time.perf_counter()
                out = methods[m](ids)
                seconds = time.perf_counter() - start
                outputs[m] = (out, seconds)
            greedy_out = outputs.get("greedy")
            reference = greedy_out[0]["sequences"] if greedy_out else None
            for m, (out, seconds) in outputs.items():
                seq = out.pop("sequences")
                new = seq.shape[1] - ids.shape[1]
                row = {"id": p["id"], "category": p["category"], "method": m,
                       "prompt_tokens": ids.shape[1], "new_tokens": new, "seconds": seconds,
                       "tokens_per_second": new / seconds,
                       "identical": None if reference is None else bool(torch.equal(seq, reference))}
                row.update(out)
                log.write(json.dumps(row) + "\n")
            log.flush()
    rows = [json.loads(x) for x in open(results_path)]
    table = _table(rows, names)
    caption = (f"model {args.model or models.EMBEDDED_NAME}, float32, CPU ({os.cpu_count()} cores, "
               f"{torch.get_num_threads()} threads), torch {torch.__version__}, transformers "
               f"{transformers.__version__}, pld {pld.__version__}, Python {platform.python_version()}; "
               f"k={args.num_pred_tokens}, max n-gram {args.max_ngram}, {args.max_new_tokens} new tokens max")
    text = f"{table}\n\n{caption}\n"
    with open(os.path.join(args.out, "table.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 0


def _table(rows: List[Dict[str, Any]], names: List[str]) -> str:
    by = {}
    for r in rows:
        by.setdefault((r["category"], r["id"]), {})[r["method"]] = r
    cats = sorted({c for c, _ in by})
    lines = ["| category | method | prompts | tokens/s (total) | speedup vs greedy (mean ± std per prompt) "
             "| vs transformers PL | identical | tokens/step | forward share |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for c in cats:
        prompts = [v for (cc, _), v in by.items() if cc == c and "greedy" in v]
        for m in names:
            have = [v for v in prompts if m in v]
            if not have:
                continue
            tps = sum(v[m]["new_tokens"] for v in have) / sum(v[m]["seconds"] for v in have)
            sp = [v["greedy"]["seconds"] / v[m]["seconds"] * v[m]["new_tokens"] / max(1, v["greedy"]["new_tokens"])
                  for v in have]
            vs_tr = ""
            tr = [v for v in have if "transformers" in v]
            if tr:
                a = sum(v[m]["new_tokens"] for v in tr) / sum(v[m]["seconds"] for v in tr)
                b = sum(v["transformers"]["new_tokens"] for v in tr) / sum(v["transformers"]["seconds"] for v in tr)
                vs_tr = f"{a / b:.2f}x"
            ident = [v[m]["identical"] for v in have if v[m]["identical"] is not None]
            tpstep = [v[m]["tokens_per_step"] for v in have if "tokens_per_step" in v[m]]
            fshare = [v[m]["forward_share"] for v in have if "forward_share" in v[m]]
            per_step = f"{statistics.mean(tpstep):.2f}" if tpstep else ""
            forward = f"{100 * statistics.mean(fshare):.0f}%" if fshare else ""
            lines.append(
                f"| {c} | {m} | {len(have)} | {tps:.2f} | {statistics.mean(sp):.2f} ± "
                f"{statistics.pstdev(sp):.2f} | {vs_tr} | {sum(ident)}/{len(ident)} | {per_step} | {forward} |")
    return "\n".join(lines)
