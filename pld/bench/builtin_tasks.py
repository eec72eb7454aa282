"""The offline task set: prompts made from text and code that ship with
Python itself, so the benchmark runs with no data and no network.

* documents: the language reference topics behind ``help()``
  (``pydoc_data.topics``), cut at a paragraph boundary;
* code: functions of a fixed list of pure-Python standard-library modules
  (``inspect.getsource``).

Selection is deterministic (sorted names, fixed strides), so one Python
version always yields the same prompts.
"""
from __future__ import annotations

import importlib
import inspect
import re
from typing import Dict, List, Sequence, Tuple

from .tasks import Prompt

SUMMARY = ("Summarize the following section of the Python documentation in a short paragraph. "
           "Keep its terminology.\n\n{text}")
RAG = ("Use only the passages below to answer the question.\n\n{passages}\n\n"
       "Question: What does the passage about {subject} say? Answer in a few sentences, "
       "quoting the passage where you can.")
TRANSLATE = "Translate the following text into French. Output only the translation.\n\n{text}"
CHAT_TURN1 = "Explain {subject} in Python to a beginner, in one short paragraph with a small example."
CHAT_TURN2 = {
    "rewrite-list": "Rewrite your previous answer as a numbered list of its key points.",
    "shorten": "Shorten your previous answer to three sentences, keeping its example.",
    "formal": "Rewrite your previous answer in a formal tone, keeping the same structure and example.",
}
CODE = "Here is a Python function:\n\n```python\n{code}```\n\n{edit} Output the complete function."
CODE_EDITS = {
    "rename": "Rename the parameter `{param}` to `{new}` everywhere in the function.",
    "docstring": "Add a docstring that explains the parameters and the return value.",
    "type-hints": "Add type hints to the parameters and the return value.",
}
CODE_MODULES = ("textwrap", "shlex", "fnmatch", "posixpath", "glob", "colorsys", "heapq", "string",
                "difflib", "calendar", "ipaddress", "json.encoder", "html", "urllib.parse", "csv",
                "configparser", "tokenize", "base64", "quopri", "gettext", "locale", "pprint",
                "ntpath", "shutil", "statistics", "fractions", "random")


def prompts(tasks: Sequence[str], limit: int, skip: int = 0) -> List[Prompt]:
    """``limit`` prompts for each task in ``tasks`` (fewer only when the
    machine's Python has too few documents or functions), none of those
    that ``limit=skip`` gives: a set to fit on and one to report apart."""
    makers = {"summarization": _summaries, "rag": _rag, "chat": _chat,
              "code": _code, "translation": _translations, "long": _long}
    out: List[Prompt] = []
    for t in tasks:
        out.extend(makers[t](limit, skip))
    return out


