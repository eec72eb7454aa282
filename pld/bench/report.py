"""Aggregate benchmark rows into the speedup tables and plots.

Input: the rows of ``results.jsonl`` (one per prompt, turn and method).
Output in the run's folder: ``table.md`` (printed too), ``summary.csv``,
``summary.json`` and three PNG plots in the style of the method's figures:
``speedup_by_task.png`` (bars with std error bars per task),
``chat_categories.png`` (per chat category) and ``chat_turns.png`` (turn 1
vs turn 2). Speedup is per prompt: a method's tokens/s over greedy's on the
same prompt and turn; tables give its mean and standard deviation. When
the run has ``greedy_onednn`` (plain greedy on the linear kernel pld's loop
uses), a column gives each method's speed over it too: prompt lookup's own
share, apart from the kernel's.
"""
from __future__ import annotations

import csv
import json
import os
import platform
import statistics
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Sequence, Tuple

from .jsonl import read_jsonl

TASK_ORDER = ("summarization", "rag", "long", "chat", "code", "translation")
SAME_KERNEL_GREEDY = "greedy_onednn"


@dataclass
class Summary:
    group: str          # task label, e.g. "rag" or "chat (turn 2)", or a chat category
    method: str
    prompts: int
    new_tokens: float   # mean per prompt
    tokens_per_second: float      # mean per prompt
    tokens_per_second_std: float
    speedup: float      # mean per prompt, over greedy
    speedup_std: float
    vs_transformers: float  # mean per-prompt ratio to transformers' prompt lookup (nan if absent)
    vs_same_kernel: float   # mean per-prompt ratio to greedy on pld's kernel, greedy_onednn (nan if absent)
    identical: int      # outputs equal to greedy's
    tokens_per_forward: float
    forward_share: float
    speedup_min: float = float("nan")     # the slowest prompt's speedup
    speedup_median: float = float("nan")
    first_speedup: float = float("nan")   # mean over the method's first calls at a context size class
    first_prompts: int = 0


def read_rows(path: str) -> List[Dict[str, Any]]:
    """The rows of a results file to resume from ([] if there is none): a
    ValueError naming it and the line if it cannot be read (a run cut off
    mid-line: pass --fresh)."""
    if not os.path.lexists(path):
        return []
    try:
        return [row for _, row in read_jsonl(path, "results")]
    except ValueError as error:
        raise ValueError(f"{error}; pass --fresh to start the results anew") from None


def _label(row: Dict[str, Any]) -> str:
    return f"{row['task']} (turn {row['turn']})" if row["task"] == "chat" else row["task"]


def _order(label: str) -> Tuple[int, str]:
    base = label.split(" (")[0]
    return (TASK_ORDER.index(base) if base in TASK_ORDER else len(TASK_ORDER), label)


def summarize(rows: Iterable[Dict[str, Any]], methods: Sequence[str], key=_label) -> List[Summary]:
    """One :class:`Summary` per (group, method); groups from ``key(row)``.
    Only prompts with a greedy row count, so every speedup has its reference."""
    items: Dict[Tuple[str, int], Dict[str, Dict[str, Any]]] = {}
    for r in rows:
        items.setdefault((r["id"], r["turn"]), {})[r["method"]] = r
    groups: Dict[str, List[Dict[str, Dict[str, Any]]]] = {}
    for by_method in items.values():
        if "greedy" in by_method:
            groups.setdefault(key(by_method["greedy"]), []).append(by_method)
    out = []
    for group in sorted(groups, key=_order):
        for m in methods:
            have = [v for v in groups[group] if m in v]
            if not have:
                continue
            tps = [v[m]["tokens_per_second"] for v in have]
            speed = [v[m]["tokens_per_second"] / v["greedy"]["tokens_per_second"] for v in have]
            first = [x for x, v in zip(speed, have) if v[m].get("first_at_size")]
            vs_tr = _ratios(have, m, "transformers")
            vs_kernel = _ratios(have, m, SAME_KERNEL_GREEDY)
            out.append(Summary(
                group=group, method=m, prompts=len(have),
                new_tokens=statistics.mean(v[m]["new_tokens"] for v in have),
                tokens_per_second=statistics.mean(tps), tokens_per_second_std=_std(tps),
                speedup=statistics.mean(speed), speedup_std=_std(speed),
                vs_transformers=statistics.mean(vs_tr) if vs_tr else float("nan"),
                vs_same_kernel=statistics.mean(vs_kernel) if vs_kernel else float("nan"),
                identical=sum(v[m]["output_sha1"] == v["greedy"]["output_sha1"] for v in have),
                tokens_per_forward=statistics.mean(v[m]["new_tokens"] / max(1, v[m]["forward_calls"])
                                                   for v in have),
                forward_share=statistics.mean(v[m]["forward_seconds"] / v[m]["seconds"]
                                              for v in have if v[m]["seconds"] > 0),
                speedup_min=min(speed), speedup_median=statistics.median(speed),
                first_speedup=statistics.mean(first) if first else float("nan"), first_prompts=len(first)))
    return out


