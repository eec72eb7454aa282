"""pld as vLLM's drafter: ``speculative_config={"model": "pld.vllm.Drafter",
"num_speculative_tokens": k}``.

vLLM builds ``Drafter(vllm_config)`` through its ``custom_class`` plug point
and calls :meth:`Drafter.propose` once a step with every running row. Each
request drafts from its own incremental C index (``pld.NgramIndex``): a step
extends it by the tokens accepted and looks up the suffix n-gram, at a cost
that does not grow with the context. Options come from
``additional_config["pld"]`` (``--additional-config '{"pld": {...}}'``):

    prompt_lookup_min, prompt_lookup_max   n-gram sizes (default 1, 3)
    adaptive      draft lengths from each request's acceptance (default
                  true: grow after a full accept, shrink and pause after
                  rejections, pld.draft_length); false: always k
    corpus        a pld.Corpus file to load at start (must exist)
    learn         add each finished request's output to the corpus
                  (default true when a corpus is given or saved)
    save_corpus   a path the corpus is written to (atomically) when it has
                  learned and ``save_every`` seconds (default 5) have passed
                  since the last save, and when the drafter closes
    corpus_max_tokens   size of a new corpus (default 1 << 22)

Rows carry no request ids and vLLM moves them between steps (finished
requests leave, rows are condensed, preempted requests come back elsewhere),
so a request is recognised by its tokens, never by its row: every step a
row's tokens are checked against the state last seen there (its first and
last tokens and a rolling window that covers the whole context every few
hundred tokens), and a row that fails is matched in full against the states
held, or gets a fresh index. States no row uses go to a bounded pool (for
preempted requests), their outputs to the corpus. Everything depends on the
step's inputs alone, so every tensor-parallel rank drafts the same tokens.
Drafts never change vLLM's output: it verifies them.
"""
from __future__ import annotations

import atexit
import logging
import os
import struct
import time
import weakref
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import _core
from ._core import _first_unequal_span
from .config import check_size
from .draft_length import DraftLength

logger = logging.getLogger("pld")

HEAD = 16  # tokens keyed on and checked at the start of a row
TAIL = 32  # tokens checked at the end of what a state holds
WINDOW = 256  # tokens of the rolling check a step
OPTIONS = {"prompt_lookup_min", "prompt_lookup_max", "adaptive", "corpus", "learn", "save_corpus",
           "save_every", "corpus_max_tokens"}


class DrafterOptions:
    """The validated options (ValueError/TypeError naming the option)."""

    def __init__(self, k: Any, max_model_len: int, raw: Any) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise TypeError(f"additional_config['pld'] must be a dict, got {type(raw).__name__}")
        unknown = sorted(set(raw) - OPTIONS)
        if unknown:
            raise ValueError(f"additional_config['pld']: unknown option(s) {unknown}; known: {sorted(OPTIONS)}")
        self.k = check_size("num_speculative_tokens", k, 1, _core.MAX_DRAFT)
        self.max_model_len = check_size("max_model_len", max_model_len, 1, 1 << 40)
        self.min_n = check_size("prompt_lookup_min", raw.get("prompt_lookup_min", 1), 1, _core.MAX_NGRAM)
        self.max_n = check_size("prompt_lookup_max", raw.get("prompt_lookup_max", 3), 1, _core.MAX_NGRAM)
        if self.min_n > self.max_n:
            raise ValueError(f"prompt_lookup_min ({self.min_n}) must not exceed prompt_lookup_max ({self.max_n})")
        self.adaptive = _bool("adaptive", raw.get("adaptive", True))
        self.corpus = _path("corpus", raw.get("corpus"))
        self.save_corpus = _path("save_corpus", raw.get("save_corpus"))
        self.learn = _bool("learn", raw.get("learn", self.corpus is not None or self.save_corpus is not None))
        self.save_every = _seconds("save_every", raw.get("save_every", 5.0))
        self.corpus_max_tokens = check_size("corpus_max_tokens", raw.get("corpus_max_tokens", 1 << 22), 1,
                                      _core.CORPUS_MAX_TOKENS)
        if self.corpus is not None and not os.path.isfile(self.corpus):
            raise ValueError(f"additional_config['pld']['corpus']: no such file: {self.corpus!r}")


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"additional_config['pld']['{name}'] must be true or false, got {value!r}")
    return value


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"additional_config['pld']['{name}'] must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _path(name: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TypeError(f"additional_config['pld']['{name}'] must be a file path, got {value!r}")
    return value


