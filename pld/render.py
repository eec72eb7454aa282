"""Colouring the steps of a generation: every step that produced more than
one token is shown in colour, cycling red, green, blue, magenta (as in the
method's demo); single-token steps stay plain."""
from __future__ import annotations

import html
import sys
from typing import Any, List, Sequence

_ANSI = ["\033[31m", "\033[32m", "\033[34m", "\033[35m"]
_ANSI_RESET = "\033[0m"
_HTML = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd"]


def step_texts(tokenizer: Any, steps: Sequence[Sequence[int]]) -> List[str]:
    """The text each step added, decoded on the running sequence so that
    characters split across steps come out whole."""
    texts, done, ids = [], "", []
    for tokens in steps:
        ids.extend(tokens)
        full = tokenizer.decode(ids, skip_special_tokens=True)
        texts.append(full[len(done):])
        done = full
    return texts


def render_steps(tokenizer: Any, steps: Sequence[Sequence[int]], mode: str = "auto") -> str:
    if mode == "auto":
        mode = "html" if "ipykernel" in sys.modules else ("ansi" if sys.stdout.isatty() else "plain")
    if mode not in ("ansi", "html", "plain"):
        raise ValueError(f"mode must be 'auto', 'ansi', 'html' or 'plain', got {mode!r}")
    parts, colour = [], 0
    for tokens, text in zip(steps, step_texts(tokenizer, steps)):
        multi = len(tokens) > 1
        if mode == "plain" or not multi:
            parts.append(html.escape(text) if mode == "html" else text)
        elif mode == "ansi":
            parts.append(f"{_ANSI[colour % 4]}{text}{_ANSI_RESET}")
        else:
            parts.append(f'<span style="color:{_HTML[colour % 4]}">{html.escape(text)}</span>')
        colour += multi
    out = "".join(parts)
    return f'<pre style="white-space:pre-wrap">{out}</pre>' if mode == "html" else out
