"""pld.Corpus: token sequences to draft from beyond the row.

A corpus holds documents a user adds and the outputs of earlier
generations, and proposes their continuations of a row's suffix n-gram as
a token trie. The C core (csrc/pld.h, "Corpus") keeps at most
``max_tokens`` tokens in at most ``segments`` generations, each an n-gram
index; when more would be held, the oldest generation is dropped whole. A
lookup asks every generation for its newest few occurrences of each suffix
n-gram, so its cost does not grow with the tokens held (bench: ``python -m
pld bench lookup --corpus``). Memory: about 60-130 bytes a token held
(pld.h states the bound).

One corpus may serve several threads at once: the core takes a lock per
corpus around every call (with the GIL released), and this class guards
its own state (the model it is bound to, saving) with another.

Token ids carry no tokenizer: a corpus built with one tokenizer and used
with another would draft nonsense. :meth:`Corpus.bind` (the generation loop
calls it with the model's vocabulary size and special ids) records the
first model and refuses another, and refuses ids beyond the vocabulary;
a different tokenizer with the same vocabulary size and special ids cannot
be told from ids alone -- give a ``fingerprint`` (:func:`tokenizer_fingerprint`)
and :meth:`Corpus.check_fingerprint` to tell them apart.

File format (:meth:`Corpus.save`, :meth:`Corpus.load`), little-endian:

    offset 0   magic b"PLDCORP\\0" (8 bytes)
           8   version, uint32 (1)
          12   header length H, uint32 (at most 1 MiB)
          16   header: H bytes of UTF-8 JSON, an object with
                 max_tokens, min_ngram, max_ngram, segments   the settings
                 n_sequences, n_tokens, token_bytes (4 or 8)  what follows
                 segments_used, evicted                       the state
                 vocab_size, signature, fingerprint           the binding (null: none)
                 trust (optional)                             what drafting learned:
                   {"layout": [4, 3, 5, 4], "buckets": [[n-gram, support, depth,
                   agreement, hits, trials], ...]}
      16 + H   n_sequences lengths, uint32, oldest sequence first
               n_tokens ids, int32 (token_bytes 4: every id < 2**31) or int64
      end - 32 SHA-256 of every byte before it

(The header's "min_ngram" and "max_ngram" are the corpus's min_ngram_size
and max_ngram_size: the keys kept their first names, so files of every
release read alike.)

Loading re-adds the sequences in order, which rebuilds the same
generations, so a loaded corpus proposes what the saved one did.

A corpus also keeps what the generations that drafted from it learned of
its worth (:meth:`Corpus.acceptance`): the hits and trials of the corpus
nodes' acceptance buckets, handed back by each generation as it ends and
given to the next as it starts, so the width budget's trust in corpus
drafts carries across calls (the last :data:`TRUST_WINDOW` trials a
bucket). It is saved with the corpus; a file whose trust was keyed under
another bucket layout (pld.acceptance_buckets.LAYOUT: another pld) loads
without it, with a warning.
"""
from __future__ import annotations

import array
import contextlib
import hashlib
import json
import logging
import math
import operator
import os
import re
import secrets
import shutil
import stat
import struct
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _core, _renamed
from .acceptance_buckets import LAYOUT, is_bucket
from .config import check_size

__all__ = ["Corpus", "tokenizer_fingerprint", "MAGIC", "VERSION"]

logger = logging.getLogger("pld")

