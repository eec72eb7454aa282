"""The cost of a one-token forward on each KV cache, against context length.

For each context length the embedded model (or --model) prefills a random
prompt into a transformers DynamicCache and into pld.kv_cache's OwnedCache,
then runs --reps one-token forwards on each, the two caches alternating
(the order flips every round); a cell is the median in ms. DynamicCache
concatenates every layer's keys and values onto the whole cache at each
token; OwnedCache writes into a buffer allocated ahead and returns views.
Writes table.md and results.json into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Dict, List

from .lookup import machine_info, versions
from .options import at_least, int_list, threads

CONTEXTS = (700, 3000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--contexts", type=int_list(1), default=",".join(map(str, CONTEXTS)),
                   help="comma-separated context lengths (default %(default)s)")
    p.add_argument("--reps", type=at_least(1), default=30, help="forwards per cache and context (default 30)")
    p.add_argument("--threads", type=threads, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--model", default=None, help="a .gguf file or model folder (default: the embedded model)")
    p.add_argument("--out", default=os.path.join("bench-out", "kv-forward"))


def _forwards(model, caches: Dict[str, object], prompt, reps: int) -> Dict[str, List[float]]:
    import torch

    from pld.hf_adapter import model_traits

    vocab = model.config.vocab_size
    name = model_traits(model).cache_argument  # past_key_values, or cache from transformers 5.24
    times: Dict[str, List[float]] = {method: [] for method in caches}
    with torch.no_grad():
        for cache in caches.values():
            model(prompt, **{name: cache}, use_cache=True)
        for rep in range(reps + 2):  # two rounds of warm-up
            order = list(caches) if rep % 2 == 0 else list(caches)[::-1]
            for method in order:
                cache = caches[method]
                n = cache.get_seq_length()
                ids = torch.randint(100, vocab - 100, (1, 1))
                t0 = time.perf_counter()
                model(ids, **{name: cache}, use_cache=True, position_ids=torch.tensor([[n]]))
                if rep >= 2:
                    times[method].append((time.perf_counter() - t0) * 1e3)
    return times


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import DynamicCache

    from pld import models
    from pld.kv_cache import OwnedCache

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    contexts = list(args.contexts)
    model, _ = models.load(args.model)
    torch.manual_seed(0)
    m, v = machine_info(), versions()
    print(f"machine: {m['cpu']}, {m['cores']} cores, torch threads {torch.get_num_threads()}; "
          + ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "transformers", "pld")))
    rows = ["| context | DynamicCache (ms) | OwnedCache (ms) | saved (ms) | saved |",
            "|---:|---:|---:|---:|---:|"]
    results = {}
    for ctx in contexts:
        prompt = torch.randint(100, model.config.vocab_size - 100, (1, ctx))
        caches = {"DynamicCache": DynamicCache(),
                  "OwnedCache": OwnedCache(capacity=ctx + 2 * args.reps + 16)}
        times = _forwards(model, caches, prompt, args.reps)
        dyn, own = (statistics.median(times[n]) for n in ("DynamicCache", "OwnedCache"))
        results[ctx] = {"DynamicCache": dyn, "OwnedCache": own, "n": args.reps}
        rows.append(f"| {ctx:,} | {dyn:.2f} | {own:.2f} | {dyn - own:.2f} | {(dyn - own) / dyn:.0%} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    print("\n" + table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(f"machine: {m}, versions: {v}, torch threads {torch.get_num_threads()}\n\n{table}\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": m, "versions": v, "results": results}, f, indent=1)
    return 0
