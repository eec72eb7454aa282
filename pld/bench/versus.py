"""This build of pld against another (a previous commit), side by side.

    git worktree add /tmp/pld_prev HEAD~1
    (cd /tmp/pld_prev && python setup.py build_ext --inplace)
    python -m pld bench versus --baseline /tmp/pld_prev --limit 5 --max-new-tokens 64

For the claim "not slower than the previous build". Each build runs in its
own worker process (pld/bench/versus_worker.py of this tree, run with
PYTHONPATH=<build root>, so ``import pld`` there is that build's; each
worker reports its pld.__file__ and a worker that imported the other build
stops the run; --current DIR compares another build in place of this
tree). Both load the embedded model once and warm every method up
on the first prompt (not measured). Then for every prompt (or batch of
--batch-size prompts, left-padded; batched methods are ``pld.generate`` on
the batch) and every method, the two builds run one after the other, the
build going first alternating per prompt.

Per method the table gives tokens/s of each build (pooled: all new tokens
over all seconds), the pooled ratio current/baseline and the median
(min-max) of the per-run ratios, tokens per forward pass of each build
(forwards counted by hooks on the model) and how many prompts gave
identical tokens on both builds (greedy: all must). The forwards of a
forward-cost calibration (pld.forward_cost, one-time per model and context
size, so it lands in whichever run first meets a context size) count
neither as forwards nor in the seconds; a column says how many runs had
one. Chat's second turn sees this build's answer to the
first (batches: first turns only). Writes OUT/versus_table.md and a row per
run to OUT/versus_results.jsonl.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import tasks as task_sources
from .options import at_least, threads

#: the two builds, in the table's order
BUILDS = ("current", "baseline")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "versus_worker.py")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The subcommand's options (see the module's docstring)."""
    p.add_argument("--baseline", required=True, metavar="DIR",
                   help="a checkout of pld with its extension built in place (DIR/pld/_core*.so)")
    p.add_argument("--current", default=None, metavar="DIR",
                   help="the build compared with the baseline (default: the tree this pld is imported from)")
    p.add_argument("--source", choices=("builtin", "spec-bench"), default="builtin",
                   help="where prompts come from (default: builtin, offline)")
    p.add_argument("--data", default="", help="the spec-bench question.jsonl (default: found as "
                   "`python -m pld bench generation` finds it)")
    p.add_argument("--tasks", default="all", help=f"'all' or some of {','.join(task_sources.TASKS)}")
    p.add_argument("--limit", type=int, default=10, help="prompts per task (default 10)")
    p.add_argument("--skip", type=int, default=0, help="prompts per task to pass over first (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-pred-tokens", type=int, default=10, help="draft length k (default 10)")
    p.add_argument("--max-ngram", type=int, default=3, help="largest n-gram matched (default 3)")
    p.add_argument("--threads", type=threads, default=0, help="torch CPU threads in each worker (0: torch's default)")
    p.add_argument("--methods", default="pld,pld_tree",
                   help="comma-separated names from pld.bench.methods (default pld,pld_tree); "
                        "with --batch-size > 1: pld, pld_tree (pld.generate on the batch)")
    p.add_argument("--batch-size", type=at_least(1), default=1, help="prompts a generation (default 1)")
    p.add_argument("--count-calibration", action="store_true",
                   help="count the forward-cost calibrations' time too (what a user pays; default: left out)")
    p.add_argument("--out", default=os.path.join("bench-out", "versus"))
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_root(path: str, option: str = "--baseline") -> str:
    """The real path of a pld checkout whose extension is built in place; a
    SystemExit naming ``option`` and saying how to build it otherwise."""
    root = os.path.realpath(path)
    if not os.path.isfile(os.path.join(root, "pld", "__init__.py")):
        raise SystemExit(f"python -m pld bench versus: {option} {path}: no pld/__init__.py there")
    if not any(glob.glob(os.path.join(root, "pld", "_core*" + ext)) for ext in (".so", ".pyd")):
        raise SystemExit(f"python -m pld bench versus: {option} {path}: the extension is not built "
                         f"there; run `cd {root} && {sys.executable} setup.py build_ext --inplace`")
    return root


def current_root() -> str:
    """The folder holding the pld this process imported."""
    import pld

    return os.path.dirname(os.path.dirname(os.path.realpath(pld.__file__)))