MAGIC = b"PLDCORP\x00"
VERSION = 1
_PREFIX = struct.Struct("<8sII")  # magic, version, header length
_DIGEST = hashlib.sha256().digest_size
_MAX_HEADER = 1 << 20
_MAX_FILE = _PREFIX.size + _MAX_HEADER + 12 * _core.CORPUS_MAX_TOKENS + _DIGEST
_BIG_ENDIAN = sys.byteorder == "big"
#: The largest evicted count a file holds (a uint64); the count stops there.
_MAX_EVICTED = (1 << 64) - 1
#: The trials a bucket of :meth:`Corpus.acceptance` keeps: past it, the
#: older evidence is scaled down, so the trust follows a changing corpus.
TRUST_WINDOW = 1000.0


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """The SHA-256 (hex) of a tokenizer's vocabulary: its (token, id) items,
    sorted, as JSON. ``tokenizer`` is anything with ``get_vocab()`` (a
    transformers tokenizer: added and special tokens included) or a
    mapping of token to id. Two tokenizers with the same fingerprint map
    the same strings to the same ids."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else tokenizer
    try:
        items = sorted((str(token), int(i)) for token, i in dict(vocab).items())
    except (TypeError, ValueError) as e:
        raise TypeError(f"tokenizer: expected a tokenizer with get_vocab() or a mapping of token "
                        f"to id, got {type(tokenizer).__name__}") from e
    text = json.dumps(items, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def model_signature(vocab_size: int, config: Any) -> Tuple:
    """The signature :meth:`Corpus.bind` takes for a model: (vocab_size,
    bos, eos, pad), the special ids read from ``config`` (a transformers
    config; None where it has none) as plain ints, comparable and savable."""
    return (vocab_size,) + tuple(_ids(getattr(config, name, None))
                                 for name in ("bos_token_id", "eos_token_id", "pad_token_id"))


def _ids(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return None if value is None else int(value)


def _signature(value: Any, name: str = "signature") -> Tuple:
    """A model signature as nested tuples of None, bool, int and str (what
    JSON keeps); lists become tuples. At most _MAX_HEADER_DEPTH - 1 levels
    (what a file's header keeps): deeper, or a list that holds itself, is a
    TypeError naming ``name``."""
    def norm(v: Any, level: int = 1) -> Any:
        # exact str, int and tuple: the values are compared under the lock,
        # where a subclass's __eq__ (caller code) must not run
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, str):
            return _exact_str(v)
        if isinstance(v, (tuple, list)):
            if level >= _MAX_HEADER_DEPTH:
                raise TypeError(f"{name}: nests deeper than {_MAX_HEADER_DEPTH - 1} levels "
                                "(or holds itself)")
            return tuple(norm(x, level + 1) for x in v)
        try:
            return int.__index__(operator.index(v))  # ints, NumPy / torch integers
        except TypeError:
            raise TypeError(f"{name}: expected a tuple of ints, None, strings or tuples of them, "
                            f"got an item of type {type(v).__name__}") from None

    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name}: expected a tuple, got {type(value).__name__}")
    return norm(value)


def _exact_str(value: Any) -> str:
    """A str (subclass) as a plain str, its own methods not called."""
    return str.__str__(value)


def _on_cpu(tokens: Any, name: str, tail: Optional[int] = None) -> Any:
    """A tensor on an accelerator, copied to the CPU (only its last `tail`
    ids when given); anything else as it is. A tensor on the meta device
    (no values) is a ValueError naming the argument ``name``."""
    device = getattr(tokens, "device", None)
    if device is not None and getattr(device, "type", "cpu") == "meta":
        raise ValueError(f"{name}: a tensor on the meta device holds no ids")
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        if tail is not None and getattr(tokens, "ndim", 1) == 1 and tokens.shape[0] > tail:
            tokens = tokens[-tail:]
        return tokens.cpu()
    return tokens


class Corpus:
    """A bounded, thread-safe set of token sequences to draft from (see the
    module's docstring).

    ``max_tokens``: the most tokens held (at most ``pld._core.CORPUS_MAX_TOKENS``);
    ``min_ngram_size``..``max_ngram_size``: the suffix n-gram sizes looked up;
    ``segments``: the generations (1..64) the tokens are spread over -- the
    oldest goes whole when the corpus is full, so more segments evict in
    smaller steps, at the cost of a lookup per segment; ``fingerprint``: the
    tokenizer's (:func:`tokenizer_fingerprint`), kept and saved;
    ``seed``: the key of the n-gram hashes (None: random; proposals
    never depend on it). The keywords are pld.NgramIndex's; the old
    ``min_ngram``, ``max_ngram`` and ``hash_seed`` still work for one
    release, with a DeprecationWarning."""

    @_renamed.old_keywords_too(_renamed.CORPUS, "pld.Corpus()")
    def __init__(self, max_tokens: int = 1 << 24, *, min_ngram_size: int = 2, max_ngram_size: int = 4,
                 segments: int = 4, fingerprint: Optional[str] = None,
                 seed: Optional[int] = None) -> None:
        max_tokens = check_size("max_tokens", max_tokens, 1, _core.CORPUS_MAX_TOKENS)
        min_ngram_size = check_size("min_ngram_size", min_ngram_size, 1, _core.MAX_NGRAM)
        max_ngram_size = check_size("max_ngram_size", max_ngram_size, 1, _core.MAX_NGRAM)
        segments = check_size("segments", segments, 1, _core.CORPUS_MAX_SEGMENTS)
        if min_ngram_size > max_ngram_size:
            raise ValueError(f"min_ngram_size ({min_ngram_size}) must not exceed "
                             f"max_ngram_size ({max_ngram_size})")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise TypeError(f"fingerprint must be a str or None, got {type(fingerprint).__name__}")
        fingerprint = None if fingerprint is None else _exact_str(fingerprint)
        if seed is not None:
            seed = check_size("seed", seed, 0, (1 << 64) - 1)
        self._core = _core.Corpus(max_tokens, min_ngram_size, max_ngram_size, segments, seed)
        self._lock = threading.Lock()  # the binding, the fingerprint, the evicted base
        self._vocab_size: Optional[int] = None
        self._signature: Optional[Tuple] = None
        self._fingerprint = fingerprint
        self._evicted_base = 0  # sequences evicted before a save, for a loaded corpus
        self._trust: Dict[Tuple[int, ...], List[float]] = {}  # bucket -> [hits, trials]

    # ------------------------------------------------------------ contents

    def add(self, tokens: Any) -> None:
        """Add one sequence: a list or tuple of ints, or a 1-D integer tensor
        or array (read without a copy where it can be; a tensor on an
        accelerator is copied to the CPU). Ids must be >= 0, and below the
        vocabulary size of a bound corpus (:meth:`bind`); at most
        ``max_tokens`` of them; an empty sequence is ignored (ValueError
        naming ``tokens`` otherwise, and nothing is added). The oldest
        generation goes while more than ``max_tokens`` tokens are held."""
        self._core.add(_on_cpu(tokens, "tokens"))

    def offer(self, tokens: List[int]) -> bool:
        """Add a finished generation's output (a list of ids) as far as the
        corpus can take it, never at the cost of the output: an output
        longer than ``max_tokens`` gives its last ``max_tokens`` tokens, one
        the corpus refuses (an id beyond the vocabulary it is bound to) is
        left out. Each says why in a warning on the "pld" logger. Whether
        anything was added."""
        if len(tokens) > self.max_tokens:
            logger.warning("pld: the corpus (max_tokens %d) keeps the last %d of an output's %d tokens",
                           self.max_tokens, self.max_tokens, len(tokens))
            tokens = tokens[-self.max_tokens:]
        try:
            self.add(tokens)
        except ValueError as error:  # the corpus is optional: the output stands
            logger.warning("pld: an output was not added to the corpus (%s)", error)
            return False
        return len(tokens) > 0  # (an array or a tensor has no truth value)

    def propose_tree(self, context: Any, depth: int, *, per_ngram: int = 4, max_nodes: int = 64,
                     eos_token_id: Any = None) -> Tuple[List[int], List[int], List[int], List[int], List[int]]:
        """The continuations of ``context``'s suffix n-grams (the caller's
        sequence, or its last ``max_ngram_size`` ids) in the corpus, as one token
        trie: (tokens, parents, depths, ngrams, supports), one entry a node,
        parents first (parent -1: a child of the root, context's last
        token). For each n from the largest, each generation from the newest
        gives its newest ``per_ngram`` occurrences; each continues for at
        most ``depth`` tokens within its sequence, cut before an
        ``eos_token_id``; at most ``max_nodes`` nodes."""
        return self._core.propose_tree(_on_cpu(context, "context", self._core.max_ngram), depth, per_ngram,
                                       max_nodes, eos_token_id)

    def sequences(self) -> List[List[int]]:
        """Every sequence held, oldest first (one consistent snapshot)."""
        tokens, lengths, _ = self._snapshot()
        out, at = [], 0
        for n in lengths:
            out.append(tokens[at:at + n].tolist())
            at += n
        return out

    def clear(self) -> None:
        """Drop every sequence (they do not count as evicted); the settings,
        the binding and the learned :meth:`acceptance` stay."""
        self._core.clear()

    # ------------------------------------------------------------ trust

    def acceptance(self) -> Tuple[Dict[Tuple[int, ...], float], Dict[Tuple[int, ...], float]]:
        """(hits, trials) per acceptance bucket of corpus nodes (keyed as
        pld.token_tree.AcceptanceModel.counts keys them), summed over the
        generations that drafted from this corpus; empty at first."""
        with self._lock:
            return ({b: v[0] for b, v in self._trust.items()}, {b: v[1] for b, v in self._trust.items()})

    def learn(self, hits: Dict[Tuple[int, ...], float], trials: Dict[Tuple[int, ...], float]) -> None:
        """Add a generation's ``hits`` and ``trials`` of corpus nodes (per
        bucket, hits <= trials) to :meth:`acceptance`; a bucket past
        :data:`TRUST_WINDOW` trials is scaled down to it. ValueError (nothing
        learned) for a key that is not a bucket (pld.acceptance_buckets), a
        count that is not a finite real number, or hits outside [0, trials].
        The counts are copied before the corpus's lock is taken."""
        hits, trials = _counts("hits", hits), _counts("trials", trials)  # plain copies: no caller
        for b, h in hits.items():                                        # code under the lock
            if not 0.0 <= h <= trials.get(b, 0.0):
                raise ValueError(f"learn: bucket {b!r} has {h} hits in {trials.get(b, 0.0)} trials")
        with self._lock:
            for b, t in trials.items():
                if t <= 0.0:
                    continue
                cell = self._trust.setdefault(b, [0.0, 0.0])
                cell[0] += hits.get(b, 0.0)
                cell[1] += t
                if cell[1] > TRUST_WINDOW:
                    k = TRUST_WINDOW / cell[1]
                    cell[0], cell[1] = cell[0] * k, TRUST_WINDOW

    def __len__(self) -> int:
        """Tokens held (separators not counted)."""
        return len(self._core)

    def __repr__(self) -> str:
        return (f"pld.Corpus(max_tokens={self.max_tokens}, min_ngram_size={self.min_ngram_size}, "
                f"max_ngram_size={self.max_ngram_size}, segments={self.segments}) with {len(self)} tokens "
                f"in {self.num_sequences} sequences")

    @property
    def num_sequences(self) -> int:
        return self._core.num_sequences

    @property
    def evicted(self) -> int:
        """Sequences dropped so far to stay within ``max_tokens`` (those of
        the corpus a loaded one was saved from included)."""
        with self._lock:
            base = self._evicted_base
        return min(base + self._core.evicted, _MAX_EVICTED)

    @property
    def nbytes(self) -> int:
        """Heap bytes the C core owns."""
        return self._core.nbytes

    @property
    def bytes_per_token(self) -> Optional[float]:
        """nbytes per token held; None when empty."""
        n = len(self)
        return self.nbytes / n if n else None

    @property
    def max_id(self) -> int:
        """The largest id held; -1 when empty."""
        return self._core.max_id

    max_tokens = property(lambda self: self._core.max_tokens, doc="The most tokens held.")
    min_ngram_size = property(lambda self: self._core.min_ngram, doc="The smallest n-gram looked up.")
    max_ngram_size = property(lambda self: self._core.max_ngram, doc="The largest n-gram looked up.")
    segments = property(lambda self: self._core.segments, doc="The most generations held.")
    seed = property(lambda self: self._core.hash_seed, doc="The key of the n-gram hashes.")
    # the old names, read: deprecated for one release
    min_ngram = _renamed.deprecated_alias("min_ngram", "min_ngram_size", "Corpus")
    max_ngram = _renamed.deprecated_alias("max_ngram", "max_ngram_size", "Corpus")
    hash_seed = _renamed.deprecated_alias("hash_seed", "seed", "Corpus")

    @property
    def fingerprint(self) -> Optional[str]:
        return self._fingerprint

    @property
    def signature(self) -> Optional[Tuple]:
        """The signature of the model the corpus is bound to (None: none yet)."""
        return self._signature

    @property
    def vocab_size(self) -> Optional[int]:
        return self._vocab_size

    # ------------------------------------------------------------- binding

    def bind(self, vocab_size: int, signature: Tuple) -> None:
        """Check the corpus against a model: ``vocab_size`` ids, and
        ``signature`` (e.g. (vocab_size, bos, eos, pad) from the model's
        config). The first call records them; a later one with another
        signature or vocab_size raises ValueError (another tokenizer?), and every call
        raises ValueError if an id held is >= vocab_size. Once bound, the
        corpus refuses to add ids >= the first vocab_size. Ids alone cannot
        tell apart two tokenizers with the same vocabulary size and special
        ids: see :meth:`check_fingerprint`."""
        vocab_size = check_size("vocab_size", vocab_size, 1, (1 << 63) - 1)
        signature = _signature(signature)  # plain values: compared under the lock
        with self._lock:
            if self._signature is not None and signature != self._signature:
                raise ValueError(f"corpus: built for a model with signature {self._signature!r} "
                                 f"(vocab_size {self._vocab_size}), used with {signature!r} "
                                 f"(vocab_size {vocab_size}): another tokenizer?")
            if self._signature is not None and vocab_size != self._vocab_size:
                raise ValueError(f"corpus: bound to a vocabulary of {self._vocab_size} ids, used with "
                                 f"{vocab_size}: another tokenizer?")
            # (the first binding also makes every later add refuse ids >= vocab_size)
            top = self._core._bind_vocab(vocab_size, self._signature is None)
            if top >= 0:
                raise ValueError(f"corpus: holds token id {top}, beyond the model's vocabulary of "
                                 f"{vocab_size} ids: built with another tokenizer?")
            if self._signature is None:
                self._signature, self._vocab_size = signature, vocab_size

    def check_fingerprint(self, fingerprint: str) -> None:
        """Compare a tokenizer's fingerprint (:func:`tokenizer_fingerprint`)
        with the corpus's: ValueError if they differ. A corpus without one
        takes this one."""
        if not isinstance(fingerprint, str):
            raise TypeError(f"fingerprint must be a str, got {type(fingerprint).__name__}")
        fingerprint = _exact_str(fingerprint)  # compared under the lock
        with self._lock:
            if self._fingerprint is None:
                self._fingerprint = fingerprint
            elif fingerprint != self._fingerprint:
                raise ValueError(f"corpus: built with the tokenizer of fingerprint "
                                 f"{self._fingerprint[:16]}..., used with {fingerprint[:16]}...: "
                                 "another tokenizer?")

    # ----------------------------------------------------------- save/load

    def _snapshot(self) -> Tuple[array.array, array.array, int]:
        """(tokens, lengths, evicted): the held sequences as int64 arrays and
        the count evicted before them, from one hold of the core's lock."""
        raw_tokens, raw_lengths, evicted = self._core._export()
        tokens, lengths = array.array("q"), array.array("q")
        tokens.frombytes(raw_tokens)
        lengths.frombytes(raw_lengths)
        return tokens, lengths, evicted

    def save(self, path: Any) -> None:
        """Write the corpus to ``path`` (format: the module's docstring),
        atomically: a temporary file in the same folder, then os.replace
        (``path`` a link: the file it names is replaced, the link stays).
        The file keeps the mode of the one it replaces; a new one gets the
        umask's (0644 under the usual 022). ``path``: a str, bytes or
        os.PathLike. ValueError naming ``path`` if
        something other than a regular file is there (a folder, a FIFO, a
        device: os.replace would put the corpus in its place)."""
        path = _file_path(path)
        if os.path.exists(path) and not os.path.isfile(path):
            raise ValueError(f"path: {path!r} is not a regular file: a save would replace it")
        with self._lock:
            tokens, lengths, evicted = self._snapshot()
            header = {
                # (the file keeps its keys "min_ngram"/"max_ngram": files of every
                # release read alike)
                "max_tokens": self.max_tokens, "min_ngram": self.min_ngram_size,
                "max_ngram": self.max_ngram_size, "segments": self.segments,
                "n_sequences": len(lengths), "n_tokens": len(tokens),
                "segments_used": None, "evicted": min(self._evicted_base + evicted, _MAX_EVICTED),
                "vocab_size": self._vocab_size, "signature": self._signature,
                "fingerprint": self._fingerprint,
                "trust": {"layout": list(LAYOUT),
                          "buckets": [[*b, h, t] for b, (h, t) in sorted(self._trust.items())]},
            }
        top = _max(tokens)
        header["token_bytes"] = 4 if top < (1 << 31) else 8
        header["segments_used"] = _segments_used(lengths, self.max_tokens, self.segments)
        head = json.dumps(header, separators=(",", ":")).encode("utf-8")
        digest = hashlib.sha256()
        parts = [_PREFIX.pack(MAGIC, VERSION, len(head)), head, _pack(lengths, 4, signed=False),
                 _pack(tokens, header["token_bytes"], signed=True)]
        for p in parts:
            digest.update(p)
        # (a link is followed: the file it names gets the corpus, the link stays)
        target = os.path.realpath(path)
        folder = os.path.dirname(target)
        # (a name of its own length: one near the file system's limit still saves)
        tmp = os.path.join(folder, f".pld-corpus-{secrets.token_hex(8)}.tmp")
        # created 0666 less the umask, as any new file; one it replaces keeps its mode
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                with contextlib.suppress(FileNotFoundError):
                    shutil.copymode(target, tmp)
                for p in parts:
                    f.write(p)
                f.write(digest.digest())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    @classmethod
    @_renamed.old_keywords_too({"hash_seed": "seed"}, "pld.Corpus.load()")
    def load(cls, path: Any, *, seed: Optional[int] = None) -> "Corpus":
        """A corpus read from a file :meth:`save` wrote. ValueError, naming
        the file and what is wrong, for anything but such a file: a wrong
        magic or version, a bad checksum, a truncated file, sizes that do
        not add up, negative ids, settings or lengths beyond the limits, a
        header nested deeper than any save writes, something that is not a
        regular file (a device, a pipe: refused before it is read), a read
        that fails. Nothing of the body is read or allocated before the
        header's sizes match the file's.
        ``seed``: the key of the n-gram hashes, as for the constructor
        (``hash_seed``, its old name, still works for one release)."""
        path = _file_path(path)

        def bad(what: str) -> ValueError:
            return ValueError(f"corpus file {path!r}: {what}")

        header, f, lengths, tokens = _read_file(path, bad)
        corpus = cls(f.max_tokens, min_ngram_size=f.min_ngram, max_ngram_size=f.max_ngram,
                     segments=f.segments, fingerprint=f.fingerprint, seed=seed)
        view, at = memoryview(tokens), 0
        for n in lengths:
            corpus._core.add(view[at:at + n])
            at += n
        if (len(corpus) != f.n_tokens or corpus.num_sequences != f.n_sequences
                or corpus._core.segments_used != f.segments_used):
            raise bad("the sequences do not fit the corpus's bounds")
        corpus._evicted_base = f.evicted
        corpus._signature, corpus._vocab_size = f.signature, f.vocab
        if f.vocab is not None:  # (the ids were checked against it)
            corpus._core._bind_vocab(f.vocab, True)
        corpus._trust = _read_trust(header.get("trust"), bad, path)
        return corpus


