"""Speedup tables: greedy, transformers' prompt lookup and pld side by side,
per task, on the same prompts in one process.

    python -m pld bench --limit 10                      # offline, built-in tasks
    python -m pld bench --source spec-bench --data question.jsonl --tasks summarization,rag,chat
    python -m pld bench --source hub --model mistralai/Mistral-7B-Instruct-v0.1 --device cuda --dtype float16

Methods come from the registry in :mod:`pld.bench.methods` and alternate per
prompt (the order rotates) so that machine drift hits all alike; each method
generates once first as a warm-up. Every output is compared with greedy's,
token for token. Two-turn chat: turn 2 sees greedy's answer to turn 1, the
same text for every method. Each generation is appended to
``OUT/results.jsonl`` as it finishes, so an interrupted run resumes where it
stopped (rows of another configuration are ignored). At the end the report
(:mod:`pld.bench.report`) writes the markdown table, CSV/JSON and plots.

"Tokens per forward" counts the model's forward passes (with hooks), the
prefill included, so it is the same measure for every method: 1.00 for
greedy, and the mean tokens gained per verification step for prompt lookup.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from . import methods as registry
from . import tasks as task_sources
from .options import DTYPES, at_least, threads

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", choices=task_sources.SOURCES, default="builtin",
                   help="where prompts come from (default: builtin, offline)")
    p.add_argument("--data", default="", help="the spec-bench question.jsonl (default: "
                   f"${task_sources.SPEC_BENCH_ENV}, else {task_sources.SPEC_BENCH_RELATIVE} "
                   "in the working directory or a parent)")
    p.add_argument("--tasks", default="all", help=f"'all' or some of {','.join(task_sources.TASKS)}")
    p.add_argument("--limit", type=at_least(1), default=10, help="prompts per task (default 10)")
    p.add_argument("--batch-size", type=at_least(1), default=1,
                   help="prompts a generation (default 1); B > 1 compares batched greedy with batched "
                        "pld at the same B (pld.bench.batch; first turns only; its own methods, so "
                        "not with --methods)")
    p.add_argument("--skip", type=at_least(0), default=0,
                   help="prompts per task to pass over first (default 0): fit on one set, report another")
    p.add_argument("--methods", default="default",
                   help="'default', 'all' or names from: " + ", ".join(registry.REGISTRY))
    p.add_argument("--max-new-tokens", type=at_least(1), default=64)
    p.add_argument("--prompt-chars", type=at_least(0), default=0,
                   help="cut each user turn to its first N characters, for a quick run (default 0: whole)")
    p.add_argument("--num-pred-tokens", type=at_least(1), default=10, help="draft length k (default 10)")
    p.add_argument("--max-ngram", type=at_least(1), default=3, help="largest n-gram matched (default 3)")
    p.add_argument("--model", default=None, help="a local folder, a .gguf file or a Hub id "
                   "(default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--threads", type=threads, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default="bench-out", help="folder for results.jsonl, tables and plots")
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming OUT/results.jsonl")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """`python -m pld bench`: generate with every chosen method on every
    prompt (resuming OUT/results.jsonl), then write and print the report.
    Returns 0; bad options raise SystemExit."""
    prompts = _prompts(args)
    chosen = registry.select(args.methods)

    import torch

    from pld import models

    from . import report

    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model, tokenizer = models.load(args.model, dtype=args.dtype, device=device)
    setup = registry.Setup(model, args.max_new_tokens, args.num_pred_tokens, args.max_ngram)
    generators = registry.build(chosen, setup)
    config = _config(args, device, models.EMBEDDED_NAME)
    fingerprint = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    results_path, done = _resume(args, fingerprint)

    meter = ForwardMeter(model, device)
    if args.batch_size > 1:
        from . import batch

        os.makedirs(args.out, exist_ok=True)
        return batch.run(args, prompts, model, tokenizer, meter, report.caption(config, torch, model))
    warm = chat_input_ids(tokenizer, ["Repeat exactly: the quick brown fox jumps over the lazy dog."], [])
    for gen in generators.values():
        gen(warm.to(device))
    _generate_all(prompts, generators, tokenizer, meter, device, results_path, done, fingerprint,
                  disable_progress=args.no_progress, warmed=int(warm.shape[1]))
    meter.remove()
    rows = this_run(prompts, generators, done)
    caption = report.caption(config, torch, model)
    text = report.write(rows, list(generators), args.out, caption)
    print(text)
    return 0


def _prompts(args: argparse.Namespace) -> List[Any]:
    """The prompts --source/--tasks/--limit/--skip name (--data, or the
    default spec-bench file for source spec-bench). ValueError when the
    spec-bench file is not found, no prompt matches, or --methods is given
    with --batch-size > 1."""
    tasks = task_sources.parse_tasks(args.tasks, args.source)
    prompts = task_sources.load(args.source, tasks, args.limit, _data(args), skip=args.skip)
    if not prompts:
        raise ValueError(f"no prompts for tasks {tasks} from source {args.source}")
    if args.prompt_chars:
        prompts = [dataclasses.replace(p, turns=tuple(t[:args.prompt_chars] for t in p.turns)) for p in prompts]
    if args.batch_size > 1 and args.methods != "default":
        raise ValueError("--methods: not with --batch-size > 1 (batched runs compare their own methods: "
                         "pld.bench.batch)")
    return prompts


def _data(args: argparse.Namespace) -> str:
    """The question file of --source spec-bench: --data, else the default
    one (ValueError when there is none); "" for the other sources."""
    if args.source != "spec-bench":
        return ""
    return args.data or task_sources.default_spec_bench()


def _file_identity(path: str) -> Dict[str, Any]:
    """A file's absolute path, size and sha1 (read in 1 MiB chunks)."""
    digest = hashlib.sha1()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return {"path": os.path.abspath(path), "bytes": os.path.getsize(path), "sha1": digest.hexdigest()}


