"""Lookup micro-benchmark: time per generation step against context length.

For each stream (real tokenized text, random ids) and context length L:

  torch_seed          the method's find_candidate_pred_tokens in plain torch,
                      one call on a [1, L] tensor = one step (O(L)).
  transformers        PromptLookupCandidateGenerator(num_output_tokens=10,
                      max_matching_ngram_size=3, max_length=L+100)
                      .get_candidates(input_ids), one call = one step.
  python_dict_index   a pure-Python dict index with the seed semantics
                      (policy "first"); step = propose(10) + extend(token).
  pld.find_candidate_pred_tokens
                      pld's one-shot C scan on the same [1, L] tensor.
  pld.NgramIndex[first|recent|frequent]
                      step = propose(10) + extend(token) of one Python int.
  pld.NgramIndex[recent].propose_tree + 2 guesses
                      step = propose_tree(10, per_ngram=4, max_nodes=64),
                      then twice extend(guess) + propose_tree(9, ...) +
                      truncate back, + extend(token): the candidate tries
                      of a token-tree step with the model's successors
                      (the 'ahead' draft source: pld.drafts.guesses_ahead).
  compared build: NgramIndex[first]
                      with --compare-build SO: another build of the
                      extension (say, the previous commit's), stepping in
                      the same rounds; ratio rows compare the two.

pld's indexes use hash seed --seed (default 0), so a run is reproducible.

With --corpus, the corpus lookup instead (and only it): pld.Corpus over
--corpus-sizes tokens (default 1k, 10k, 100k, 1M, 10M) of a text-like
synthetic stream (corpus_stream: Zipf-distributed ids over a 49k
vocabulary, a third of the tokens from a bank of repeated phrases, in
sequences of 64-1023 tokens; fixed seed), max_tokens = the size, 4
segments, n-grams 2..4. A cell is the median time of --corpus-calls
propose_tree(context, 8, per_ngram=4, max_nodes=64) calls, each context the
8 tokens before a random position of a random held sequence (so matches
exist), timed one by one; with the build time, bytes per token held
(nbytes / tokens), the mean trie size, the median time per trie node, and
the median time of as many calls whose context matches nothing (ids above
the vocabulary: the probes alone), alternating with the others. Writes corpus.md and
corpus.json into --out.

One-shot methods run on the contexts stream[:L + s] for a few offsets s
(the same contexts the indexes pass through), in timed batches, until
--repeats batches or --budget seconds (at least 3 calls); the cell is the
median of the per-batch means. The indexes are built over stream[:L]
(untimed; pld's reserve room for the --segment tokens to come, as pld's
generation loop does for max_new_tokens; the dict grows as dicts do). Then,
--steps / --segment rounds: the indexes take turns (so they see the same
machine load); round r takes two fresh --segment-token stretches of the
stream after stream[:L]; in its turn an index warms up on the first, is
truncated back to L (untimed), and steps through the second, timed in
batches of --batch. So every timed token is new to the index, as in a
generation (a replayed one would find its table slots still in cache from
the truncation), and the context stays within [L, L + segment]. The cell
is the median of the batch means (the mean over all steps, and the first
warm-up batch, on caches the previous index left, are reported too).
The garbage collector is off while timing, as in timeit.

Before timing, a few steps per L check that pld.NgramIndex("first"), the
dict index, torch_seed and pld.find_candidate_pred_tokens agree (and that
transformers agrees with pld's semantics="transformers").

Writes table.md, results.json and lookup.png into --out.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..config import POLICIES
from . import options

DEFAULT_SIZES = (512, 2048, 8192, 32768, 131072, 1048576)
QUICK_SIZES = (512, 2048, 8192)
K = 10          # num_pred_tokens
MAX_N = 3       # max_ngram_size
MIN_N = 1

M_TORCH = "torch_seed"
M_HF = "transformers"
M_DICT = "python_dict_index"
M_FIND = "pld.find_candidate_pred_tokens"
M_IDX = "pld.NgramIndex[{}]"
IDX_FIRST = M_IDX.format("first")
M_TREE = "pld.NgramIndex[recent].propose_tree + 2 guesses"
M_PREV = "compared build: NgramIndex[first]"
CORPUS_SIZES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=options.int_list(16), default=None,
                   help="comma-separated context lengths (default: %s)"
                   % ",".join(map(str, DEFAULT_SIZES)))
    p.add_argument("--repeats", type=options.at_least(1), default=60,
                   help="max timed batches per one-shot cell (default 60)")
    p.add_argument("--budget", type=options.positive_float, default=2.5,
                   help="max seconds per one-shot cell (default 2.5; >= 3 calls always)")
    p.add_argument("--steps", type=options.at_least(1), default=20000,
                   help="index steps timed per cell (default 20000)")
    p.add_argument("--segment", type=options.at_least(1), default=4000,
                   help="steps per round: the context runs from L to L + segment and is "
                   "truncated back (default 4000)")
    p.add_argument("--batch", type=options.at_least(1), default=500,
                   help="index steps per timed batch (default 500)")
    p.add_argument("--stream", choices=("real", "random", "both"), default="both")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: sizes %s, fewer steps and repeats"
                   % ",".join(map(str, QUICK_SIZES)))
    p.add_argument("--no-dict-memory", action="store_true",
                   help="skip the tracemalloc estimate of the dict index's memory")
    p.add_argument("--dict-memory-max", type=int, default=131072,
                   help="largest L for the dict memory estimate (default 131072)")
    p.add_argument("--checks", type=options.at_least(0), default=3,
                   help="agreement-checked steps per L (default 3)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch intra-op threads for the torch baselines (default 1: a "
                   "lookup step is latency-bound, and on a busy or small machine "
                   "torch's thread pool adds ms-scale wake-up stalls; 0 = torch's default)")
    p.add_argument("--compare-build", metavar="SO", default=None,
                   help="path of another build of pld's extension (pld/_core*.so): its "
                   "NgramIndex[first] steps in the same rounds, side by side")
    p.add_argument("--seed", type=int, default=0,
                   help="hash seed of pld's indexes (default 0: a reproducible layout)")
    p.add_argument("--out", default=os.path.join("bench-out", "lookup"),
                   help="output directory (default bench-out/lookup)")
    p.add_argument("--corpus", action="store_true",
                   help="run the corpus lookup table instead (pld.Corpus.propose_tree per corpus "
                   "size; see above)")
    p.add_argument("--corpus-sizes", type=options.int_list(100), default=None,
                   help="comma-separated corpus sizes in tokens (default %s)"
                   % ",".join(map(str, CORPUS_SIZES)))
    p.add_argument("--corpus-calls", type=options.at_least(1), default=3000,
                   help="timed propose_tree calls per corpus size (default 3000)")


def load_build(path: str):
    """Another build of pld's extension module, loaded beside this one (as
    module pld_compared_build._core), for side-by-side timing."""
    import importlib.util

    if not os.path.isfile(path):
        raise SystemExit(f"--compare-build: no such file: {path}")
    spec = importlib.util.spec_from_file_location("pld_compared_build._core", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--compare-build: {path} is not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ timing

def _now() -> int:
    return time.perf_counter_ns()


def time_oneshot(fn: Callable, args: Sequence, repeats: int, budget: float,
                 min_calls: int = 3) -> Dict:
    """Median of per-batch means of fn(arg), args cycled. The batch size is
    chosen so a batch lasts about 2 ms (one call for slow functions)."""
    t0 = _now()
    fn(args[0])  # warm-up, also the calibration
    one = max(_now() - t0, 1)
    per_batch = max(1, min(1000, int(2e6 // one)))
    deadline = _now() + int(budget * 1e9)
    means: List[float] = []
    calls = 0
    i = 0
    n_args = len(args)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        while True:
            t0 = _now()
            for _ in range(per_batch):
                fn(args[i % n_args])
                i += 1
            dt = _now() - t0
            means.append(dt / per_batch)
            calls += per_batch
            if len(means) >= repeats and calls >= min_calls:
                break
            if _now() >= deadline and calls >= min_calls:
                break
    finally:
        if gc_was:
            gc.enable()
    return {"us": statistics.median(means) / 1e3, "us_mean": sum(means) / len(means) / 1e3,
            "us_min": min(means) / 1e3, "calls": calls, "batches": len(means)}


def time_steps(indexes: Dict[str, object], L: int,
               rounds: Sequence[Tuple[List[int], List[int]]],
               batch: int) -> Dict[str, Dict]:
    """Steps (propose(K) then extend(token)) for several indexes that hold
    the first L tokens of the stream; `rounds` is a list of (warmup,
    follow) token lists, fresh ones for every round.

    In each round every index (in a rotating order, so that all see the
    same machine conditions) first steps through `warmup` (the index's hot
    data -- small tables, cached ids, the allocator -- comes back into
    cache after the previous index ran), is truncated back to L, and then
    runs all of `follow` back to back, timed per batch of `batch` steps.
    The tokens of `follow` have not been through the index before, as in a
    generation: a round that replayed tokens already stepped through would
    find their table slots still in cache from the truncation. Truncation
    is untimed; the context stays within [L, L + len(follow)]. The cell is
    the median of the timed batches' means; the first warm-up batch of each
    round, which runs on the caches the previous index left, is reported
    as "cold". {name: index} -> {name: stats}."""
    names = list(indexes)
    warm: Dict[str, List[float]] = {n: [] for n in names}
    cold: Dict[str, List[float]] = {n: [] for n in names}
    totals = dict.fromkeys(names, 0)
    steps = sum(len(follow) for _, follow in rounds)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r, (warmup, follow) in enumerate(rounds):
            chunks = [follow[b:b + batch] for b in range(0, len(follow), batch)]
            first_warmup, rest_warmup = warmup[:batch], warmup[batch:]
            for j in range(len(names)):
                name = names[(r + j) % len(names)]
                ix = indexes[name]
                ix.truncate(L)
                run = _step_loop(ix)
                if first_warmup:
                    cold[name].append(_warm_up_steps(ix, L, run, first_warmup, rest_warmup))
                for chunk in chunks:
                    t0 = _now()
                    run(chunk)
                    dt = _now() - t0
                    totals[name] += dt
                    warm[name].append(dt / len(chunk))
    finally:
        if gc_was:
            gc.enable()
    return {name: _step_stats(warm[name], cold[name], totals[name], steps) for name in names}


def _warm_up_steps(ix, L: int, run: Callable[[List[int]], None], first: List[int],
                   rest: List[int]) -> float:
    """Step ix through first (timed: the "cold" ns per step, returned) and
    rest (untimed), then truncate it back to L."""
    t0 = _now()
    run(first)
    cold = (_now() - t0) / len(first)
    run(rest)
    ix.truncate(L)
    return cold


def _step_stats(warm: List[float], cold: List[float], total: int, steps: int) -> Dict:
    """One index's cell from its timed batches' ns-per-step means (`warm`),
    its cold first warm-up batches, and the ns of all `steps` timed steps:
    median, mean, cold median (None without warm-up) and batch spread, in us."""
    ordered = sorted(warm)
    return {
        "us": statistics.median(ordered) / 1e3,
        "us_mean": total / steps / 1e3,
        "us_cold": statistics.median(cold) / 1e3 if cold else None,
        "us_min_batch": ordered[0] / 1e3,
        "us_p10_batch": ordered[len(ordered) // 10] / 1e3,
        "us_max_batch": ordered[-1] / 1e3,
        "steps": steps, "batches": len(ordered)}


def _step_loop(ix) -> Callable[[List[int]], None]:
    """The timed loop over tokens: one propose and one extend per token."""
    propose, extend = ix.propose, ix.extend

    def run(tokens: List[int]) -> None:
        for tok in tokens:
            propose(K)
            extend(tok)
    return run


class _TreeSteps:
    """An index whose propose(k) is what a token-tree step asks of it:
    propose_tree(k, per_ngram=4, max_nodes=64), then for each of two
    guessed next tokens (``guesses``, ids of the text) the trie as if the
    guess came next (extend, propose_tree(k - 1), truncate back)."""

    def __init__(self, ix, guesses) -> None:
        tree, extend, truncate = ix.propose_tree, ix.extend, ix.truncate

        def propose(k):
            tree(k, 4, 64)
            n = len(ix)
            for g in guesses:
                extend(g)
                tree(k - 1, 4, 64)
                truncate(n)

        self.propose = propose
        self.extend, self.truncate = extend, truncate


class _NoOpIndex:
    """The harness floor: the step loop calling two builtins that do nothing."""
    propose = extend = truncate = staticmethod(abs)


# -------------------------------------------------------------- reporting

def machine_info() -> Dict:
    from .report import _cpu_name

    info = {"cpu": _cpu_name(), "cores": os.cpu_count(), "platform": platform.platform()}
    try:
        info["loadavg_at_start"] = list(os.getloadavg())
    except OSError:
        pass
    return info


def versions() -> Dict:
    import pld
    v = {"python": sys.version.split()[0], "pld": getattr(pld, "__version__", "?"),
         "numpy": np.__version__}
    for mod in ("torch", "transformers", "matplotlib"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:
            v[mod] = None
    try:
        import torch
        v["torch_threads"] = torch.get_num_threads()
    except Exception:
        pass
    return v


def _fmt_us(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _fmt_ratio(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}x"
    return f"{x:.1f}x"


def _label(L: int) -> str:
    if L >= 1 << 20 and L % (1 << 20) == 0:
        return f"{L >> 20}M"
    if L >= 1024 and L % 1024 == 0:
        return f"{L >> 10}k"
    return str(L)


def speed_table(res: Dict, sizes: Sequence[int], methods: Sequence[str]) -> str:
    head = "| method | " + " | ".join(f"L={_label(L)}" for L in sizes) + " |"
    sep = "|---|" + "---:|" * len(sizes)
    rows = [head, sep]
    for m in methods:
        cells = res.get(m, {})
        if not cells:
            continue
        rows.append(f"| {m} | " + " | ".join(
            _fmt_us(cells.get(str(L), {}).get("us")) for L in sizes) + " |")
    # more statistics of the index rows: (method, statistic, label)
    for m, stat, label in ((IDX_FIRST, "us_mean", "mean over all steps"),
                           (IDX_FIRST, "us_min_batch", "fastest batch"),
                           (IDX_FIRST, "us_cold", "first batch after another index ran (cold)")):
        cells = res.get(m, {})
        if cells:
            rows.append(f"| *{m}, {label}* | " + " | ".join(
                _fmt_us(cells.get(str(L), {}).get(stat)) for L in sizes) + " |")
    first = res.get(IDX_FIRST, {})
    for other in (M_TORCH, M_HF, M_DICT, M_FIND):
        cells = res.get(other, {})
        if not cells:
            continue
        ratios = []
        for L in sizes:
            a, b = cells.get(str(L), {}).get("us"), first.get(str(L), {}).get("us")
            ratios.append(_fmt_ratio(a / b) if a and b else "-")
        rows.append(f"| *{other} / NgramIndex[first]* | " + " | ".join(ratios) + " |")
    prev = res.get(M_PREV, {})
    if prev:
        ratios = []
        for L in sizes:
            a, b = first.get(str(L), {}).get("us"), prev.get(str(L), {}).get("us")
            ratios.append(_fmt_ratio(a / b) if a and b else "-")
        rows.append(f"| *{IDX_FIRST} / {M_PREV}* | " + " | ".join(ratios) + " |")
    return "\n".join(rows)


def memory_table(mem: Dict, sizes: Sequence[int]) -> str:
    head = "| index | " + " | ".join(f"L={_label(L)}" for L in sizes) + " |"
    rows = [head, "|---|" + "---:|" * len(sizes)]
    for name, cells in mem.items():
        rows.append(f"| {name} | " + " | ".join(
            (f"{cells[str(L)]:.1f}" if cells.get(str(L)) is not None else "-")
            for L in sizes) + " |")
    return "\n".join(rows)


def criteria(results: Dict, sizes: Sequence[int]) -> List[Dict]:
    """The acceptance targets, per stream."""
    out = []
    for sname, sres in results.items():
        t = sres["time"]
        first = t.get(IDX_FIRST, {})
        worst = max((c["us"] for L, c in first.items() if int(L) <= 1 << 20), default=None)
        fast = max((c.get("us_min_batch", c["us"]) for L, c in first.items()
                    if int(L) <= 1 << 20), default=None)
        out.append({"stream": sname, "criterion": "NgramIndex[first] step <= 0.5 us at every L <= 1M",
                    "value": (f"max {_fmt_us(worst)} us (fastest batches: max {_fmt_us(fast)} us)"
                              if worst is not None else "n/a"),
                    "pass": worst is not None and worst <= 0.5})
        tree = {int(L): c["us"] for L, c in t.get(M_TREE, {}).items() if int(L) <= 1 << 20}
        if tree:
            # a bounded walk (at most ~4 occurrences of each n-gram size): its
            # time grows only as the index leaves the caches, as every row's does
            # (three tries a step: about three times propose_tree's own time)
            out.append({"stream": sname, "criterion": "propose_tree + 2 guesses step <= 6 us at every L <= 1M",
                        "value": f"{_fmt_us(tree[min(tree)])} us at L={_label(min(tree))}, max "
                                 f"{_fmt_us(max(tree.values()))} us", "pass": max(tree.values()) <= 6})
        c32 = str(32768)
        if c32 in first and c32 in t.get(M_TORCH, {}):
            r = t[M_TORCH][c32]["us"] / first[c32]["us"]
            out.append({"stream": sname, "criterion": "torch_seed >= 1000x NgramIndex step at L=32k",
                        "value": _fmt_ratio(r), "pass": r >= 1000})
        dr = [t[M_DICT][L]["us"] / first[L]["us"] for L in first if L in t.get(M_DICT, {})]
        if dr:
            out.append({"stream": sname, "criterion": "NgramIndex >= 5x faster than dict index (every L)",
                        "value": f"min {_fmt_ratio(min(dr))}", "pass": min(dr) >= 5})
        mem = sres["memory"].get(IDX_FIRST, {})
        big = str(1 << 20)
        if mem.get(big) is not None:
            after = sres["memory"].get(IDX_FIRST + " after steps", {}).get(big)
            extra = f" (after the timed steps: {after:.1f})" if after is not None else ""
            out.append({"stream": sname, "criterion": "NgramIndex[first] memory <= 64 B/token at 1M",
                        "value": f"{mem[big]:.1f} B/token{extra}", "pass": mem[big] <= 64})
    return out


def plot(results: Dict, sizes: Sequence[int], path: str, methods: Sequence[str]) -> Optional[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"no plot (matplotlib: {exc!r})"
    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 5), squeeze=False,
                             sharey=True)
    styles = {M_TORCH: ("tab:red", "o", "-"), M_HF: ("tab:orange", "s", "-"),
              M_DICT: ("tab:purple", "^", "-"), M_FIND: ("tab:blue", "D", "-"),
              M_IDX.format("first"): ("tab:green", "o", "-"),
              M_IDX.format("recent"): ("tab:olive", "v", "--"),
              M_IDX.format("frequent"): ("tab:cyan", "x", "--"),
              M_TREE: ("tab:purple", "*", "-.")}
    for ax, sname in zip(axes[0], names):
        t = results[sname]["time"]
        for m in methods:
            cells = t.get(m, {})
            xs = [L for L in sizes if str(L) in cells]
            if not xs:
                continue
            color, marker, ls = styles.get(m, (None, ".", "-"))
            ax.plot(xs, [cells[str(L)]["us"] for L in xs], marker=marker, ls=ls,
                    color=color, label=m)
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.text(sizes[-1], 0.5, "0.5 us target ", va="top", ha="right", fontsize=8,
                color="grey")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length L (tokens)")
        ax.set_title(f"stream: {sname}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per generation step (us)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    # below the panels: inside, it would cover the curves
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=4)
    fig.suptitle("prompt lookup: time per step vs context length (lower is better)")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# ------------------------------------------------------------------ checks

def _check_agreement(L: int, j: int, ctx_t, cidx, didx, torch_seed, pld, hf_make) -> None:
    """All seed-semantics answers must agree at context length L + j."""
    a = cidx.propose(K)
    b = didx.propose(K)
    c = torch_seed(ctx_t, MAX_N, K).tolist()
    d = pld.find_candidate_pred_tokens(ctx_t, MAX_N, K).tolist()
    if not (a == b == c == d):
        raise AssertionError(
            f"disagreement at context length {L + j}: NgramIndex={a} dict={b} "
            f"torch_seed={c} pld.find={d}")
    if hf_make is not None:
        n = ctx_t.size(1)
        call, _ = hf_make(n + 100)
        if call is not None:
            from .baselines import transformers_draft
            h = transformers_draft(call(ctx_t), n)
            p = pld.find_candidate_pred_tokens(ctx_t, MAX_N, K, semantics="transformers",
                                               max_length=n + 100).tolist()
            q = cidx.propose(K, semantics="transformers", max_length=n + 100)
            if not (h == p == q):
                raise AssertionError(
                    f"transformers semantics disagree at {n}: transformers={h} "
                    f"pld.find={p} NgramIndex={q}")


def dict_memory(tokens: np.ndarray, L: int) -> float:
    """Bytes per token of a PyDictIndex over tokens[:L], via tracemalloc
    (dict, keys, token list and the token int objects it holds)."""
    from .baselines import PyDictIndex
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        ix = PyDictIndex(MAX_N, MIN_N)
        ix.extend_many(tokens[:L].tolist())
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    del ix
    return used / L


# -------------------------------------------------------------------- run

class _Plan(NamedTuple):
    """The run's shape, from the options (see _plan)."""
    sizes: List[int]
    steps: int
    segment: int
    rounds: int
    batch: int
    repeats: int
    budget: float
    streams: List[str]