def _check_prefix(data: bytes, size: int, bad: Callable[[str], ValueError]) -> int:
    """The header's length, after the magic, the version and the lengths
    in ``data`` (the first bytes of a file of ``size`` bytes) are checked."""
    magic, version, hlen = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise bad("not a pld corpus file (wrong magic)")
    if version != VERSION:
        raise bad(f"unsupported version {version} (this pld reads version {VERSION})")
    if hlen > _MAX_HEADER or _PREFIX.size + hlen + _DIGEST > size:
        raise bad(f"header length {hlen} runs past the end of the file ({size} bytes): truncated?")
    return hlen


def _parse_header(head: bytes, bad: Callable[[str], ValueError]) -> dict:
    """A corpus file's JSON header (``head``: its bytes) as a dict."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(f"unreadable header ({e})") from None
    if _json_depth(text) > _MAX_HEADER_DEPTH:
        raise bad(f"the header nests deeper than {_MAX_HEADER_DEPTH} levels")
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise bad(f"unreadable header ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    return header


@dataclass(frozen=True)
class _FileSettings:
    """A corpus file header's fields, each checked against the limits."""

    max_tokens: int
    min_ngram: int
    max_ngram: int
    segments: int
    n_sequences: int
    n_tokens: int
    token_bytes: int
    segments_used: int
    evicted: int
    vocab: Optional[int]
    signature: Any
    fingerprint: Optional[str]

    @classmethod
    def of(cls, header: dict, bad: Callable[[str], ValueError]) -> "_FileSettings":
        def number(name: str, lo: int, hi: int) -> int:
            if name not in header:
                raise bad(f"the header has no {name}")
            v = header[name]
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(f"{name} must be an integer, got {v!r}")
            if not lo <= v <= hi:
                raise bad(f"{name} = {v} is outside [{lo}, {hi}]")
            return v

        max_tokens = number("max_tokens", 1, _core.CORPUS_MAX_TOKENS)
        min_ngram = number("min_ngram", 1, _core.MAX_NGRAM)
        max_ngram = number("max_ngram", min_ngram, _core.MAX_NGRAM)
        segments = number("segments", 1, _core.CORPUS_MAX_SEGMENTS)
        n_seq = number("n_sequences", 0, max_tokens)
        n_tok = number("n_tokens", n_seq, max_tokens)
        tb = number("token_bytes", 4, 8)
        if tb not in (4, 8):
            raise bad(f"token_bytes must be 4 or 8, got {tb}")
        used = number("segments_used", 0, segments)
        evicted = number("evicted", 0, _MAX_EVICTED)
        vocab = None if header.get("vocab_size") is None else number("vocab_size", 1, (1 << 63) - 1)
        try:
            sig = None if header.get("signature") is None else _signature(header["signature"])
        except TypeError as e:
            raise bad(f"bad signature ({e})") from None
        if (sig is None) != (vocab is None):
            raise bad("signature and vocab_size must be given together")
        fp = header.get("fingerprint")
        if fp is not None and not isinstance(fp, str):
            raise bad("fingerprint must be a string or null")
        return cls(max_tokens, min_ngram, max_ngram, segments, n_seq, n_tok, tb, used, evicted, vocab, sig, fp)


