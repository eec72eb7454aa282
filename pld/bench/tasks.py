"""Benchmark prompts: what a task is, and the sources that supply them.

A :class:`Prompt` has one or two user turns. Tasks follow the method's
experiments (summarization, context QA, multi-turn chat) plus code editing,
where output copies most from input, and translation, a control where it
copies least. Three sources:

* ``builtin`` -- made on the spot from text and code on every machine
  (Python's own documentation topics and standard-library source); no data
  and no network needed. See :mod:`pld.bench.builtin_tasks`.
* ``spec-bench`` -- a Spec-Bench ``question.jsonl`` by path.
* ``hub`` -- CNN/DailyMail, HAGRID and MT-Bench from the Hugging Face Hub
  (online only). See :mod:`pld.bench.hub_tasks`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Iterable, List, Sequence, Tuple

#: task name -> what it measures
TASKS: Dict[str, str] = {
    "summarization": "summarize a document (high input overlap)",
    "rag": "answer a question from given passages (context QA / RAG)",
    "chat": "two-turn chat; turn 2 sees the model's turn-1 answer",
    "code": "edit a given function and output it whole (highest overlap)",
    "translation": "translate a paragraph (low-overlap control)",
}

SOURCES = ("builtin", "spec-bench", "hub")

#: Spec-Bench category -> task (its eight MT-Bench categories are the chat set)
SPEC_BENCH_TASKS: Dict[str, str] = {
    "summarization": "summarization",
    "rag": "rag",
    "translation": "translation",
    **{c: "chat" for c in ("writing", "roleplay", "reasoning", "math", "coding",
                           "extraction", "stem", "humanities")},
}


@dataclass(frozen=True)
class Prompt:
    """One benchmark item. ``turns`` are the user messages: one, or two for
    chat (the model's answer to turn 1 goes between them). ``category`` is a
    finer label inside the task (an MT-Bench category, a kind of edit)."""

    id: str
    task: str
    category: str
    turns: Tuple[str, ...]
    source: str


def parse_tasks(spec: str) -> List[str]:
    """``"all"`` or a comma-separated list of task names; unknown names raise."""
    names = list(TASKS) if spec.strip() == "all" else [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ValueError(f"tasks: unknown {unknown or spec!r}; expected 'all' or some of {list(TASKS)}")
    return names


def balanced(prompts: Iterable[Prompt], tasks: Sequence[str], limit: int) -> List[Prompt]:
    """Up to ``limit`` prompts per task, taken round-robin over the task's
    categories (in order of first appearance) so every category is covered;
    the result is grouped by task in the order of ``tasks``."""
    if limit <= 0:
        raise ValueError(f"limit: expected a positive number of prompts per task, got {limit}")
    by_task: Dict[str, Dict[str, List[Prompt]]] = {t: {} for t in tasks}
    for p in prompts:
        if p.task in by_task:
            by_task[p.task].setdefault(p.category, []).append(p)
    out: List[Prompt] = []
    for t in tasks:
        queues = [list(q) for q in by_task[t].values()]
        taken = 0
        while taken < limit and any(queues):
            for q in queues:
                if q and taken < limit:
                    out.append(q.pop(0))
                    taken += 1
    return out


def spec_bench(path: str, tasks: Sequence[str]) -> List[Prompt]:
    """Prompts from a Spec-Bench ``question.jsonl`` (question_id, category,
    turns); categories map to tasks by :data:`SPEC_BENCH_TASKS`."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            q = json.loads(line)
            task = SPEC_BENCH_TASKS.get(q["category"])
            if task not in tasks:
                continue
            turns = tuple(q["turns"][:2] if task == "chat" else q["turns"][:1])
            out.append(Prompt(id=f"spec-bench/{q['question_id']}", task=task,
                              category=q["category"], turns=turns, source="spec-bench"))
    return out


def load(source: str, tasks: Sequence[str], limit: int, data: str = "") -> List[Prompt]:
    """``limit`` prompts per task from ``source`` (see :data:`SOURCES`)."""
    if source == "builtin":
        from . import builtin_tasks

        found = builtin_tasks.prompts(tasks, limit)
    elif source == "spec-bench":
        if not data:
            raise ValueError("data: the spec-bench source needs --data PATH to a question.jsonl")
        found = spec_bench(data, tasks)
    elif source == "hub":
        from . import hub_tasks

        found = hub_tasks.prompts(tasks, limit)
    else:
        raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")
    return balanced(found, tasks, limit)