def _config(args: argparse.Namespace, device: str, embedded_name: str) -> Dict[str, Any]:
    """The run's configuration: what a results row must have been made
    under to be resumed (its sha1 prefix is the rows' "config"), and the
    report's caption. The question file (spec-bench) is in it by path,
    size and content; --skip, --prompt-chars and --batch-size appear only
    when not default."""
    data = _data(args)
    return {"source": args.source, "model": args.model or embedded_name, "dtype": args.dtype,
            **({"data": _file_identity(data)} if data else {}),
            "device": device, "max_new_tokens": args.max_new_tokens,
            "num_pred_tokens": args.num_pred_tokens, "max_ngram": args.max_ngram,
            **({"skip": args.skip} if args.skip else {}),
            **({"prompt_chars": args.prompt_chars} if args.prompt_chars else {}),
            **({"batch_size": args.batch_size} if args.batch_size > 1 else {})}


def _resume(args: argparse.Namespace, fingerprint: str) -> Tuple[str, Dict[Tuple[str, int, str], Dict[str, Any]]]:
    """(OUT/results.jsonl, its rows of this configuration keyed by (id,
    turn, method)). Creates OUT; --fresh deletes the file first."""
    from . import report

    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.jsonl")
    if args.fresh and os.path.exists(results_path):
        os.remove(results_path)
    done = {_key(r): r for r in report.read_rows(results_path) if r.get("config") == fingerprint}
    return results_path, done