def _check_sequences(lengths: array.array, tokens: array.array, f: "_FileSettings",
                     bad: Callable[[str], ValueError]) -> None:
    """Check a file's sequence lengths and token ids against its header."""
    n_tok = f.n_tokens
    if any(n < 1 or n > f.max_tokens for n in lengths):
        raise bad("a sequence length is 0 or beyond max_tokens")
    if sum(lengths) != n_tok:
        raise bad(f"the sequence lengths add up to {sum(lengths)} tokens, the header says {n_tok}")
    if n_tok and _min(tokens) < 0:
        raise bad(f"negative token id {_min(tokens)}")
    if f.vocab is not None and n_tok and _max(tokens) >= f.vocab:
        raise bad(f"token id {_max(tokens)} is beyond the vocabulary of {f.vocab} ids it is bound to")
    if _segments_used(lengths, f.max_tokens, f.segments) != f.segments_used:
        raise bad("the sequences do not make the segments the header says")


def _count(v: Any) -> Optional[float]:
    """``v`` as a float if it is a finite int or float (not a bool): a hit
    or trial count; else None (an int too large for a float too)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)  # (once: a subclass's __float__ may answer differently twice)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _short(v: Any) -> str:
    """repr(v), cut to 40 characters (a huge int has thousands of digits)."""
    try:
        text = repr(v) if not isinstance(v, int) or abs(v) < 10 ** 30 else f"an int of {v.bit_length()} bits"
    except ValueError:
        text = f"a {type(v).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def _counts(name: str, counts: Any) -> Dict[Tuple[int, ...], float]:
    """``counts`` (a dict of bucket -> count) as a new dict of plain tuples
    and floats; TypeError or ValueError naming ``name`` otherwise."""
    if not isinstance(counts, dict):
        raise TypeError(f"learn: {name} must be a dict, got {type(counts).__name__}")
    out: Dict[Tuple[int, ...], float] = {}
    for b, v in list(counts.items()):
        key = tuple(b) if isinstance(b, tuple) else b
        if not is_bucket(key):
            raise ValueError(f"learn: {name} key {b!r} is not an acceptance bucket")
        f = _count(v)
        if f is None:
            raise ValueError(f"learn: {name}[{key!r}] = {_short(v)} is not a finite number")
        out[key] = f
    return out


def _read_trust(trust: Any, bad, path: str) -> Dict[Tuple[int, ...], List[float]]:
    """A loaded header's "trust" as Corpus._trust: {} if absent, or (with a
    warning) if keyed under another bucket layout; ValueError via ``bad``
    for anything else that is not what save writes."""
    if trust is None:
        return {}
    if not isinstance(trust, dict) or not isinstance(trust.get("buckets"), list):
        raise bad("trust must be an object with a list of buckets")
    if trust.get("layout") != list(LAYOUT):
        warnings.warn(f"corpus file {path!r}: its learned trust is keyed under another bucket layout "
                      f"({trust.get('layout')!r}, this pld's is {list(LAYOUT)}); loaded without it",
                      RuntimeWarning, stacklevel=3)
        return {}
    out: Dict[Tuple[int, ...], List[float]] = {}
    for entry in trust["buckets"]:
        if not isinstance(entry, list) or len(entry) != len(LAYOUT) + 2:
            raise bad(f"a trust bucket must be [{len(LAYOUT)} ints, hits, trials], got {entry!r}")
        key, (h, t) = tuple(entry[:len(LAYOUT)]), entry[len(LAYOUT):]
        if not is_bucket(key) or key in out:
            raise bad(f"trust bucket {list(key)!r} is not a bucket, or comes twice")
        if _count(h) is None or _count(t) is None \
                or not 0.0 <= h <= t <= TRUST_WINDOW or t <= 0.0:
            raise bad(f"trust bucket {list(key)!r}: hits {h!r} and trials {t!r} must satisfy "
                      f"0 <= hits <= trials <= {TRUST_WINDOW:g}, trials > 0")
        out[key] = [float(h), float(t)]
    return out


#: How deep a header's JSON may nest (save writes 4 levels: the trust's buckets).
_MAX_HEADER_DEPTH = 16
#: A string (to its closing quote, or to the end if it has none: either way
#: a match, so nothing is tried again from a later quote) or a bracket.
_JSON_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def _json_depth(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in ``text``
    (brackets inside strings do not count), found without parsing, in time
    linear in its length."""
    depth = deepest = 0
    for match in _JSON_STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif token == "]" or token == "}":
            depth -= 1
    return deepest