class _Request:
    """One request's drafting state: its index, a copy of its tokens (for
    recognition), where its output starts, and its draft length.

    ``held`` is exactly the bytes of the first ``n`` tokens (``size`` bytes
    each, of ``dtype``, as the token array holds them); a step's checks
    compare spans of it with the same spans of the row in one C call
    (``_core._first_unequal_span``: a memcmp each), and a step's token is
    read as an int, so the step builds no array."""

    __slots__ = ("index", "held", "size", "dtype", "pack", "n", "prompt", "cursor", "length", "proposed",
                 "key")

    def __init__(self, tokens: np.ndarray, i: int, n: int, prompt: int, options: DrafterOptions,
                 pack: Any) -> None:
        self.index = _core.NgramIndex(options.max_n, options.min_n, "first", seed=0)
        self.held = bytearray()
        self.size = tokens.itemsize
        self.dtype = tokens.dtype
        self.pack = pack  # an id -> its bytes in the token array
        self.n = 0
        self.prompt = prompt
        self.cursor = 0
        self.length = DraftLength(options.k, adaptive=options.adaptive)
        self.proposed = 0
        self.key = b""
        self.append(tokens, i, n)

    @property
    def tokens(self) -> np.ndarray:
        """A copy of the tokens held."""
        return np.frombuffer(bytes(self.held), dtype=self.dtype)

    def append(self, tokens: np.ndarray, i: int, n: int) -> None:
        """Take tokens[i, self.n:n] (the tokens accepted since the last step)."""
        a = self.n
        if n - a == 1:  # the usual step: one token, as an int
            token = tokens.item(i, a)
            self.held += self.pack(token)
            self.index.extend(token)
        else:
            new = tokens[i, a:n]
            self.held += memoryview(new)  # (bytes: an array would add as an array)
            self.index.extend(new)
        self.n = n

    def truncate(self, n: int) -> None:
        """Keep the first n tokens; the drafts' history starts again (a
        request that shares them, or lost tokens, drafts as a fresh one
        would, so that a seeded request repeats)."""
        self.index.truncate(n)
        del self.held[n * self.size:]
        self.n = n
        self.cursor = 0
        self.prompt = min(self.prompt, n)
        self.length = DraftLength(self.length.k, adaptive=self.length.adaptive)
        self.proposed = 0

    def seems(self, tokens: np.ndarray, at: int, limit: int) -> bool:
        """Whether the row starting at flat index ``at`` of ``tokens``
        (``limit`` tokens, 0 <= limit <= the row's width) still looks like
        this request: its head and the tail of what is held, then (the
        cursor moving on) the next rolling window."""
        m = self.n if self.n < limit else limit
        c = self.cursor if self.cursor < m else 0
        e = c + WINDOW if c + WINDOW < m else m
        unequal = _first_unequal_span(self.held, tokens, at, self.size, 0, m if m < HEAD else HEAD,
                                      m - TAIL if m > TAIL else 0, m, c, e)
        if unequal < 2:  # the head or the tail differs
            return False
        self.cursor = e
        return unequal == 3

    def is_prefix_of(self, tokens: np.ndarray, at: int, limit: int) -> bool:
        """Whether the tokens held are exactly the first n of the row at
        ``at`` (n <= limit <= the row's width)."""
        return self.n <= limit and _first_unequal_span(self.held, tokens, at, self.size, 0, self.n) == 1

    def output(self) -> List[int]:
        return np.frombuffer(self.held[self.prompt * self.size:], dtype=self.dtype).tolist()