def documents(min_chars: int = 700, max_chars: int = 2400) -> List[Tuple[str, str, str]]:
    """(key, title, text) of the help() topics with at least ``min_chars``,
    each cut to at most ``max_chars`` at a paragraph boundary."""
    from pydoc_data.topics import topics

    out = []
    for key in sorted(topics):
        text = topics[key].strip()
        if len(text) < min_chars:
            continue
        title = text.splitlines()[0].strip()
        out.append((key, title, _cut(text, max_chars)))
    return out


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    end = text.rfind("\n\n", 0, max_chars)
    return text[:end if end > max_chars // 2 else max_chars].rstrip()


def _subject(title: str) -> str:
    """'The "assert" statement' -> 'the "assert" statement'."""
    return title[:1].lower() + title[1:] if title[:4] == "The " else title


def _spread(items: list, n: int, skip: int = 0) -> list:
    """``n`` items spread evenly over ``items`` (all of them when fewer),
    after leaving out the ``skip`` that ``_spread(items, skip)`` gives."""
    if skip:
        left_out = set(_picks(len(items), skip))
        items = [x for i, x in enumerate(items) if i not in left_out]
    return [items[i] for i in _picks(len(items), n)]


def _picks(count: int, n: int) -> List[int]:
    """``n`` indices spread evenly over ``range(count)`` (all when fewer)."""
    if n >= count:
        return list(range(count))
    return [i * count // n for i in range(n)]


def _summaries(limit: int, skip: int = 0) -> List[Prompt]:
    return [Prompt(id=f"builtin/summarization/{key}", task="summarization", category="pydoc",
                   turns=(SUMMARY.format(text=text),), source="builtin")
            for key, _, text in _spread(documents(), limit, skip)]


def _long(limit: int, skip: int = 0) -> List[Prompt]:
    from .tasks import joined

    return joined([text for _, _, text in documents()], "builtin")[skip:skip + limit]


def _rag(limit: int, skip: int = 0) -> List[Prompt]:
    docs = documents(max_chars=1400)
    out = []
    for i, (key, title, text) in enumerate(_spread(docs, limit, skip)):
        # the relevant passage between two distractors, in a fixed order
        j = docs.index((key, title, text))
        others = [docs[(j + 7) % len(docs)], docs[(j + 19) % len(docs)]]
        passages = [_cut(o[2], 600) for o in others]
        passages.insert(i % 3, text)
        body = "\n\n".join(f"Passage {n + 1}:\n{p}" for n, p in enumerate(passages))
        out.append(Prompt(id=f"builtin/rag/{key}", task="rag", category="pydoc",
                          turns=(RAG.format(passages=body, subject=_subject(title)),), source="builtin"))
    return out


def _chat(limit: int, skip: int = 0) -> List[Prompt]:
    kinds = list(CHAT_TURN2)
    return [Prompt(id=f"builtin/chat/{key}", task="chat", category=kinds[i % len(kinds)],
                   turns=(CHAT_TURN1.format(subject=_subject(title)), CHAT_TURN2[kinds[i % len(kinds)]]),
                   source="builtin")
            for i, (key, title, _) in enumerate(_spread(documents(), limit, skip))]


def _translations(limit: int, skip: int = 0) -> List[Prompt]:
    out = []
    for key, _, text in _spread(documents(), limit, skip):
        prose = [p for p in text.split("\n\n")[1:] if _is_prose(p)]
        if prose:
            paragraph = " ".join(" ".join(prose[:2]).split())[:700]
            out.append(Prompt(id=f"builtin/translation/{key}", task="translation", category="pydoc",
                              turns=(TRANSLATE.format(text=paragraph),), source="builtin"))
    return out


def _is_prose(paragraph: str) -> bool:
    lines = paragraph.splitlines()
    return bool(lines) and not any(line.startswith(" ") for line in lines) and len(paragraph) > 80 \
        and not set(paragraph.strip()) <= set("*=-")


def functions(min_lines: int = 12, max_lines: int = 45) -> List[Tuple[str, str, str]]:
    """(qualified name, source, first parameter used at least twice) of the
    public functions in :data:`CODE_MODULES` of a moderate size."""
    out = []
    for module_name in CODE_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # pragma: no cover - a trimmed Python
            continue
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ != module.__name__ or name.startswith("_"):
                continue
            try:
                source = inspect.getsource(fn)
            except (OSError, TypeError):  # pragma: no cover - no source on disk
                continue
            if not min_lines <= source.count("\n") <= max_lines:
                continue
            params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
            body = source.split(":", 1)[-1]
            used = [p for p in params if len(re.findall(rf"\b{re.escape(p)}\b", body)) >= 2]
            if used:
                out.append((f"{module_name}.{name}", source, used[0]))
    return out


def _code(limit: int, skip: int = 0) -> List[Prompt]:
    kinds = list(CODE_EDITS)
    out = []
    for i, (qualname, source, param) in enumerate(_spread(functions(), limit, skip)):
        kind = kinds[i % len(kinds)]
        edit = CODE_EDITS[kind].format(param=param, new=f"new_{param}")
        out.append(Prompt(id=f"builtin/code/{qualname}", task="code", category=kind,
                          turns=(CODE.format(code=source, edit=edit),), source="builtin"))
    return out


def counts() -> Dict[str, int]:
    """How many prompts each task can offer on this Python (for --help)."""
    docs, fns = len(documents()), len(functions())
    return {"summarization": docs, "rag": docs, "chat": docs, "code": fns,
            "translation": len(_translations(docs)), "long": docs // 5 * 3}
