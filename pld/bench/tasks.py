"""Benchmark prompts: what a task is, and the sources that supply them.

A :class:`Prompt` has one or two user turns. Tasks follow the method's
experiments (summarization, context QA, multi-turn chat) plus code editing,
where output copies most from input, and translation, a control where it
copies least. Three sources:

* ``builtin`` -- made on the spot from text and code on every machine
  (Python's own documentation topics and standard-library source); no data
  and no network needed. See :mod:`pld.bench.builtin_tasks`.
* ``spec-bench`` -- a Spec-Bench ``question.jsonl`` (and, for the task
  ``long``, its summarization articles joined into 1k-4k-token prompts): ``--data PATH``, else
  ``$PLD_SPEC_BENCH``, else ``shared/data/spec_bench/question.jsonl`` in the
  working directory or one of its parents (see :func:`default_spec_bench`).
* ``hub`` -- CNN/DailyMail, HAGRID and MT-Bench from the Hugging Face Hub
  (online only). See :mod:`pld.bench.hub_tasks`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .jsonl import read_jsonl

#: task name -> what it measures
TASKS: Dict[str, str] = {
    "summarization": "summarize a document (high input overlap)",
    "rag": "answer a question from given passages (context QA / RAG)",
    "chat": "two-turn chat; turn 2 sees the model's turn-1 answer",
    "code": "edit a given function and output it whole (highest overlap)",
    "translation": "translate a paragraph (low-overlap control)",
    "long": "summarize documents joined into a prompt of about 1k, 2k or 4k tokens",
}

#: the long task's sizes: category -> characters of joined documents (about 4 a token)
LONG_SIZES = {"1k": 4000, "2k": 8000, "4k": 16000}

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


def parse_tasks(spec: str, source: str = "builtin") -> List[str]:
    """``"all"`` (every task ``source`` offers, :func:`offered`) or a
    comma-separated list of task names; a ValueError for an unknown name
    or a task the source has no prompts for."""
    offers = offered(source)
    names = list(offers) if spec.strip() == "all" else [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ValueError(f"tasks: unknown {unknown or spec!r}; expected 'all' or some of {list(TASKS)}")
    _check_offered(source, names)
    return names


def offered(source: str) -> Tuple[str, ...]:
    """The tasks ``source`` has prompts for (:data:`SOURCES`): the builtin
    source all of :data:`TASKS`; Spec-Bench those its categories map to
    (:data:`SPEC_BENCH_TASKS`) and ``long``; the Hub source those of
    :data:`pld.bench.hub_tasks.DATASETS`."""
    if source == "builtin":
        return tuple(TASKS)
    if source == "spec-bench":
        return tuple(t for t in TASKS if t in SPEC_BENCH_TASKS.values() or t == "long")
    if source == "hub":
        from .hub_tasks import DATASETS

        return tuple(DATASETS)
    raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")


def _check_offered(source: str, tasks: Sequence[str]) -> None:
    missing = [t for t in tasks if t not in offered(source)]
    if missing:
        raise ValueError(f"tasks: the {source} source has no prompts for {missing}; it offers "
                         f"{list(offered(source))} (--source builtin has every task)")


def balanced(prompts: Iterable[Prompt], tasks: Sequence[str], limit: int,
             skip: int = 0) -> List[Prompt]:
    """Up to ``limit`` prompts per task, taken round-robin over the task's
    categories (in order of first appearance) so every category is covered,
    after the first ``skip`` of that order; the result is grouped by task in
    the order of ``tasks``."""
    if limit <= 0:
        raise ValueError(f"limit: expected a positive number of prompts per task, got {limit}")
    if skip < 0:
        raise ValueError(f"skip: expected a number of prompts >= 0, got {skip}")
    by_task: Dict[str, Dict[str, List[Prompt]]] = {t: {} for t in tasks}
    for p in prompts:
        if p.task in by_task:
            by_task[p.task].setdefault(p.category, []).append(p)
    out: List[Prompt] = []
    for t in tasks:
        queues = [list(q) for q in by_task[t].values()]
        taken = 0
        while taken < skip + limit and any(queues):
            for q in queues:
                if q and taken < skip + limit:
                    prompt = q.pop(0)
                    if taken >= skip:
                        out.append(prompt)
                    taken += 1
    return out


def spec_bench_questions(path: str) -> List[Tuple[str, str, Tuple[str, ...]]]:
    """(question id, category, turns) of each line of a Spec-Bench
    ``question.jsonl``: a ValueError naming the file, the line and the
    field where one is not as Spec-Bench writes it (question_id an int or
    a string, category a string, turns a non-empty list of strings), or
    the file cannot be read (pld.bench.jsonl)."""
    out = []
    for number, q in read_jsonl(path, "data"):
        where = f"data: {path} line {number}"
        qid, category, turns = q.get("question_id"), q.get("category"), q.get("turns")
        if isinstance(qid, bool) or not isinstance(qid, (int, str)):
            raise ValueError(f"{where}: question_id must be an int or a string, got {qid!r}")
        if not isinstance(category, str):
            raise ValueError(f"{where}: category must be a string, got {category!r}")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ValueError(f"{where}: turns must be a non-empty list of strings, got {turns!r}"[:300])
        out.append((str(qid), category, tuple(turns)))
    return out


def spec_bench(path: str, tasks: Sequence[str]) -> List[Prompt]:
    """Prompts from a Spec-Bench ``question.jsonl`` (question_id, category,
    turns; read by :func:`spec_bench_questions`); categories map to tasks by
    :data:`SPEC_BENCH_TASKS`."""
    questions = spec_bench_questions(path)
    out = []
    for qid, category, turns in questions:
        task = SPEC_BENCH_TASKS.get(category)
        if task in tasks:
            out.append(Prompt(id=f"spec-bench/{qid}", task=task, category=category,
                              turns=turns[:2] if task == "chat" else turns[:1], source="spec-bench"))
    if "long" in tasks:
        out.extend(long_prompts(questions))
    return out


def long_prompts(questions: Sequence[Tuple[str, str, Tuple[str, ...]]]) -> List[Prompt]:
    """Spec-Bench's summarization articles (of :func:`spec_bench_questions`)
    joined into longer prompts (:func:`joined`)."""
    articles = [turns[0] for _, category, turns in questions if category == "summarization"]
    articles = [a.split(":", 1)[1].strip() if a.startswith("Summarize:") else a for a in articles]
    return joined(articles, "spec-bench")


def joined(documents: Sequence[str], source: str) -> List[Prompt]:
    """Prompts of the task ``long``: ``documents`` joined, one prompt of each
    size of :data:`LONG_SIZES` in turn; prompt i takes documents from the
    (5 i)-th on, whole, until its size is reached (empty documents left
    out)."""
    documents = [d for d in documents if d]
    out: List[Prompt] = []
    for i in range(len(documents) // 5):
        for size, chars in LONG_SIZES.items():
            body: List[str] = []
            j, length = 5 * i, 0
            while length < chars:
                body.append(documents[j % len(documents)])
                length += len(body[-1])
                j += 1
            text = "Summarize the following texts in a few sentences.\n\n" + "\n\n".join(body)
            out.append(Prompt(id=f"{source}/long-{i}-{size}", task="long", category=size, turns=(text,),
                              source=source))
    return out


#: the environment variable naming the Spec-Bench question.jsonl
SPEC_BENCH_ENV = "PLD_SPEC_BENCH"
#: where the file lies relative to a folder searched for it
SPEC_BENCH_RELATIVE = os.path.join("shared", "data", "spec_bench", "question.jsonl")


def spec_bench_candidates(cwd: Optional[str] = None) -> List[str]:
    """The paths :func:`default_spec_bench` tries, in order, after the
    environment variable: ``shared/data/spec_bench/question.jsonl`` under the
    working directory and under each of its parents (so a clone beside
    ``shared/`` finds ``../shared/...``)."""
    here = Path(cwd or os.getcwd()).resolve()
    return [str(d / SPEC_BENCH_RELATIVE) for d in (here, *here.parents)]


def default_spec_bench(cwd: Optional[str] = None) -> str:
    """The Spec-Bench question.jsonl to use without ``--data``:
    ``$PLD_SPEC_BENCH`` when set (it must exist), else the first of
    :func:`spec_bench_candidates` that exists. A ValueError says which
    paths were tried and what to pass when there is none."""
    env = os.environ.get(SPEC_BENCH_ENV)
    if env:
        if not os.path.isfile(env):
            raise ValueError(f"data: ${SPEC_BENCH_ENV} is {env!r}, which is not a file; "
                             "point it at a Spec-Bench question.jsonl or pass --data PATH")
        return env
    tried = spec_bench_candidates(cwd)
    for path in tried:
        if os.path.isfile(path):
            return path
    listed = "\n  ".join(tried)
    raise ValueError(
        "data: no Spec-Bench question.jsonl found for --source spec-bench; pass --data PATH "
        f"or set ${SPEC_BENCH_ENV}=PATH. Tried ${SPEC_BENCH_ENV} (not set) and:\n  {listed}")


def load(source: str, tasks: Sequence[str], limit: int, data: str = "",
         skip: int = 0) -> List[Prompt]:
    """``limit`` prompts per task from ``source`` (see :data:`SOURCES`),
    after the first ``skip`` (:func:`balanced`); a ValueError for a task
    the source does not offer (:func:`offered`)."""
    _check_offered(source, tasks)
    if source == "builtin":
        from . import builtin_tasks

        # (the skip is the builtin set's own: the prompts --limit skip gives are left out)
        return balanced(builtin_tasks.prompts(tasks, limit, skip), tasks, limit)
    elif source == "spec-bench":
        if not data:
            raise ValueError("data: the spec-bench source needs --data PATH to a question.jsonl "
                             "(the command line finds a default: see default_spec_bench)")
        found = spec_bench(data, tasks)
    elif source == "hub":
        from . import hub_tasks

        found = hub_tasks.prompts(tasks, skip + limit)
    else:
        raise ValueError(f"source: expected one of {SOURCES}, got {source!r}")
    return balanced(found, tasks, limit, skip)