class Drafter:
    """vLLM's ``custom_class`` drafter: ``Drafter(vllm_config)``, then
    :meth:`propose` each step (see the module's docstring). Raises
    ValueError/TypeError at engine start for bad options or a corpus file
    that is missing, corrupt, or from another vocabulary."""

    def __init__(self, vllm_config: Any) -> None:
        extra = getattr(vllm_config, "additional_config", None) or {}
        if not isinstance(extra, dict):
            raise TypeError(f"additional_config must be a dict, got {type(extra).__name__}")
        model = vllm_config.model_config
        self.options = DrafterOptions(vllm_config.speculative_config.num_speculative_tokens,
                                      model.max_model_len, extra.get("pld"))
        self.pool_size = max(1, int(getattr(vllm_config.scheduler_config, "max_num_seqs", 256)))
        self.rows: Dict[int, _Request] = {}  # row -> the request last seen there
        self.keys: Dict[bytes, List[_Request]] = {}  # head tokens -> requests held
        self.pool: "OrderedDict[int, _Request]" = OrderedDict()  # requests in no row, oldest first
        self.corpus = _open_corpus(self.options, model)
        self._closed = False
        self._saved_at: Optional[float] = None
        self._dtype: Optional[np.dtype] = None  # of the token arrays the states were read from
        self._pack: Any = None  # an id -> its bytes in such an array
        self._array: Optional[np.ndarray] = None  # the token array last checked, if read as it is
        atexit.register(_close_at_exit, weakref.ref(self))

    # ------------------------------------------------------------- the step

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> List[List[int]]:
        """One draft (a list of ids, maybe empty) per row of
        ``sampled_token_ids``: row i holds ``token_ids_cpu[i,
        :num_tokens_no_spec[i]]``; a row with no token sampled this step
        (a prefill in progress) gets none. Drafts are optional: should
        drafting itself fail, the step goes on without drafts (an error on
        the "pld" logger) and every request starts a fresh index."""
        try:
            lengths = np.asarray(num_tokens_no_spec[:len(sampled_token_ids)]).tolist()
            tokens = token_ids_cpu
            if tokens is not self._array or tokens.dtype is not self._dtype:
                tokens = self._readable(tokens)
            width = tokens.shape[1]  # row i starts at flat index i * width
            claimed = self._recognise(tokens, lengths, width)
            drafts = []
            max_len = self.options.max_model_len
            draft = self._draft
            for i, sampled in enumerate(sampled_token_ids):
                n = lengths[i]
                if not sampled or n >= max_len:
                    drafts.append([])
                    continue
                if not 0 <= n <= width:
                    raise ValueError(f"num_tokens_no_spec[{i}] is {n}, outside the row's {width} tokens")
                state = claimed.get(i)
                if state is None:
                    state = claimed[i] = self._find(tokens, i, i * width, n, claimed) or \
                        _Request(tokens, i, n, n - len(sampled), self.options, self._pack)
                if state.proposed:  # how the last draft fared
                    accepted = len(sampled) - 1
                    state.length.update(state.proposed, accepted if accepted < state.proposed else state.proposed)
                    state.proposed = 0
                if n > state.n:  # the tokens accepted
                    state.append(tokens, i, n)
                elif n < state.n:  # tokens vLLM discarded
                    state.truncate(n)
                if n < HEAD or len(state.key) < HEAD * state.size:  # the key: tokens[:min(HEAD, n)]
                    self._key(state)
                drafts.append(draft(state, n))
            if claimed != self.rows:  # (the states compare by identity)
                self._release(claimed)
            return drafts
        except Exception:  # noqa: BLE001 - the served tokens never depend on a draft
            logger.exception("pld: drafting failed; this step goes on without drafts")
            self.rows, self.keys, self.pool = {}, {}, OrderedDict()
            self._array = None
            return [[] for _ in sampled_token_ids]

    def _recognise(self, tokens: np.ndarray, lengths: List[int], width: int) -> Dict[int, _Request]:
        """The rows whose state last seen there still matches (also a row
        with nothing sampled this step: a prefill in progress)."""
        claimed: Dict[int, _Request] = {}
        count = len(lengths)
        for i, state in self.rows.items():
            if i < count and 0 <= lengths[i] <= width and state.seems(tokens, i * width, lengths[i]):
                claimed[i] = state
        return claimed

    def _readable(self, array: Any) -> np.ndarray:
        """The token array as the states read it: [rows, width] native
        integers, C-contiguous (a copy otherwise: vLLM's is). The states
        hold bytes of one dtype: another drops them, as a failed step does.
        An array already so is remembered: while the same one comes back
        (vLLM passes the same array every step), only its dtype is checked."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"token_ids_cpu: expected a NumPy array, got {type(array).__name__}")
        tokens = array
        if tokens.dtype.kind not in "iu" or tokens.ndim != 2:
            raise TypeError(f"token_ids_cpu: expected a [rows, width] array of integer ids, got "
                            f"{tokens.ndim} dimensions of {tokens.dtype}")
        if not tokens.dtype.isnative or not tokens.flags.c_contiguous:
            tokens = np.ascontiguousarray(tokens, dtype=tokens.dtype.newbyteorder("="))
        if tokens.dtype != self._dtype:
            pack = struct.Struct(tokens.dtype.char)  # the C type NumPy names, as struct names it
            if pack.size != tokens.itemsize:
                raise TypeError(f"token_ids_cpu: {tokens.dtype} ids cannot be packed as {tokens.dtype.char!r}")
            if self._dtype is not None:
                self.rows, self.keys, self.pool = {}, {}, OrderedDict()
            self._pack = pack.pack
        self._dtype = tokens.dtype
        self._array = array if tokens is array else None
        return tokens

    def _find(self, tokens: np.ndarray, i: int, at: int, n: int, claimed: Dict[int, _Request]
              ) -> Optional[_Request]:
        """The longest state held whose tokens are exactly a prefix of row
        i, that no other row has claimed (checked in full: this runs only
        for a new, moved or resumed request)."""
        taken = {id(s) for s in claimed.values()}
        best = None
        for state in self.keys.get(tokens[i, :min(HEAD, n)].tobytes(), ()):
            if id(state) not in taken and state.is_prefix_of(tokens, at, n) and (best is None or state.n > best.n):
                best = state
        if best is not None:
            self.pool.pop(id(best), None)
        return best

    def _draft(self, state: _Request, n: int) -> List[int]:
        want = state.length.next()
        if want > self.options.max_model_len - n:
            want = self.options.max_model_len - n
        if want <= 0:
            return []
        draft = state.index.propose(want)
        if not draft and self.corpus is not None and len(self.corpus):
            size = state.size
            context = np.frombuffer(state.held[max(0, n - self.corpus.max_ngram_size) * size:n * size],
                                    dtype=state.dtype)
            draft = best_chain(*self.corpus.propose_tree(context, want))
        state.proposed = len(draft)
        return draft

    # ------------------------------------------------------ states and keys

    def _key(self, state: _Request) -> None:
        """File the state under its head tokens (again, while it has fewer
        than HEAD)."""
        key = bytes(state.held[:min(HEAD, state.n) * state.size])
        if key == state.key:
            return
        self._unkey(state)
        state.key = key
        self.keys.setdefault(key, []).append(state)

    def _unkey(self, state: _Request) -> None:
        bucket = self.keys.get(state.key)
        if bucket is not None:
            bucket[:] = [s for s in bucket if s is not state]
            if not bucket:
                del self.keys[state.key]

    def _release(self, claimed: Dict[int, _Request]) -> None:
        """Requests in no row now go to the pool (a preempted one comes
        back), their outputs to the corpus; the pool keeps the newest."""
        kept = {id(s) for s in claimed.values()}
        learned = False
        for state in self.rows.values():
            if id(state) not in kept and id(state) not in self.pool:
                self.pool[id(state)] = state
                if self.corpus is not None and self.options.learn:
                    learned = self.corpus.offer(state.output()) or learned
        self.rows = claimed
        if learned and (self._saved_at is None or time.monotonic() - self._saved_at >= self.options.save_every):
            self._save()
        while len(self.pool) > self.pool_size:
            _, state = self.pool.popitem(last=False)
            self._unkey(state)

    @property
    def num_requests(self) -> int:
        """Requests held: in a row, or in the pool."""
        return len({id(s) for bucket in self.keys.values() for s in bucket})

    def close(self) -> None:
        """Save the corpus where ``save_corpus`` says (once; also at exit)."""
        if self._closed:
            return
        self._closed = True
        self._save()

    def _save(self) -> None:
        """Write the corpus to ``save_corpus`` (if asked); a failure warns."""
        if self.corpus is not None and self.options.save_corpus is not None:
            self._saved_at = time.monotonic()  # (a time only decides when to write, never a draft)
            try:
                self.corpus.save(self.options.save_corpus)
            except OSError as error:  # the served outputs stand
                logger.warning("pld: could not save the corpus to %r (%s)", self.options.save_corpus, error)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's hook for drafters with weights: pld has none."""