def _file_path(path: Any) -> str:
    """``path`` (a str, bytes or os.PathLike) as a str; TypeError or
    ValueError naming ``path`` for anything else, or a NUL in it."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path: expected a str, bytes or os.PathLike, got {type(path).__name__}")
    path = os.fsdecode(os.fspath(path))
    if not path or "\0" in path:
        raise ValueError(f"path: expected a file path (not empty, no NUL character), got {path!r}")
    return path


def _read_file(path: str, bad: Callable[[str], ValueError]
               ) -> Tuple[dict, "_FileSettings", array.array, array.array]:
    """A corpus file's header, its settings, its sequence lengths and its
    token ids, each checked: ValueError via ``bad`` for a device, a pipe
    or a directory (opened without blocking, checked before any read), for
    a file larger than the format allows, for a header that is not a
    corpus file's, for a size other than the header says (checked before
    the body is read: a large file of another kind costs no memory), for a
    checksum that does not match, and for anything the header and body
    disagree on; also for a file that cannot be read."""
    def corrupt(what: str) -> ValueError:  # (the header is read before the checksum that covers it)
        return bad(f"{what} (a corrupt file?)")

    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # (a folder opens; fdopen would refuse it naming the fd)
            raise bad("not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    size = info.st_size
    with f:
        if size > _MAX_FILE:
            raise bad(f"{size} bytes, more than any corpus file can hold")
        if size < _PREFIX.size + _DIGEST:
            raise bad(f"truncated: {size} bytes")
        prefix = _read_exactly(f, _PREFIX.size, bad)
        hlen = _check_prefix(prefix, size, bad)
        head = _read_exactly(f, hlen, bad)
        header = _parse_header(head, corrupt)
        settings = _FileSettings.of(header, corrupt)
        n_seq, n_tok, tb = settings.n_sequences, settings.n_tokens, settings.token_bytes
        want = _PREFIX.size + hlen + 4 * n_seq + tb * n_tok + _DIGEST
        if want != size:
            raise bad(f"sizes do not add up: the header says {n_seq} sequences and {n_tok} tokens of "
                      f"{tb} bytes ({want} bytes in all), the file has {size}: truncated or corrupt?")
        lengths = array.array(_typecode(4, signed=False), _read_exactly(f, 4 * n_seq, bad))
        tokens = array.array(_typecode(tb, signed=True), _read_exactly(f, tb * n_tok, bad))
        digest = _read_exactly(f, _DIGEST, bad)
        if _read_at_most(f, 1, bad):
            raise bad(f"longer than the {size} bytes it had when opened: changed while read?")
    check = hashlib.sha256(prefix)
    for part in (head, lengths, tokens):
        check.update(part)
    if check.digest() != digest:
        raise bad("checksum mismatch: the file is corrupt or truncated")
    if _BIG_ENDIAN:
        lengths.byteswap()
        tokens.byteswap()
    _check_sequences(lengths, tokens, settings, bad)
    return header, settings, lengths, tokens


def _read_at_most(f: Any, n: int, bad: Callable[[str], ValueError]) -> bytes:
    """The next ``n`` bytes of ``f``, fewer at its end: ValueError via
    ``bad`` if it cannot be read."""
    try:
        return f.read(n)
    except OSError as e:
        raise bad(f"cannot be read ({e.strerror or e})") from e


def _read_exactly(f: Any, n: int, bad: Callable[[str], ValueError]) -> bytes:
    """The next ``n`` bytes of ``f``: ValueError via ``bad`` if it ends
    first (the file shrank while read) or cannot be read."""
    data = _read_at_most(f, n, bad)
    if len(data) != n:
        raise bad(f"ended {n - len(data)} bytes early: changed while read?")
    return data


def _typecode(size: int, signed: bool) -> str:
    """The array typecode of integers of `size` bytes."""
    for code in ("bhilq" if signed else "BHILQ"):
        if array.array(code).itemsize == size:
            return code
    raise RuntimeError(f"no array typecode of {size} bytes")


def _pack(a: array.array, size: int, signed: bool) -> bytes:
    """An int64 array as little-endian integers of `size` bytes (the values fit)."""
    try:
        import numpy as np
    except ImportError:
        out = array.array(_typecode(size, signed), a)
        if _BIG_ENDIAN:
            out.byteswap()
        return out.tobytes()
    kind = "i" if signed else "u"
    return np.frombuffer(a, dtype=np.int64).astype(f"<{kind}{size}").tobytes()


def _max(a: array.array) -> int:
    if not len(a):
        return -1
    try:
        import numpy as np
    except ImportError:
        return max(a)
    return int(np.frombuffer(a, dtype=np.dtype(a.typecode)).max())


def _min(a: array.array) -> int:
    try:
        import numpy as np
    except ImportError:
        return min(a)
    return int(np.frombuffer(a, dtype=np.dtype(a.typecode)).min())


def _segments_used(lengths, max_tokens: int, segments: int) -> int:
    """The segments the C core makes of these sequences, added in order to
    an empty corpus (pld.h: a new one when there is none, the newest holds
    >= ceil(max_tokens / segments) tokens, or would pass max_tokens)."""
    target = -(-max_tokens // segments)
    used, newest = 0, 0
    for n in lengths:
        if used == 0 or newest >= target or newest + n > max_tokens:
            used, newest = used + 1, 0
        newest += n
    return used
