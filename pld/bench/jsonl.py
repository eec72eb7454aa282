"""JSON-lines files a user names (Spec-Bench questions, a bench's results
to resume): read within bounds, every fault named with the file and line.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple

#: The largest file read (bytes): a question file is a few MB.
MAX_FILE = 1 << 30
#: The longest line read (bytes).
MAX_LINE = 16 << 20


def read_jsonl(path: str, what: str) -> List[Tuple[int, Dict[str, Any]]]:
    """(line number, object) of each non-blank line of ``path``. A
    ValueError naming ``what`` (the option), the file and the line for: a
    path that is not a regular file (missing, a folder, a FIFO, a device),
    a file over MAX_FILE bytes or a line over MAX_LINE, bytes that are not
    UTF-8, a line that is not a JSON object."""
    if not os.path.isfile(path):
        raise ValueError(f"{what}: {path!r} is not a regular file")
    size = os.path.getsize(path)
    if size > MAX_FILE:
        raise ValueError(f"{what}: {path!r} holds {size} bytes, more than the {MAX_FILE} read")
    out = []
    with open(path, "rb") as fh:
        for number, raw in enumerate(iter(lambda: fh.readline(MAX_LINE + 1), b""), 1):
            where = f"{what}: {path} line {number}"
            if len(raw) > MAX_LINE:
                raise ValueError(f"{where}: longer than {MAX_LINE} bytes")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{where}: not UTF-8 ({error.reason} at byte {error.start})") from None
            if not text.strip():
                continue
            try:
                item = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error.msg}, column {error.colno})") from None
            if not isinstance(item, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(item).__name__}")
            out.append((number, item))
    return out