def this_run(prompts: List[Any], generators: Dict[str, Any],
             done: Dict[Tuple[str, int, str], Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows of this run's prompts, turns and methods (results.jsonl may
    hold others: earlier runs' other tasks, limits or methods)."""
    return [done[(p.id, turn, m)] for p in prompts for turn in range(1, len(p.turns) + 1) for m in generators]


def _generate_all(prompts: List[Any], generators: Dict[str, Any], tokenizer: Any, meter: "ForwardMeter",
                  device: str, results_path: str, done: Dict[Tuple[str, int, str], Dict[str, Any]],
                  fingerprint: str, disable_progress: bool, warmed: int = 0) -> None:
    """Every (prompt, turn, method) generation not already in `done`: run,
    add to `done` and append to results_path as it finishes. Prompt i runs
    the methods in the order rotated by i; turn t sees greedy's answers to
    the turns before it. A row is marked ``first_at_size`` when it is its
    method's first generation in this process at its context size class
    (pld.forward_cost.size_class; the warm-up, ``warmed`` tokens, took one):
    what a fresh process pays there, one-time costs included."""
    from pld.forward_cost import size_class

    seen = {(m, size_class(warmed)) for m in generators}
    total = sum(len(p.turns) for p in prompts) * len(generators)
    bar = _progress(total, disable=disable_progress)
    bar.update(sum(1 for p in prompts for t in range(len(p.turns)) for m in generators
                   if (p.id, t + 1, m) in done))
    names = list(generators)
    with open(results_path, "a", encoding="utf-8") as log:
        for i, p in enumerate(prompts):
            order = names[i % len(names):] + names[:i % len(names)]
            answers: List[str] = []
            for turn in range(1, len(p.turns) + 1):
                ids = chat_input_ids(tokenizer, p.turns[:turn], answers).to(device)
                for m in order:
                    if (p.id, turn, m) in done:
                        continue
                    row = measure(generators[m], ids, tokenizer, meter)
                    size = (m, size_class(int(ids.shape[1])))
                    row.update(id=p.id, task=p.task, category=p.category, turn=turn, method=m,
                               config=fingerprint, first_at_size=size not in seen)
                    seen.add(size)
                    done[(p.id, turn, m)] = row
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    bar.update(1)
                answers.append(done[(p.id, turn, "greedy")]["text"])
    bar.close()


def speedup_tables(**options: Any) -> Dict[str, Any]:
    """Run the benchmark from Python (a notebook, a script). Options are the
    command-line ones with underscores: ``limit=10``, ``tasks="rag,code"``,
    ``source="spec-bench"``, ``max_new_tokens=128``, ``model=...``, ``out=...``.
    Writes the same files as ``python -m pld bench`` and returns the content
    of ``summary.json`` plus ``"out"``, the folder."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    unknown = sorted(set(options) - set(vars(args)))
    if unknown:
        raise TypeError(f"speedup_tables: unknown options {unknown}; known: {sorted(vars(args))}")
    vars(args).update(_parsed(parser, options))
    run(args)
    with open(os.path.join(args.out, "summary.json"), encoding="utf-8") as fh:
        summary = json.load(fh)
    summary["out"] = os.path.abspath(args.out)
    return summary


def _parsed(parser: argparse.ArgumentParser, options: Dict[str, Any]) -> Dict[str, Any]:
    """``options`` as the command line would take them: each through its
    option's type and choices (None stays None), a ValueError naming the
    option where one is refused."""
    actions = {a.dest: a for a in parser._actions}
    parsed = {}
    for name, value in options.items():
        action = actions[name]
        if value is not None and action.type is not None:
            try:
                value = action.type(value if isinstance(value, str) else str(value))
            except (argparse.ArgumentTypeError, TypeError, ValueError) as error:
                raise ValueError(f"speedup_tables: {name}: {error}") from None
        if value is not None and action.choices is not None and value not in action.choices:
            raise ValueError(f"speedup_tables: {name}: expected one of {list(action.choices)}, got {value!r}")
        parsed[name] = value
    return parsed


def _key(row: Dict[str, Any]) -> Tuple[str, int, str]:
    return row["id"], row["turn"], row["method"]


def measure(generate: Any, ids: Any, tokenizer: Any, meter: "ForwardMeter") -> Dict[str, Any]:
    """Run one generation; wall time, forward passes and the output."""
    seq, seconds = timed(generate, ids, meter)
    new = seq[0, ids.shape[1]:].tolist()
    return {"prompt_tokens": int(ids.shape[1]), "new_tokens": len(new), "seconds": seconds,
            "tokens_per_second": len(new) / seconds if seconds > 0 else 0.0,
            "forward_calls": meter.calls, "forward_seconds": meter.seconds,
            "output_sha1": hashlib.sha1(json.dumps(new).encode()).hexdigest(),
            "text": tokenizer.decode(new, skip_special_tokens=True)}


def timed(generate: Any, ids: Any, meter: "ForwardMeter") -> Tuple[Any, float]:
    """(output, wall seconds) of ``generate(ids)``, the meter reset first
    and the device synchronised at both ends (a GPU's queued work counts)."""
    meter.sync()
    meter.reset()
    start = time.perf_counter()
    seq = generate(ids)
    meter.sync()
    return seq, time.perf_counter() - start


def chat_input_ids(tokenizer: Any, user_turns: List[str], answers: List[str]) -> Any:
    """[1, L] ids of a chat: user turns with the given assistant answers
    between them, ready for the next assistant turn."""
    from pld.models import chat_template_ids

    messages: List[Dict[str, str]] = []
    for j, user in enumerate(user_turns):
        messages.append({"role": "user", "content": user})
        if j < len(user_turns) - 1:
            messages.append({"role": "assistant", "content": answers[j]})
    ids = chat_template_ids(tokenizer, messages)
    if ids is not None:
        return ids
    text = "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages) + "\n\nAssistant:"
    return tokenizer(text, return_tensors="pt").input_ids


class ForwardMeter:
    """Counts the model's forward passes and the time spent inside them,
    through module hooks (the same for every method). The forwards of a
    token tree's one-time cost calibration (pld.forward_cost) are not
    counted; their time is in the generation's wall time. On a GPU
    (``device``) every clock read waits for the device first: :meth:`sync`."""

    def __init__(self, model: Any, device: Any = "cpu") -> None:
        from pld import forward_cost

        self._wait = forward_cost.waiter(device)
        self.calls = 0
        self.seconds = 0.0
        self._t0: Optional[float] = None
        self._handles = [model.register_forward_pre_hook(self._before),
                         model.register_forward_hook(self._after)]

    def reset(self) -> None:
        self.calls, self.seconds = 0, 0.0

    def sync(self) -> None:
        """Wait for the work queued on the device (nothing on the CPU)."""
        self._wait()

    def _before(self, module: Any, inputs: Any) -> None:
        self.sync()
        self._t0 = time.perf_counter()

    def _after(self, module: Any, inputs: Any, output: Any) -> None:
        from pld import forward_cost

        self.sync()
        if forward_cost.calibrating():  # measuring c(w) once per model: not a decoding step
            self._t0 = None
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self.calls += 1
            self._t0 = None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _progress(total: int, disable: bool) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the bench extras
        class _Quiet:
            def update(self, n: int = 1) -> None: ...
            def close(self) -> None: ...
        return _Quiet()
    return tqdm(total=total, desc="generations", unit="gen", disable=disable)