def _ratios(have: Sequence[Dict[str, Dict[str, Any]]], method: str, reference: str) -> List[float]:
    """Per prompt: ``method``'s tokens/s over ``reference``'s, where both ran."""
    return [v[method]["tokens_per_second"] / v[reference]["tokens_per_second"]
            for v in have if reference in v]


def _std(xs: Sequence[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def markdown(summaries: Sequence[Summary]) -> str:
    kernel = any(s.vs_same_kernel == s.vs_same_kernel for s in summaries)
    lines = ["| task | method | prompts | new tokens | tokens/s | speedup vs greedy | per prompt: min / median "
             "| first calls at a size | vs transformers PL "
             + ("| vs greedy on oneDNN " if kernel else "")
             + "| identical to greedy | tokens/forward | forward share |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|" + ("--:|" if kernel else "") + "--:|--:|--:|"]
    for s in summaries:
        first = f"{s.first_speedup:.2f}x ({s.first_prompts})" if s.first_prompts else ""
        lines.append(f"| {s.group} | {s.method} | {s.prompts} | {s.new_tokens:.0f} | "
                     f"{s.tokens_per_second:.2f} ± {s.tokens_per_second_std:.2f} | "
                     f"{s.speedup:.2f}x ± {s.speedup_std:.2f} | {s.speedup_min:.2f}x / {s.speedup_median:.2f}x | "
                     f"{first} | {_times(s.vs_transformers)} | "
                     + (f"{_times(s.vs_same_kernel)} | " if kernel else "")
                     + f"{s.identical}/{s.prompts} | {s.tokens_per_forward:.2f} | "
                     f"{100 * s.forward_share:.0f}% |")
    return "\n".join(lines)


def _times(ratio: float) -> str:
    return "" if ratio != ratio else f"{ratio:.2f}x"


def caption(config: Dict[str, Any], torch: Any, model: Any) -> str:
    """Machine, model, dtype and versions, for tables and plots."""
    import transformers

    import pld

    device = config["device"]
    if device.startswith("cuda"):
        machine = torch.cuda.get_device_name(torch.device(device))
    else:
        machine = f"{_cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    cut = f" cut to {config['prompt_chars']} characters a turn" if config.get("prompt_chars") else ""
    return (f"{config['model']}, {config['dtype']}, {device} ({machine}); greedy, k={config['num_pred_tokens']}, "
            f"max n-gram {config['max_ngram']}, <= {config['max_new_tokens']} new tokens; "
            f"{config['source']} prompts{cut}; torch {torch.__version__}, transformers {transformers.__version__}, "
            f"pld {pld.__version__}, Python {platform.python_version()}")


def _cpu_name() -> str:
    """The processor's model name and its widest vector units, e.g. "AMD
    EPYC (AVX-512, bf16)": a CPU's matrix products, and so what a wider
    forward costs, depend on them."""
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name") and not name:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith(("flags", "Features")) and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    units = vector_units(flags)
    return (name or platform.processor() or platform.machine()) + (f" ({units})" if units else "")


def vector_units(flags: Iterable[str]) -> str:
    """The widest vector and matrix units among /proc/cpuinfo ``flags``:
    "AMX, AVX-512, bf16", "AVX-512", "AVX2", "NEON"/"SVE" on Arm, or ""."""
    flags = set(flags)
    out = []
    if "amx_tile" in flags:
        out.append("AMX")
    if "avx512f" in flags:
        out.append("AVX-512")
    elif "avx2" in flags:
        out.append("AVX2")
    if "sve" in flags:
        out.append("SVE")
    elif "asimd" in flags:
        out.append("NEON")
    if "avx512_bf16" in flags or "amx_bf16" in flags or "bf16" in flags:
        out.append("bf16")
    return ", ".join(out)


def save(out: str, text: str, results: Dict[str, Any]) -> None:
    """Print ``text`` (a table and its caption) and write it to
    OUT/table.md, and ``results`` to OUT/results.json."""
    print("\n" + text)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)


def write(rows: Sequence[Dict[str, Any]], methods: Sequence[str], out: str, caption_text: str) -> str:
    """Write table.md, summary.csv, summary.json and the plots; return the
    markdown (table and caption)."""
    by_task = summarize(rows, methods)
    chat = [r for r in rows if r["task"] == "chat"]
    by_category = summarize(chat, methods, key=lambda r: r["category"])
    by_turn = summarize(chat, methods, key=lambda r: f"turn {r['turn']}")
    text = f"{markdown(by_task)}\n\n{caption_text}\n"
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    with open(os.path.join(out, "summary.csv"), "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(asdict(by_task[0]))) if by_task else None
        if writer:
            writer.writeheader()
            writer.writerows(asdict(s) for s in by_task)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump({"caption": caption_text, "by_task": [asdict(s) for s in by_task],
                   "chat_by_category": [asdict(s) for s in by_category],
                   "chat_by_turn": [asdict(s) for s in by_turn]}, fh, indent=1)
    plot(by_task, os.path.join(out, "speedup_by_task.png"), "Speedup over greedy per task", caption_text)
    if by_category:
        plot(by_category, os.path.join(out, "chat_categories.png"), "Chat: speedup per category",
             caption_text)
        plot(by_turn, os.path.join(out, "chat_turns.png"), "Chat: turn 1 vs turn 2", caption_text)
    return text


def plot(summaries: Sequence[Summary], path: str, title: str, caption_text: str) -> None:
    """Grouped bars: groups on the x axis, one bar per method other than
    greedy, std error bars, a line at 1x (greedy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(OrderedDict.fromkeys(s.group for s in summaries))
    methods = [m for m in OrderedDict.fromkeys(s.method for s in summaries) if m != "greedy"]
    if not groups or not methods:
        return
    cell = {(s.group, s.method): s for s in summaries}
    width = 0.8 / len(methods)
    top = 0.0
    width_inches = min(16.0, 3.0 + len(groups) * max(1.0, 0.3 * len(methods)))
    fig, ax = plt.subplots(figsize=(width_inches, 4.8))
    for j, m in enumerate(methods):
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))]
        vals = [cell[(g, m)].speedup if (g, m) in cell else 0.0 for g in groups]
        errs = [cell[(g, m)].speedup_std if (g, m) in cell else 0.0 for g in groups]
        ax.bar(xs, vals, width, yerr=errs, capsize=3, label=m)
        top = max([top] + [v + e for v, e in zip(vals, errs)])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="greedy")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20 if len(groups) > 5 else 0, ha="right" if len(groups) > 5 else "center")
    ax.set_ylim(0, 1.3 * max(top, 1.0))  # headroom for the legend above the bars
    ax.set_ylabel("speedup over greedy (tokens/s)")
    ax.set_title(title)
    ax.legend(fontsize="small", ncol=min(4, len(methods) + 1))
    caption_lines = _wrap(caption_text, int(width_inches * 16))
    fig.text(0.01, 0.01, caption_lines, fontsize=6.5, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.03 + 0.025 * caption_lines.count("\n"), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))