class _Tokens(NamedTuple):
    """A stream's first `need` tokens, three ways: the NumPy array (the
    whole stream), a list of Python ints, and a torch tensor (None without
    torch)."""
    array: np.ndarray
    ints: List[int]
    tensor: object


class _Run(NamedTuple):
    """What every cell of a run shares."""
    args: argparse.Namespace
    plan: _Plan
    torch: object            # the module, or None
    hf_make: Optional[Callable]
    compared: object         # the other build's module, or None
    methods: List[str]
    bar: object              # a tqdm bar, or None
    log: Callable[[str], None]


def run(args: argparse.Namespace) -> int:
    """`python -m pld bench lookup`: time every method per stream and
    context length, print the report and write table.md, results.json and
    lookup.png into --out. Returns 0."""
    if getattr(args, "corpus", False):
        return run_corpus(args)
    plan = _plan(args)
    os.makedirs(args.out, exist_ok=True)

    try:
        from tqdm.auto import tqdm
    except Exception:
        tqdm = None

    torch = _import_torch(args.torch_threads)
    hf_make, hf_note = _transformers_maker(torch, plan.sizes[0])
    info = _run_info(plan, args.quick, hf_note)

    floor = time_steps({"floor": _NoOpIndex()}, 0,
                       [([], list(range(1000, 1000 + plan.segment)))] * plan.rounds,
                       plan.batch)["floor"]["us"]
    info["harness_floor_us"] = floor
    print(f"harness floor (the step loop with two builtin calls): {floor:.3f} us/step")

    need = plan.sizes[-1] + 2 * plan.rounds * plan.segment + 16
    compared = load_build(args.compare_build) if args.compare_build else None
    methods = [M_TORCH, M_HF, M_DICT, M_FIND, IDX_FIRST] + [
        M_IDX.format(p) for p in POLICIES[1:]] + [M_TREE] + ([M_PREV] if compared else [])
    n_cells = len(plan.streams) * len(plan.sizes) * (3 + (1 if hf_make else 0))
    bar = tqdm(total=n_cells, unit="cell", dynamic_ncols=True) if tqdm else None
    ctx = _Run(args, plan, torch, hf_make, compared, methods, bar, bar.write if bar else print)
    t_start = time.perf_counter()
    results: Dict[str, Dict] = {sname: _bench_stream(ctx, sname, need) for sname in plan.streams}
    if bar:
        bar.close()
    elapsed = time.perf_counter() - t_start

    try:
        info["loadavg_at_end"] = list(os.getloadavg())
    except OSError:
        pass
    crit = criteria(results, plan.sizes)
    text = _markdown(info, results, crit, plan, methods, elapsed)
    print()
    print(text)
    _write_outputs(args.out, info, elapsed, results, crit, plan.sizes, methods, text)
    return 0