def _close_at_exit(ref: "weakref.ref[Drafter]") -> None:
    drafter = ref()
    if drafter is not None:
        drafter.close()


def best_chain(tokens: Sequence[int], parents: Sequence[int], depths: Sequence[int],
               ngrams: Sequence[int], supports: Sequence[int]) -> List[int]:
    """The tokens of the path of a draft trie (Corpus.propose_tree's result)
    that follows the most supported child at each node (the first on ties):
    pld.drafts.base.best_chain."""
    from .drafts.base import best_chain as best
    from .token_tree import TokenTree

    return best(TokenTree(tokens, parents, depths, ngrams, supports)).tokens


def _open_corpus(options: DrafterOptions, model: Any) -> Any:
    """The corpus the options ask for, bound to the model's vocabulary
    (ValueError naming the file if it holds ids of another)."""
    if options.corpus is None and not options.learn and options.save_corpus is None:
        return None
    from .corpus import Corpus, model_signature

    if options.corpus is not None:
        corpus = Corpus.load(options.corpus)
    else:
        corpus = Corpus(options.corpus_max_tokens)
    vocab = int(model.get_vocab_size())
    try:
        corpus.bind(vocab, model_signature(vocab, getattr(model, "hf_config", None)))
    except ValueError as error:
        raise ValueError(f"additional_config['pld']['corpus'] ({options.corpus!r}): {error}") from None
    return corpus