def git_commit(root: str) -> str:
    """``abc1234``, ``abc1234 (dirty)`` when files under pld/ or csrc/ (what
    makes the build) differ from the commit or are untracked, or ``?``
    outside a git checkout."""
    def git(*argv: str) -> Optional[str]:
        try:
            proc = subprocess.run(["git", "-C", root, *argv], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "?"
    return commit + (" (dirty)" if git("status", "--porcelain", "--", "pld", "csrc") else "")


class Build:
    """One build's worker process (this tree's versus_worker.py with
    ``PYTHONPATH=root``). :meth:`call` sends a command and returns the
    reply; a worker that fails or dies raises RuntimeError with its error."""

    def __init__(self, name: str, root: str, quiet: bool = False) -> None:
        self.name, self.root = name, root
        self.info: Dict[str, Any] = {}
        paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONSAFEPATH="1")
        if quiet:
            env.update(HF_HUB_DISABLE_PROGRESS_BARS="1", TQDM_DISABLE="1")  # the model's loading bars
        self.proc = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def send(self, msg: Dict[str, Any]) -> None:
        """Write one command line; the reply is read by :meth:`receive`."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> Dict[str, Any]:
        """The next reply, without its "ok"; RuntimeError on a failure
        reply (with the worker's traceback) or a worker gone."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker ({self.root}) exited with status "
                               f"{self.proc.wait()} (its stderr is above)")
        reply = json.loads(line)
        if not reply.pop("ok", False):
            raise RuntimeError(f"the {self.name} worker ({self.root}) failed:\n{reply.get('error')}")
        return reply

    def call(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """:meth:`send` then :meth:`receive`."""
        self.send(msg)
        return self.receive()

    def close(self) -> None:
        """Ask the worker to quit; kill it if it has not within 30 s."""
        try:
            self.send({"cmd": "quit"})
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def start(roots: Dict[str, str], init: Dict[str, Any], quiet: bool = False) -> List[Build]:
    """Both workers, loaded (in parallel) and checked: each imported pld
    from its own root, else SystemExit naming what it imported. ``quiet``:
    no progress bars from the model's loading."""
    builds = [Build(name, roots[name], quiet) for name in BUILDS]
    try:
        for b in builds:
            b.info = b.call({"cmd": "hello"})
            if not b.info["pld_file"].startswith(os.path.join(b.root, "pld") + os.sep):
                raise SystemExit(f"python -m pld bench versus: the {b.name} worker imported pld from "
                                 f"{b.info['pld_file']}, not from {b.root}")
        for b in builds:
            b.send(dict(init, cmd="init"))
        for b in builds:
            b.info.update(b.receive())
    except BaseException:
        for b in builds:
            b.close()
        raise
    return builds


def left_padded(rows: List[List[int]], pad: int) -> Tuple[List[List[int]], List[List[int]]]:
    """(ids, attention mask) of ``rows`` left-padded with ``pad`` to the
    longest (the pad rule of pld.bench.batch)."""
    width = max(map(len, rows))
    ids = [[pad] * (width - len(r)) + list(r) for r in rows]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    return ids, mask


def single_units(prompts: List[Any], encoder: Build) -> Iterator[Dict[str, Any]]:
    """One unit per prompt and turn: {key, task, turn, prompts, ids [1, L],
    mask None}. A chat's turn 2 sees ``unit["answer"]`` of turn 1 (token
    ids), which the caller sets before asking for the next unit."""
    for p in prompts:
        answers: List[List[int]] = []
        for turn in range(1, len(p.turns) + 1):
            ids = encoder.call({"cmd": "encode", "turns": list(p.turns[:turn]), "answers": answers})["ids"]
            unit = {"key": f"{p.id}#{turn}", "task": p.task, "turn": turn, "prompts": [p.id],
                    "ids": [ids], "mask": None}
            yield unit
            answers.append(unit["answer"])


def batch_units(prompts: List[Any], encoder: Build, size: int, pad: int) -> Iterator[Dict[str, Any]]:
    """The first turns of each task's prompts in batches of ``size`` (in
    order; the last may be smaller), left-padded: {key, task, turn,
    prompts, ids [B, L], mask [B, L]}."""
    by_task: Dict[str, List[Any]] = {}
    for p in prompts:
        by_task.setdefault(p.task, []).append(p)
    for task, group in by_task.items():
        for start_at in range(0, len(group), size):
            chunk = group[start_at:start_at + size]
            rows = [encoder.call({"cmd": "encode", "turns": list(p.turns[:1]), "answers": []})["ids"]
                    for p in chunk]
            ids, mask = left_padded(rows, pad)
            yield {"key": f"{task}/batch{start_at // size}", "task": task, "turn": 1,
                   "prompts": [p.id for p in chunk], "ids": ids, "mask": mask}


def compare(unit: Dict[str, Any], index: int, methods: List[str], builds: List[Build],
            log: Any) -> List[Dict[str, Any]]:
    """Every method on both builds for one unit, the build going first
    alternating with ``index``; a row per run, also appended to ``log``.
    Sets ``unit["answer"]``: the current build's first-method tokens (row 0)."""
    order = builds if index % 2 == 0 else builds[::-1]
    rows = []
    for m in methods:
        for b in order:
            reply = b.call({"cmd": "generate", "method": m, "ids": unit["ids"], "mask": unit["mask"]})
            row = {"unit": unit["key"], "task": unit["task"], "turn": unit["turn"], "prompts": unit["prompts"],
                   "prompt_tokens": len(unit["ids"][0]), "method": m, "build": b.name,
                   "first": b is order[0], **reply}
            log.write(json.dumps(row) + "\n")
            rows.append(row)
    log.flush()
    unit["answer"] = next(r["tokens"][0] for r in rows if r["build"] == "current")
    return rows


def summarize(rows: List[Dict[str, Any]], methods: List[str],
              count_calibration: bool = False) -> List[Dict[str, Any]]:
    """Per method, over the units both builds ran: runs, prompts (rows),
    pooled tokens/s of each build and their ratio (current over baseline),
    the median, min and max of the per-unit ratios, tokens per forward a row
    of each build, and prompts whose tokens are identical on both. The
    seconds leave forward-cost calibrations out unless ``count_calibration``
    (what a user pays)."""
    def _seconds(row: Dict[str, Any]) -> float:
        return row["seconds"] - (0.0 if count_calibration else row.get("calibration_seconds", 0.0))

    def _rate(row: Dict[str, Any]) -> float:
        return row["new_tokens"] / max(1e-12, _seconds(row))

    out = []
    for m in methods:
        pairs: Dict[str, Dict[str, Dict[str, Any]]] = {}
        for r in rows:
            if r["method"] == m:
                pairs.setdefault(r["unit"], {})[r["build"]] = r
        both = [p for p in pairs.values() if all(b in p for b in BUILDS)]
        if not both:
            continue
        side = {b: [p[b] for p in both] for b in BUILDS}
        rate = {b: sum(r["new_tokens"] for r in side[b]) / max(1e-12, sum(map(_seconds, side[b])))
                for b in BUILDS}
        ratios = [_rate(p["current"]) / max(1e-12, _rate(p["baseline"])) for p in both]
        out.append({
            "method": m, "runs": len(both), "prompts": sum(len(p["current"]["tokens"]) for p in both),
            "tokens_per_second": rate, "pooled_ratio": rate["current"] / max(1e-12, rate["baseline"]),
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "tokens_per_forward": {b: sum(r["new_tokens"] for r in side[b])
                                   / max(1, sum(r["forward_calls"] * len(r["tokens"]) for r in side[b]))
                                   for b in BUILDS},
            "calibrated": {b: sum(1 for r in side[b] if r.get("calibration_forwards")) for b in BUILDS},
            "identical": sum(a == c for p in both
                             for a, c in zip(p["current"]["tokens"], p["baseline"]["tokens"]))})
    return out


def markdown(summary: List[Dict[str, Any]]) -> str:
    """The table: a line per method."""
    lines = ["| method | runs | tokens/s current | tokens/s baseline | current / baseline (pooled) "
             "| per-run ratio: median (min-max) | tokens/forward current | tokens/forward baseline "
             "| identical outputs | runs calibrating (current/baseline) |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for s in summary:
        tps, tpf, cal = s["tokens_per_second"], s["tokens_per_forward"], s["calibrated"]
        lines.append(f"| {s['method']} | {s['runs']} | {tps['current']:.2f} | {tps['baseline']:.2f} | "
                     f"{s['pooled_ratio']:.3f}x | {s['median_ratio']:.3f}x ({s['min_ratio']:.2f}-"
                     f"{s['max_ratio']:.2f}) | {tpf['current']:.2f} | {tpf['baseline']:.2f} | "
                     f"{s['identical']}/{s['prompts']} | {cal['current']}/{cal['baseline']} |")
    return "\n".join(lines)


def caption(builds: List[Build], args: argparse.Namespace, tasks: List[str]) -> str:
    """Machine, versions, each build (root, commit, dirty mark) and the settings."""
    from pld.models import EMBEDDED_NAME

    from .lookup import machine_info

    m, v = machine_info(), builds[0].info
    lines = [f"machine: {m['cpu']}, {m['cores']} cores; torch threads "
             + ", ".join(f"{b.name} {b.info['torch_threads']}" for b in builds),
             f"versions: Python {v['python']}, torch {v['torch']}, transformers {v['transformers']}"]
    for b in builds:
        lines.append(f"{b.name}: {b.root} @ {git_commit(b.root)} (pld {b.info['pld_version']}, "
                     f"{b.info['pld_file']})")
    lines.append(f"settings: {args.source} prompts, tasks {','.join(tasks)}, {args.limit} a task"
                 + (f" after {args.skip}" if args.skip else "") + f", <= {args.max_new_tokens} new tokens, "
                 f"k={args.num_pred_tokens}, max n-gram {args.max_ngram}, batch size {args.batch_size}; "
                 f"{EMBEDDED_NAME}, greedy; the build going first alternates per run; tokens/s over "
                 + ("wall time, forward-cost calibrations included" if getattr(args, "count_calibration", False)
                    else "wall time less the forwards of forward-cost calibrations")
                 + " (one-time per model and context size; the last column counts the runs that had one)")
    return "\n".join(lines)


def _prompts(args: argparse.Namespace) -> Tuple[List[str], List[Any]]:
    """(tasks, prompts) from the options, through pld.bench.tasks."""
    tasks = task_sources.parse_tasks(args.tasks, args.source)
    data = args.data or (task_sources.default_spec_bench() if args.source == "spec-bench" else "")
    prompts = task_sources.load(args.source, tasks, args.limit, data, skip=args.skip)
    if not prompts:
        raise ValueError(f"no prompts for tasks {tasks} from {args.source}")
    return tasks, prompts


def _measure(builds: List[Build], args: argparse.Namespace, prompts: List[Any], methods: List[str],
             log: Any) -> List[Dict[str, Any]]:
    """Warm both builds up on the first unit (one after the other), then
    compare every unit; the rows of all runs."""
    from .generation import _progress

    B = args.batch_size
    if B > 1:
        units = batch_units(prompts, builds[0], B, int(builds[0].info["pad_token_id"]))
        count = sum(-(-n // B) for n in _task_sizes(prompts).values())
    else:
        units, count = single_units(prompts, builds[0]), sum(len(p.turns) for p in prompts)
    bar = _progress(count * len(methods) * len(builds), disable=args.no_progress)
    rows: List[Dict[str, Any]] = []
    for i, unit in enumerate(units):
        if i == 0:
            for b in builds:
                b.call({"cmd": "warmup", "ids": unit["ids"], "mask": unit["mask"]})
        rows += compare(unit, i, methods, builds, log)
        bar.update(len(methods) * len(builds))
    bar.close()
    return rows


def _task_sizes(prompts: List[Any]) -> Dict[str, int]:
    """task -> number of prompts."""
    sizes: Dict[str, int] = {}
    for p in prompts:
        sizes[p.task] = sizes.get(p.task, 0) + 1
    return sizes


def run(args: argparse.Namespace) -> int:
    """The comparison; prints and writes the table. ValueError on bad
    options; SystemExit for a baseline that is not built, or a worker that
    fails."""
    methods = list(dict.fromkeys(m.strip() for m in args.methods.split(",") if m.strip()))
    if not methods:
        raise ValueError("--methods names no method")
    roots = {"current": build_root(args.current, "--current") if args.current else current_root(),
             "baseline": build_root(args.baseline)}
    tasks, prompts = _prompts(args)
    init = {"threads": args.threads, "max_new_tokens": args.max_new_tokens, "methods": methods,
            "num_pred_tokens": args.num_pred_tokens, "max_ngram": args.max_ngram, "batch_size": args.batch_size}
    os.makedirs(args.out, exist_ok=True)
    try:
        builds = start(roots, init, quiet=args.no_progress)
        try:
            with open(os.path.join(args.out, "versus_results.jsonl"), "w", encoding="utf-8") as log:
                rows = _measure(builds, args, prompts, methods, log)
        finally:
            for b in builds:
                b.close()
    except RuntimeError as e:
        raise SystemExit(f"python -m pld bench versus: {e}") from None
    summary = summarize(rows, methods, count_calibration=args.count_calibration)
    text = f"{markdown(summary)}\n\n{caption(builds, args, tasks)}\n"
    differ = sum(s["prompts"] - s["identical"] for s in summary)
    if differ:
        text += f"\nWARNING: {differ} outputs differ between the builds (greedy: they must not)\n"
    with open(os.path.join(args.out, "versus_table.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return 0