def _plan(args: argparse.Namespace) -> _Plan:
    """The sizes (sorted, distinct) and counts the options ask for:
    --quick caps steps, repeats and budget; the segment is at most the
    steps, which round up to whole rounds of it; a batch is at most a
    segment. (argparse has checked each number's bound.)"""
    if args.sizes:
        sizes = sorted(set(args.sizes))
    elif args.quick:
        sizes = list(QUICK_SIZES)
    else:
        sizes = list(DEFAULT_SIZES)
    steps, batch, repeats, budget = args.steps, args.batch, args.repeats, args.budget
    if args.quick:
        steps, repeats, budget = min(steps, 2000), min(repeats, 10), min(budget, 0.3)
    segment = min(args.segment, steps)
    rounds = -(-steps // segment)
    steps = rounds * segment
    batch = min(batch, segment)
    stream_names = ["real", "random"] if args.stream == "both" else [args.stream]
    return _Plan(sizes, steps, segment, rounds, batch, repeats, budget, stream_names)


def _import_torch(threads: int):
    """torch, set to `threads` intra-op threads when threads > 0; None,
    after saying what that leaves out, when torch does not import."""
    try:
        import torch
    except Exception as exc:
        print(f"torch not importable ({exc!r}): torch_seed, transformers and the "
              "tensor calls of pld.find_candidate_pred_tokens use numpy arrays / are skipped")
        return None
    if threads > 0:
        torch.set_num_threads(threads)
    return torch


def _transformers_maker(torch, size: int) -> Tuple[Optional[Callable], str]:
    """(make, note): baselines.make_transformers_generator when a
    transformers generator builds for contexts of `size` + 100 tokens, else
    None (saying why); note is the probe's ("" without torch)."""
    from . import baselines

    if torch is None:
        return None, ""
    probe, note = baselines.make_transformers_generator(size + 100)
    if probe is not None:
        return baselines.make_transformers_generator, note
    print(f"transformers baseline skipped: {note}")
    return None, note


def _run_info(plan: _Plan, quick: bool, hf_note: str) -> Dict:
    """results.json's machine, versions and config (printing the first
    two)."""
    info = {"machine": machine_info(), "versions": versions(),
            "config": {"sizes": plan.sizes, "num_pred_tokens": K, "max_ngram_size": MAX_N,
                       "min_ngram_size": MIN_N, "steps": plan.steps, "segment": plan.segment,
                       "rounds": plan.rounds, "batch": plan.batch,
                       "repeats": plan.repeats, "budget_s": plan.budget, "quick": quick,
                       "transformers_note": hf_note}}
    m, v = info["machine"], info["versions"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, load avg {m.get('loadavg_at_start')}")
    print("versions: " + ", ".join(f"{k} {v[k]}" for k in
                                   ("python", "torch", "transformers", "numpy", "pld")))
    return info


def _bench_stream(ctx: _Run, sname: str, need: int) -> Dict:
    """Every context length's cells on stream `sname` (at least `need`
    tokens, else RuntimeError): {"description", "fallback", "tokens",
    "time": {method: {L: stats}} (methods with cells only), "memory":
    {index: {L: bytes per token}}}."""
    from . import baselines, streams

    stream = streams.get_stream(sname, need, log=ctx.log)
    toks = stream.tokens
    if toks.size < need:
        raise RuntimeError(f"stream {sname} has {toks.size} tokens, need {need}")
    ctx.log(f"stream {sname}: {stream.description} ({toks.size:,} tokens)")
    torch = ctx.torch
    tok = _Tokens(toks, toks[:need].tolist(),
                  torch.from_numpy(np.ascontiguousarray(toks[:need])) if torch is not None else None)
    tres: Dict[str, Dict] = {mm: {} for mm in ctx.methods}
    mres: Dict[str, Dict] = {M_IDX.format(p): {} for p in POLICIES}
    for p in POLICIES:  # the same index after the timed steps (L + segment tokens)
        mres[M_IDX.format(p) + " after steps"] = {}
    if not ctx.args.no_dict_memory:
        mres[M_DICT + " (tracemalloc)"] = {}
    didx = baselines.PyDictIndex(MAX_N, MIN_N)
    segment = ctx.plan.segment
    # the same contexts for the one-shot methods: stream[:L + s]
    offsets = sorted({min(segment - 1, o) for o in (0, 1, 2, 97, 389, 1231, 2053, 3989)})
    for L in ctx.plan.sizes:
        _bench_size(ctx, sname, L, tok, didx, offsets, tres, mres)
    del didx
    gc.collect()
    return {"description": stream.description, "fallback": stream.fallback,
            "tokens": int(toks.size), "time": {k2: v2 for k2, v2 in tres.items() if v2},
            "memory": mres}


def _tick(ctx: _Run, sname: str, L: int, label: str) -> None:
    """Advance the progress bar (if any) by one cell, labelled."""
    if ctx.bar:
        ctx.bar.set_description(f"{sname} L={_label(L)} {label}")
        ctx.bar.update(1)


def _bench_size(ctx: _Run, sname: str, L: int, tok: _Tokens, didx, offsets: List[int],
                tres: Dict[str, Dict], mres: Dict[str, Dict]) -> None:
    """Context length L's cells, into tres/mres under key str(L): the
    indexes (built untimed, checked, stepped), the dict index's memory,
    then the one-shot methods on stream[:L + s] for s in offsets. didx,
    the dict index, holds the stream up to an earlier L on entry and
    stream[:L] on return."""
    plan = ctx.plan
    segment = plan.segment
    # round r warms up on one fresh segment after stream[:L] and
    # times the next one: stream[:L] + that segment is the context
    per_round = [(tok.ints[L + 2 * r * segment:L + (2 * r + 1) * segment],
                  tok.ints[L + (2 * r + 1) * segment:L + (2 * r + 2) * segment])
                 for r in range(plan.rounds)]
    didx.extend_many(tok.ints[len(didx):L])
    if tok.tensor is not None:
        _check_size(ctx, L, tok, didx)
    _time_indexes(ctx, L, tok, didx, per_round, tres, mres)
    didx.truncate(L)
    _tick(ctx, sname, L, "indexes")
    if not ctx.args.no_dict_memory and L <= ctx.args.dict_memory_max:
        mres[M_DICT + " (tracemalloc)"][str(L)] = dict_memory(tok.array, L)
    _time_oneshots(ctx, sname, L, tok, offsets, tres)


def _check_size(ctx: _Run, L: int, tok: _Tokens, didx) -> None:
    """The agreement checks (_check_agreement) at L .. L + --checks - 1, on
    a throwaway C index; didx steps along and is truncated back to L."""
    import pld
    from . import baselines

    chk = pld.NgramIndex(MAX_N, MIN_N, "first")
    chk.extend(tok.array[:L])
    for j in range(min(ctx.args.checks, ctx.plan.segment)):
        _check_agreement(L, j, tok.tensor[None, :L + j], chk, didx,
                         baselines.torch_seed_find_candidate_pred_tokens,
                         pld, ctx.hf_make if j == 0 else None)
        chk.extend(tok.ints[L + j])
        didx.extend(tok.ints[L + j])
    didx.truncate(L)


def _index_group(ctx: _Run, L: int, tok: _Tokens, didx,
                 mres: Dict[str, Dict]) -> Tuple[Dict[str, object], Dict[str, object]]:
    """(pld's indexes by policy, every index to time by method), each
    index over stream[:L] with room reserved for a segment and its own
    state and caches; records the policy indexes' bytes per token at L in
    mres."""
    import pld

    seed, segment, array = ctx.args.seed, ctx.plan.segment, tok.array
    cidx = {}
    for pol in POLICIES:
        ix = pld.NgramIndex(MAX_N, MIN_N, pol, seed=seed)
        ix.extend(array[:L])
        mres[M_IDX.format(pol)][str(L)] = ix.nbytes / L
        ix.reserve(segment)  # as pld's loop reserves max_new_tokens
        cidx[M_IDX.format(pol)] = ix
    tree_ix = pld.NgramIndex(MAX_N, MIN_N, "recent", seed=seed)  # own state and caches
    tree_ix.extend(array[:L])
    tree_ix.reserve(segment)
    group = dict(cidx)
    group[M_TREE] = _TreeSteps(tree_ix, (int(array[0]), int(array[1])))
    group[M_DICT] = didx
    if ctx.compared is not None:
        other = ctx.compared.NgramIndex(MAX_N, MIN_N, "first")
        other.extend(array[:L])
        other.reserve(segment)
        group[M_PREV] = other
    return cidx, group


def _time_indexes(ctx: _Run, L: int, tok: _Tokens, didx, per_round: List[Tuple[List[int], List[int]]],
                  tres: Dict[str, Dict], mres: Dict[str, Dict]) -> None:
    """Time the index steps (time_steps over per_round) into tres, and
    record pld's indexes' bytes per token, at L and after the steps, in
    mres. didx is left beyond L (the caller truncates it)."""
    key = str(L)
    cidx, group = _index_group(ctx, L, tok, didx, mres)
    for name, stats in time_steps(group, L, per_round, ctx.plan.batch).items():
        tres[name][key] = stats
    follow = per_round[-1][1]
    for name, ix in cidx.items():
        ix.extend(follow)  # (the last round truncated it back to L)
        mres[name + " after steps"][key] = ix.nbytes / len(ix)


def _time_oneshots(ctx: _Run, sname: str, L: int, tok: _Tokens, offsets: List[int],
                   tres: Dict[str, Dict]) -> None:
    """Time the one-shot methods on the contexts stream[:L + s], s in
    offsets, into tres: pld.find, torch_seed and transformers (when it
    builds) on tensors, or pld.find alone on NumPy arrays without torch."""
    import pld
    from . import baselines

    key, repeats, budget, hf_make = str(L), ctx.plan.repeats, ctx.plan.budget, ctx.hf_make
    if tok.tensor is not None:
        ctxs = [tok.tensor[None, :L + s] for s in offsets]
        tres[M_FIND][key] = time_oneshot(
            lambda c: pld.find_candidate_pred_tokens(c, MAX_N, K), ctxs, repeats, budget)
        _tick(ctx, sname, L, "pld.find")
        tres[M_TORCH][key] = time_oneshot(
            lambda c: baselines.torch_seed_find_candidate_pred_tokens(c, MAX_N, K),
            ctxs, repeats, budget)
        _tick(ctx, sname, L, "torch_seed")
        if hf_make is not None:
            calls = [(hf_make(c.size(1) + 100)[0], c) for c in ctxs]
            tres[M_HF][key] = time_oneshot(lambda fc: fc[0](fc[1]), calls,
                                           repeats, budget)
            _tick(ctx, sname, L, "transformers")
    else:
        arrs = [tok.array[None, :L + s] for s in offsets]
        tres[M_FIND][key] = time_oneshot(
            lambda c: pld.find_candidate_pred_tokens(c, MAX_N, K), arrs, repeats, budget)
        _tick(ctx, sname, L, "pld.find")


def _markdown(info: Dict, results: Dict, crit: List[Dict], plan: _Plan, methods: Sequence[str],
              elapsed: float) -> str:
    """table.md's text: the run's description, per stream the time and
    memory tables, then the criteria table."""
    m, v = info["machine"], info["versions"]
    segment = plan.segment
    md = ["# pld lookup benchmark\n",
          f"- machine: {m['cpu']}, {m['cores']} cores (load avg at start {m.get('loadavg_at_start')})",
          "- versions: " + ", ".join(f"{k} {v[k]}" for k in
                                     ("python", "torch", "transformers", "numpy", "pld")),
          f"- lookup: max_ngram_size={MAX_N}, num_pred_tokens={K}; index steps: {plan.rounds} "
          f"rounds of {segment} steps (context L .. L + {segment}); in each round the indexes "
          f"take turns, each warming up on {segment} fresh tokens (then truncated away) "
          f"before its timed steps on {segment} more fresh tokens; batches of {plan.batch}; "
          f"cell = median of the batch means; "
          f"one-shot: median of batch means, <= {plan.repeats} batches / {plan.budget} s per cell; "
          "gc off while timing",
          f"- torch threads: {v.get('torch_threads')}; load avg at start "
          f"{m.get('loadavg_at_start')}, at end {info.get('loadavg_at_end')}",
          f"- harness floor (step loop calling two no-op builtins): {info['harness_floor_us']:.3f} us/step",
          f"- memory: pld = NgramIndex.nbytes / L at L, and / (L + {segment}) after the timed "
          f"steps (with room reserved for them); dict = tracemalloc (dict, keys, token list "
          "and ints)",
          f"- run time {elapsed:.0f} s\n"]
    for sname, sres in results.items():
        md.append(f"## stream `{sname}`: time per step (us)\n")
        md.append(f"{sres['description']}, {sres['tokens']:,} tokens\n")
        md.append(speed_table(sres["time"], plan.sizes, methods) + "\n")
        md.append(f"### stream `{sname}`: memory (bytes per context token)\n")
        md.append(memory_table(sres["memory"], plan.sizes) + "\n")
    md.append("## criteria\n")
    md.append("| stream | criterion | value | pass |\n|---|---|---|---|")
    for c in crit:
        md.append(f"| {c['stream']} | {c['criterion']} | {c['value']} | "
                  f"{'PASS' if c['pass'] else 'FAIL'} |")
    return "\n".join(md) + "\n"


def _write_outputs(out: str, info: Dict, elapsed: float, results: Dict, crit: List[Dict],
                   sizes: Sequence[int], methods: Sequence[str], text: str) -> None:
    """Write table.md (text), results.json and lookup.png (when matplotlib
    imports; else print why not) into `out`, and say what was written."""
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({**info, "elapsed_s": elapsed, "results": results, "criteria": crit},
                  f, indent=2)
    note = plot(results, sizes, os.path.join(out, "lookup.png"), methods)
    if note:
        print(note)
    print(f"wrote {out}/table.md, results.json" + ("" if note else ", lookup.png"))


# ------------------------------------------------------------------ corpus

def corpus_stream(n_tokens: int, seed: int = 0, vocab: int = 49152) -> List[np.ndarray]:
    """Sequences (int64 arrays of 64..1023 tokens, the last cut to fit) of
    n_tokens text-like ids in all, the same for the same arguments:
    Zipf-distributed ids (exponent 1.1, ranks shuffled over the vocabulary),
    about a third of them overwritten by phrases of 4..24 tokens drawn
    (Zipf again) from a bank of 20,000, as text repeats its phrases."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(vocab)

    def zipf(n: int) -> np.ndarray:
        return perm[(rng.zipf(1.1, n) - 1) % vocab].astype(np.int64)

    stream = zipf(n_tokens)
    bank_lens = rng.integers(4, 25, 20_000)
    bank = np.split(zipf(int(bank_lens.sum())), np.cumsum(bank_lens)[:-1])
    pos = 0
    gaps = rng.integers(0, 48, n_tokens // 24 + 1)
    picks = (rng.zipf(1.2, gaps.size) - 1) % len(bank)
    for gap, pick in zip(gaps.tolist(), picks.tolist()):
        pos += gap
        phrase = bank[pick]
        if pos + phrase.size > n_tokens:
            break
        stream[pos:pos + phrase.size] = phrase
        pos += phrase.size
    lens = rng.integers(64, 1024, n_tokens // 64 + 2)
    cuts = np.cumsum(lens)
    cuts = cuts[cuts < n_tokens]
    return [s for s in np.split(stream, cuts) if s.size]


def _corpus_contexts(corpus: Any, seqs: List[Any], size: int, calls: int, seed: int) -> Tuple[list, list]:
    """``calls`` contexts of 8 ids cut from the sequences held (drafts
    found), and as many of ids above the vocabulary: no n-gram of these is
    held, so such a call is the probes alone (every segment, every n)."""
    rng = np.random.default_rng(seed + 1)
    held = corpus.sequences() if size <= 1_000_000 else [s.tolist() for s in seqs[-2000:]]
    contexts = []
    for _ in range(calls):
        s = held[int(rng.integers(len(held)))]
        at = int(rng.integers(min(8, len(s)), len(s) + 1))
        contexts.append(s[max(0, at - 8):at])
    return contexts, rng.integers(49152, 49152 + 1_000_000, (calls, 8)).tolist()


def time_corpus(size: int, calls: int, seed: int = 0) -> Dict:
    """One row of the corpus table: a pld.Corpus of `size` tokens (see
    corpus_stream), built untimed but for the build's wall time, then
    `calls` propose_tree calls timed one by one (gc off)."""
    from ..corpus import Corpus

    seqs = corpus_stream(size, seed)
    corpus = Corpus(size, min_ngram_size=2, max_ngram_size=4, segments=4, seed=seed)
    t0 = time.perf_counter()
    for s in seqs:
        corpus.add(s)
    build = time.perf_counter() - t0
    contexts, misses = _corpus_contexts(corpus, seqs, size, calls, seed)
    propose = corpus.propose_tree
    times, nodes, per_node, miss_times = [], 0, [], []
    for ctx in contexts[:50]:  # warm-up
        propose(ctx, 8, per_ngram=4, max_nodes=64)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for ctx, miss in zip(contexts, misses):
            t = time.perf_counter_ns()
            tree = propose(ctx, 8, per_ngram=4, max_nodes=64)
            times.append(time.perf_counter_ns() - t)
            nodes += len(tree[0])
            per_node.append(times[-1] / max(1, len(tree[0])))
            t = time.perf_counter_ns()
            propose(miss, 8, per_ngram=4, max_nodes=64)
            miss_times.append(time.perf_counter_ns() - t)
    finally:
        if gc_was:
            gc.enable()
    times.sort()
    per_node.sort()
    miss_times.sort()
    return {"size": size, "tokens": len(corpus), "sequences": corpus.num_sequences,
            "segments_used": corpus._core.segments_used, "build_s": build,
            "us_median": times[len(times) // 2] / 1e3, "us_p90": times[int(len(times) * 0.9)] / 1e3,
            "mean_nodes": nodes / len(contexts), "us_per_node_median": per_node[len(per_node) // 2] / 1e3,
            "us_no_match_median": miss_times[len(miss_times) // 2] / 1e3,
            "nbytes": corpus.nbytes,
            "bytes_per_token": corpus.bytes_per_token, "calls": len(contexts)}


def corpus_table(rows: Sequence[Dict]) -> str:
    """The corpus rows as a markdown table. A call's work is bounded by its
    trie (at most max_nodes), whatever the corpus's size; the tries fill up
    as a bigger corpus matches more, so "us per node" (the median over calls
    of time / nodes) shows the cost apart from how much was found, and "no
    match" the cost of the probes alone (a context none of whose n-grams is
    held: every segment and every n asked, nothing found)."""
    md = ["| corpus tokens | sequences | build (s) | propose_tree median (us) | p90 (us) | "
          "nodes (mean) | us per node (median) | no match (us) | MB | bytes/token |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['tokens']:,} | {r['sequences']:,} | {r['build_s']:.2f} | "
                  f"{r['us_median']:.2f} | {r['us_p90']:.2f} | {r['mean_nodes']:.1f} | "
                  f"{r['us_per_node_median']:.3f} | {r['us_no_match_median']:.2f} | "
                  f"{r['nbytes'] / 1e6:.1f} | {r['bytes_per_token']:.1f} |")
    return "\n".join(md) + "\n"


def run_corpus(args: argparse.Namespace) -> int:
    """`python -m pld bench lookup --corpus`: the corpus lookup table (see the
    module's docstring); prints it and writes corpus.md and corpus.json into
    --out. Returns 0."""
    sizes = sorted(set(args.corpus_sizes)) if args.corpus_sizes else list(CORPUS_SIZES)
    os.makedirs(args.out, exist_ok=True)
    info = {"machine": machine_info(), "versions": versions(),
            "config": {"sizes": sizes, "calls": args.corpus_calls, "seed": args.seed,
                       "depth": 8, "per_ngram": 4, "max_nodes": 64, "ngrams": [2, 4],
                       "segments": 4}}
    m = info["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, load avg {m.get('loadavg_at_start')}")
    rows = []
    for size in sizes:
        row = time_corpus(size, args.corpus_calls, args.seed)
        rows.append(row)
        print(f"corpus {size:,} tokens: {row['us_median']:.2f} us per propose_tree, "
              f"{row['bytes_per_token']:.1f} bytes/token, built in {row['build_s']:.2f} s")
        gc.collect()
    text = ("# pld corpus lookup\n\n"
            f"- machine: {m['cpu']}, {m['cores']} cores (load avg at start {m.get('loadavg_at_start')})\n"
            "- pld.Corpus(max_tokens=size, segments=4, n-grams 2..4) over a text-like stream "
            "(corpus_stream: Zipf ids over 49k, repeated phrases, sequences of 64-1023 tokens); "
            "propose_tree(8 context tokens, depth=8, per_ngram=4, max_nodes=64), each call timed, "
            f"median of {args.corpus_calls}\n\n" + corpus_table(rows))
    print()
    print(text)
    with open(os.path.join(args.out, "corpus.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump({**info, "rows": rows}, f, indent=2)
    print(f"wrote {args.out}/corpus.md, corpus.json")
    return 0
