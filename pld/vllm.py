"""pld as vLLM's drafter: ``speculative_config={"model": "pld.vllm.Drafter",
"num_speculative_tokens": k}``.

vLLM builds ``Drafter(vllm_config)`` through its ``custom_class`` plug point
and calls :meth:`Drafter.propose` once a step with every running row. Each
request drafts from its own incremental C index (``pld.NgramIndex``): a step
extends it by the tokens accepted and looks up the suffix n-gram, at a cost
that does not grow with the context; the newest valid occurrences of the
match (``voters`` of them) vote on the draft, token by token. Options come from
``additional_config["pld"]`` (``--additional-config '{"pld": {...}}'``):

    prompt_lookup_min, prompt_lookup_max   n-gram sizes (default 1, 3)
    voters        how many of the newest valid occurrences of the matched
                  n-gram vote on a draft, token by token (1 to 16, default
                  16; 1: what followed the newest one)
    adaptive      true (default): each step, the draft tokens whose
                  expected gain pays for the time they add to vLLM's step,
                  both learned while serving (pld.vllm_budget), so drafts
                  depend on what the engine learned; "request": each
                  request's own schedule (pld.draft_length: grow after a
                  full accept, shrink and pause after rejections), so a
                  request's drafts depend on its tokens alone, as a seeded
                  sampled request needs to repeat; false: every draft as
                  long as the match allows, up to k
    verify_cost   "learned" (the default on one rank) or a number s >= 0:
                  a step with w - 1 draft tokens costs 1 + s (w - 1) steps
                  without (no clock read; the default, 0.05, where vLLM
                  runs more than one rank)
    corpus        a pld.Corpus file to load at start (it must exist, unless
                  it is also ``save_corpus``: a first run starts empty)
    learn         add each finished request's output to the corpus
                  (default true when a corpus is given or saved): at the
                  step that samples the model's end-of-sequence id, else
                  (max_tokens, a stop string) at the first step without it,
                  or when the drafter closes
    save_corpus   a path the corpus is written to (atomically) within
                  ``save_every`` seconds (default 5) of its learning, by a
                  timer if no step comes, and when the drafter closes; by
                  tensor-parallel rank 0 alone, and by data-parallel
                  engine i > 0 to ``save_corpus + ".dp<i>"``
    corpus_max_tokens   size of a new corpus (default 1 << 22; a loaded one
                  keeps its file's, with a warning where they differ)

Rows carry no request ids and vLLM moves them between steps (finished
requests leave, rows are condensed, preempted requests come back elsewhere),
so a request is recognised by its tokens, never by its row: every step a
row is checked against the state last seen there (it must have grown by
exactly the ids sampled, and match in its first and last tokens and a
rolling window that covers the whole context every few hundred tokens),
and a row that fails is matched in full against the states held, or gets
a fresh index. States no row uses go to a bounded pool (for
preempted requests), their outputs to the corpus. A step in which every
row is still the request last seen there runs in one C call
(``_core.draft_rows``: the check, how each last draft fared, the new
tokens, the lookup), the budget's choice in Python, and the cut in C
(``_core.send_drafts``); any other step, or a row that needs what only
Python does (a corpus lookup, a key), takes the Python path,
which drafts the same. Everything depends on the
step's inputs alone, so every tensor-parallel rank drafts the same tokens.
Drafts never change vLLM's output: it verifies them.
"""
from __future__ import annotations

import atexit
import logging
import os
import stat
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from . import _core
from .acceptance_buckets import CORPUS, NGRAM_BUCKETS, ROW, SUPPORT_BUCKETS
from .config import check_size, eos_at, eos_ids
from .draft_length import DraftLength
from .vllm_budget import Candidate, StepBudget

logger = logging.getLogger("pld")

#: Tokens keyed on and checked at the start of a row; checked at the end of
#: what a state holds; of the rolling check a step (the C step's).
HEAD, TAIL, WINDOW = _core.DRAFT_CHECK
OPTIONS = {"prompt_lookup_min", "prompt_lookup_max", "voters", "adaptive", "verify_cost", "corpus", "learn",
           "save_corpus", "save_every", "corpus_max_tokens"}
#: The longest a save timer waits (seconds: a year; a longer save_every is
#: as good as never, and a thread cannot wait for much longer).
SAVE_WAIT_MAX = 365 * 86400.0
#: The default of ``voters``: the newest valid occurrences of the matched
#: n-gram that vote on a row's draft, token by token
#: (pld.NgramIndex(voters=)). On the fit set's replays (Spec-Bench
#: summarization and rag, prompts 1-14 and 41-54) 16 gave 2.0-2.5% more
#: tokens per unit of step cost on summarization and 0.8-1.6% on rag than
#: the newest occurrence alone, and more than 4 or 8 did.
VOTERS = _core.MAX_VOTERS
#: verify_cost where vLLM runs several ranks and it is not given: a fixed
#: cost, so that every rank drafts the same tokens without reading a clock.
MULTI_RANK_VERIFY_COST = 0.05


class DrafterOptions:
    """The validated options (ValueError/TypeError naming the option)."""

    def __init__(self, k: Any, max_model_len: int, raw: Any, ranks: int = 1) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise TypeError(f"additional_config['pld'] must be a dict, got {type(raw).__name__}")
        unknown = sorted(set(raw) - OPTIONS, key=repr)  # (keys of any type: the Python API takes them)
        if unknown:
            raise ValueError(f"additional_config['pld']: unknown option(s) {unknown}; known: {sorted(OPTIONS)}")
        self.k = check_size("num_speculative_tokens", k, 1, _core.MAX_DRAFT)
        self.max_model_len = check_size("max_model_len", max_model_len, 1, 1 << 40)
        self.min_n = check_size("prompt_lookup_min", raw.get("prompt_lookup_min", 1), 1, _core.MAX_NGRAM)
        self.max_n = check_size("prompt_lookup_max", raw.get("prompt_lookup_max", 3), 1, _core.MAX_NGRAM)
        if self.min_n > self.max_n:
            raise ValueError(f"prompt_lookup_min ({self.min_n}) must not exceed prompt_lookup_max ({self.max_n})")
        self.voters = check_size("voters", raw.get("voters", VOTERS), 1, _core.MAX_VOTERS)
        self.adaptive = raw.get("adaptive", True)
        if not (isinstance(self.adaptive, bool) or self.adaptive == "request"):
            raise ValueError(f"additional_config['pld']['adaptive'] must be true, false or \"request\", "
                             f"got {self.adaptive!r}")
        self.verify_cost = _verify_cost(raw.get("verify_cost", "learned" if ranks <= 1 else MULTI_RANK_VERIFY_COST))
        self.corpus = _path("corpus", raw.get("corpus"))
        self.save_corpus = _path("save_corpus", raw.get("save_corpus"))
        self.learn = _bool("learn", raw.get("learn", self.corpus is not None or self.save_corpus is not None))
        self.save_every = _seconds("save_every", raw.get("save_every", 5.0))
        self.corpus_max_tokens = check_size("corpus_max_tokens", raw.get("corpus_max_tokens", 1 << 22), 1,
                                      _core.CORPUS_MAX_TOKENS)
        if self.corpus is not None and not os.path.exists(self.corpus) and self.save_corpus is not None \
                and os.path.abspath(self.corpus) == os.path.abspath(self.save_corpus):
            logger.info("pld: no corpus at %r yet: the drafter starts with an empty one and saves it there",
                        self.corpus)
            self.corpus = None  # (a first run: learn stays on, as for save_corpus alone)
        if self.corpus is not None and not os.path.isfile(self.corpus):
            what = "not a regular file" if os.path.exists(self.corpus) else "no such file"
            raise ValueError(f"additional_config['pld']['corpus']: {what}: {self.corpus!r}")
        #: whether corpus_max_tokens was given (a loaded corpus keeps its file's size)
        self.corpus_max_tokens_given = "corpus_max_tokens" in raw
        if self.save_corpus is not None:
            _check_writable("save_corpus", self.save_corpus)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"additional_config['pld']['{name}'] must be true or false, got {value!r}")
    return value


def _verify_cost(value: Any) -> Optional[float]:
    """None for "learned", else the fixed slope."""
    if isinstance(value, str) and value == "learned":
        return None
    number = _finite(value)
    if number is None:
        raise ValueError(f"additional_config['pld']['verify_cost'] must be \"learned\" or a number >= 0, "
                         f"got {value!r}")
    return number


def _seconds(name: str, value: Any) -> float:
    number = _finite(value)
    if number is None:
        raise ValueError(f"additional_config['pld']['{name}'] must be a number of seconds >= 0, got {value!r}")
    return number


def _finite(value: Any) -> Optional[float]:
    """``value`` as a float if it is an int or float (not a bool), >= 0
    and finite as a float (an int too large for one is not); else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if 0 <= number < float("inf") else None


def _check_writable(name: str, path: str) -> None:
    """A file can be written at ``path`` (checked at start, not first
    found at a save): not a folder, in a folder that exists and takes new
    files (a link's: a save writes the file it names)."""
    folder = os.path.dirname(os.path.realpath(path))
    if os.path.isdir(path):
        raise ValueError(f"additional_config['pld']['{name}']: {path!r} is a folder, not a file path")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"additional_config['pld']['{name}']: {path!r} is not a regular file (a save replaces it)")
    if not os.path.isdir(folder):
        raise ValueError(f"additional_config['pld']['{name}']: no such folder: {folder!r}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"additional_config['pld']['{name}']: cannot write in {folder!r}")
    if os.path.exists(path) and not _may_replace(path, folder):
        raise ValueError(f"additional_config['pld']['{name}']: {path!r} belongs to another user in a "
                         f"folder that lets only a file's owner replace it (sticky, as /tmp)")


def _may_replace(path: str, folder: str) -> bool:
    """Whether this process may rename a file over ``path``: in a sticky
    folder only the file's owner, the folder's, or root may."""
    if not hasattr(os, "geteuid"):
        return True
    euid = os.geteuid()
    held, within = os.stat(folder), os.stat(path)
    return not held.st_mode & stat.S_ISVTX or euid in (0, held.st_uid, within.st_uid)


def _path(name: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TypeError(f"additional_config['pld']['{name}'] must be a file path, got {value!r}")
    if "\0" in value:
        raise ValueError(f"additional_config['pld']['{name}']: a file path holds no NUL character, got {value!r}")
    return value


class _Request(_core.DraftState):
    """One request's drafting state: its index (which holds its tokens, and
    so recognises it too; ``n`` is its length), where its output starts,
    and its last draft (its bucket, length and predicted gain, until vLLM
    says what it kept); the fields the C step reads live in
    ``_core.DraftState``.

    A step reads the row in place, in the token array: in one C call for
    every row when all are the requests last seen there
    (``_core.draft_rows``), else one call checks spans of it against the
    tokens indexed (``seems``), one takes the tokens accepted and proposes
    (``NgramIndex.follow``)."""

    __slots__ = ("prompt", "length", "key", "learned")

    def __init__(self, n: int, prompt: int, options: DrafterOptions) -> None:
        index = _core.NgramIndex(options.max_n, options.min_n, "recent", seed=0, voters=options.voters)
        # room for its n tokens and as many more: the tables grow now, with the O(n) extend of its
        # first step, not in a later step (an output no longer than its context never grows one)
        index.reserve(min(2 * n, options.max_model_len))
        super().__init__(index)
        self.prompt = prompt
        self.length = DraftLength(options.k, adaptive=True) if options.adaptive == "request" else None
        self.key: Tuple[int, ...] = ()
        self.learned = prompt  # its tokens up to here are the prompt, or in the corpus

    def is_prefix_of(self, tokens: np.ndarray, at: int, limit: int) -> bool:
        """Whether the tokens held are exactly the first n of the row at
        ``at`` (n <= limit <= the row's width)."""
        return self.n <= limit and self.index.first_unequal(tokens, at, 0, self.n) == 1

    def unlearned(self) -> List[int]:
        """The output it holds that the corpus has not been offered."""
        return self.index.tokens()[self.learned:]


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
        parallel = getattr(vllm_config, "parallel_config", None)
        ranks = int(getattr(parallel, "tensor_parallel_size", 1) or 1) * \
            int(getattr(parallel, "pipeline_parallel_size", 1) or 1)
        self.options = DrafterOptions(vllm_config.speculative_config.num_speculative_tokens,
                                      model.max_model_len, extra.get("pld"), ranks)
        self.budget = StepBudget(self.options.k, self.options.verify_cost) if self.options.adaptive is True \
            else None
        self._all_decoding = False  # whether every row of the last step had a token sampled
        self.pool_size = max(1, int(getattr(vllm_config.scheduler_config, "max_num_seqs", 256)))
        self.rows: Dict[int, _Request] = {}  # row -> the request last seen there
        self.keys: Dict[bytes, List[_Request]] = {}  # head tokens -> requests held
        self.pool: "OrderedDict[int, _Request]" = OrderedDict()  # requests in no row, oldest first
        self.corpus = _open_corpus(self.options, model)
        self._learning = self.corpus is not None and self.options.learn
        #: the ids that end a request (its model's end-of-sequence ids), whose step learns its output
        self._stop = _stop_ids(model) if self._learning else ()
        self._stop_set = frozenset(self._stop)
        self._save_path = _save_path(self.options.save_corpus, parallel) if self.corpus is not None else None
        self._unsaved = False  # learned since the last save
        self._closed = False
        self._saved_at: Optional[float] = None
        self._timer: Optional[threading.Timer] = None  # a save due, when one is
        self._timer_lock = threading.Lock()  # (held briefly: the timer and _saved_at)
        self._write_lock = threading.Lock()  # one write at a time
        self._array: Optional[np.ndarray] = None  # the token array last checked, if read as it is
        self._dtype: Optional[np.dtype] = None  # and its dtype then
        self._in_order: Optional[List[_Request]] = None  # the states of rows 0, 1, ..., if each has one
        self._lengths: Any = None  # the num_tokens_no_spec array last read as it is
        self._k, self._max_len = self.options.k, self.options.max_model_len
        self._outcomes = self.budget.outcomes if self.budget is not None else None
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
            tokens = token_ids_cpu
            if tokens is not self._array or tokens.dtype is not self._dtype:
                tokens = self._readable(tokens)
            lost = None
            lengths = num_tokens_no_spec
            if lengths is not self._lengths or len(lengths) < len(sampled_token_ids):
                lengths = self._readable_lengths(lengths, len(sampled_token_ids))
            states = self._in_order
            if states is not None and len(states) == len(sampled_token_ids) and type(sampled_token_ids) is list:
                got = _core.draft_rows(states, tokens, tokens.shape[1], lengths, sampled_token_ids, self._k,
                                       self._max_len, self._outcomes, self.corpus is not None and len(self.corpus) > 0,
                                       self._stop)
                if type(got) is tuple:
                    drafts, candidates, corpus_rows, decoding, all_decoding, ended = got
                    if corpus_rows:
                        self._corpus_rows(corpus_rows, tokens, lengths, drafts, candidates)
                    if ended:  # (after every draft of the step, as in _step)
                        self._learn_ended(ended, states, tokens, lengths, sampled_token_ids)
                    same_rows = all_decoding and self._all_decoding
                    self._all_decoding = all_decoding
                    return self._drafts(states, drafts, candidates, decoding, same_rows)
                lost = got
            return self._step(sampled_token_ids, lengths, tokens, lost)
        except Exception:  # noqa: BLE001 - the served tokens never depend on a draft
            logger.exception("pld: drafting failed; this step goes on without drafts")
            self._start_afresh()
            return [[] for _ in sampled_token_ids]

    def _start_afresh(self) -> None:
        """After a failed step: every state is dropped (each request drafts
        from a fresh index from its next step on), the outputs of those in
        rows offered to the corpus first (if it learns)."""
        held = list(self.rows.values())
        self.rows, self.keys, self.pool = {}, {}, OrderedDict()
        self._array = self._in_order = self._lengths = None
        if self._learning:
            try:
                self._learn(held)
            except Exception:  # noqa: BLE001 - as the step's own failure: logged, and serving goes on
                logger.exception("pld: the outputs of the requests in rows could not be learned")

    def _learn_ended(self, rows: List[int], states: Any, tokens: np.ndarray, lengths: Any,
                     sampled: Sequence[Sequence[int]]) -> None:
        """Rows that sampled an end-of-sequence id this step (their
        requests end now, and vLLM says nothing more of them) offer the
        corpus their outputs at once, read from their rows, up to that id
        (the ids after it are vLLM's to drop; a request that ignores EOS
        goes on, and its next piece starts after them)."""
        learned = False
        for i in rows:
            state, n = states[i], int(lengths[i])
            start = max(0, n - len(sampled[i]))
            end = start + 1 + eos_at(tokens[i, start:n].tolist(), self._stop_set)
            if end > state.learned:
                learned = self.corpus.offer(tokens[i, state.learned:end].tolist()) or learned
            state.learned = max(state.learned, n)
        if learned:
            self._save_soon()

    def _corpus_rows(self, rows: List[int], tokens: np.ndarray, lengths: np.ndarray, drafts: List[Any],
                     candidates: List[Optional[Candidate]]) -> None:
        """The rows the C step found no match for (every row being the
        request last seen there) draft from the corpus."""
        for i in rows:
            n = int(lengths[i])
            drafts[i], candidates[i] = self._corpus_draft(tokens, i * tokens.shape[1], n,
                                                          min(self._k, self._max_len - n))

    def _step(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray, tokens: np.ndarray,
              lost: Optional[List[int]]) -> List[List[int]]:
        """The step where a row may hold another request than last seen
        (or needs what only Python does): rows are recognised (their check
        already made, if ``lost`` lists the rows that failed it), found
        again or given a fresh index, and drafted one by one."""
        lengths = num_tokens_no_spec[:len(sampled_token_ids)].tolist()
        width = tokens.shape[1]  # row i starts at flat index i * width
        claimed = self._recognise(tokens, lengths, width, sampled_token_ids) if lost is None else self._without(lost)
        all_decoding = all(sampled_token_ids)  # (the last step's time, if it served these same requests)
        same_rows = all_decoding and self._all_decoding and claimed is self.rows and len(claimed) == len(lengths)
        self._all_decoding = all_decoding
        states: List[Optional[_Request]] = []
        drafts: List[Any] = []
        candidates: List[Optional[Candidate]] = []
        ended: List[int] = []  # the rows that sampled an end-of-sequence id
        decoding = 0
        max_len = self.options.max_model_len
        taken: Optional[Set[int]] = None
        for i, sampled in enumerate(sampled_token_ids):
            n = lengths[i]
            if not sampled or n >= max_len:
                states.append(None)
                drafts.append(None)
                candidates.append(None)
                continue
            if not 0 <= n <= width:
                raise ValueError(f"num_tokens_no_spec[{i}] is {n}, outside the row's {width} tokens")
            at = i * width
            state = claimed.get(i)
            if state is None:
                if taken is None:  # (the states rows hold: once a step, then kept)
                    taken = {id(s) for s in claimed.values()}
                state = claimed[i] = self._find(tokens, i, at, n, taken) or \
                    _Request(n, n - len(sampled), self.options)
                taken.add(id(state))
            if state.proposed:  # how the last draft fared: unknown after a step vLLM did not show
                if n - state.n == len(sampled):
                    self._fared(state, len(sampled) - 1)
                else:
                    state.proposed = 0
            if state.n < HEAD or len(state.key) < HEAD:  # the key: the row's first min(HEAD, n)
                self._key(state, tokens, i, n)
            decoding += 1
            draft, candidate = self._follow(state, tokens, at, n)
            if self._stop and not self._stop_set.isdisjoint(tokens[i, max(0, n - len(sampled)):n].tolist()):
                ended.append(i)
            states.append(state)
            drafts.append(draft)
            candidates.append(candidate)
        if ended:  # (after every draft of the step: the C step's order)
            self._learn_ended(ended, states, tokens, lengths, sampled_token_ids)
        out = self._drafts(states, drafts, candidates, decoding, same_rows)
        if claimed is not self.rows:  # (new rows only join it)
            self._release(claimed)
        self._in_order = self._rows_in_order(len(lengths))
        return out

    def _fared(self, state: _Request, accepted: int) -> None:
        """vLLM kept ``accepted`` tokens of the request's last draft: the
        budget (or the request's own schedule) learns it (as
        ``_core.draft_rows`` does)."""
        accepted = accepted if accepted < state.proposed else state.proposed
        state.support = min(SUPPORT_BUCKETS, state.support + 1) if accepted == state.proposed else 1  # (streaks)
        if self.budget is not None:
            self.budget.accepted(state.candidate, state.proposed, accepted, state.predicted)
        elif state.length is not None:
            state.length.update(state.proposed, accepted)
        state.proposed = 0

    def _recognise(self, tokens: np.ndarray, lengths: List[int], width: int,
                   sampled: Sequence[Sequence[int]]) -> Dict[int, _Request]:
        """The rows whose state last seen there still matches: the row has
        grown by exactly the ids sampled this step (none in a prefill) and
        passes the check (``seems``). ``self.rows`` itself when every one
        does, so that no state has lost its row. A row of any other length
        holds another request (or ids vLLM discarded): it is matched in full
        (``_find``), never on the check's head, tail and window alone."""
        count = len(lengths)
        lost = []
        for i, state in self.rows.items():  # (a loop: no comprehension to build a step)
            if not (i < count and 0 <= lengths[i] <= width and lengths[i] - state.n == len(sampled[i])
                    and state.seems(tokens, i * width, lengths[i])):
                lost.append(i)
        return self._without(lost)

    def _without(self, lost: List[int]) -> Dict[int, _Request]:
        """The rows but those ``lost`` (``self.rows`` itself if none is)."""
        if not lost:
            return self.rows
        gone = set(lost)
        return {i: state for i, state in self.rows.items() if i not in gone}

    def _rows_in_order(self, count: int) -> Optional[List[_Request]]:
        """The states of rows 0 .. count - 1, if each has one: the next
        step can then run in C (``_core.draft_rows``)."""
        if self.options.adaptive == "request" or len(self.rows) != count:
            return None
        rows = self.rows
        return [rows[i] for i in range(count)] if all(i in rows for i in range(count)) else None

    def _readable(self, array: Any) -> np.ndarray:
        """The token array as the states read it: [rows, width] native
        integers, C-contiguous (a copy otherwise: vLLM's is). An array
        already so is remembered: while the same one comes back with the
        same dtype (vLLM passes the same array every step), it is read as
        it is."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"token_ids_cpu: expected a NumPy array, got {type(array).__name__}")
        tokens = array
        if tokens.dtype.kind not in "iu" or tokens.ndim != 2:
            raise TypeError(f"token_ids_cpu: expected a [rows, width] array of integer ids, got "
                            f"{tokens.ndim} dimensions of {tokens.dtype}")
        if not tokens.dtype.isnative or not tokens.flags.c_contiguous:
            tokens = np.ascontiguousarray(tokens, dtype=tokens.dtype.newbyteorder("="))
        self._array = array if tokens is array else None
        self._dtype = array.dtype
        return tokens

    def _readable_lengths(self, lengths: Any, rows: int) -> np.ndarray:
        """num_tokens_no_spec as the steps read it: a 1-D C-contiguous
        native integer array of at least ``rows`` lengths (a copy
        otherwise: vLLM's is one, and the same array every step, so it is
        remembered and then taken as it is); TypeError/ValueError naming
        it for anything else (floats are not cut to integers)."""
        if isinstance(lengths, np.ndarray) and lengths.dtype.kind in "iu" and lengths.ndim == 1 \
                and lengths.flags.c_contiguous and lengths.dtype.isnative:
            array = lengths
        else:
            try:
                array = np.asarray(lengths)
            except (TypeError, ValueError, OverflowError) as error:
                raise TypeError(f"num_tokens_no_spec: expected a 1-D array of integer lengths ({error})") from None
            if array.dtype.kind not in "iu" or array.ndim != 1:
                raise TypeError(f"num_tokens_no_spec: expected a 1-D array of integer lengths, got "
                                f"{array.ndim} dimensions of {array.dtype}")
            array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
        if len(array) < rows:
            raise ValueError(f"num_tokens_no_spec: {len(array)} lengths for {rows} rows of sampled_token_ids")
        if array is lengths:
            self._lengths = lengths
        return array

    def _find(self, tokens: np.ndarray, i: int, at: int, n: int, taken: Set[int]) -> Optional[_Request]:
        """A state held whose tokens are exactly a prefix of row i, that no
        row has claimed (``taken``: their ids), checked in full (this runs
        only for a new, moved or resumed request, or after a step vLLM did
        not show the drafter): the row's last state, if it is one (every
        row after such a step, whose requests share a system prompt: not a
        scan of them all a row), else the longest."""
        last = self.rows.get(i)
        if last is not None and id(last) not in taken and last.is_prefix_of(tokens, at, n):
            best: Optional[_Request] = last
        else:
            best = None
            for state in self.keys.get(_head(tokens, i, n), ()):
                if id(state) not in taken and (best is None or state.n > best.n) and state.is_prefix_of(tokens, at, n):
                    best = state
        if best is not None:
            self.pool.pop(id(best), None)
        return best

    def _drafts(self, states: Sequence[Optional[_Request]], drafts: Sequence[Any],
                candidates: Sequence[Optional[Candidate]], decoding: int, same_rows: bool) -> List[List[int]]:
        """Each row's draft: its chain (``drafts[i]``, of bucket
        ``candidates[i]``; None: none) cut to the length the budget gives
        it (``adaptive``), or its own schedule (``"request"``), or whole;
        the states whose drafts go out wait for vLLM's answer."""
        if self.budget is not None:
            chosen = self.budget.choose(candidates, decoding, same_rows)
        else:
            chosen = [(c[3] if s.length is None else min(c[3], s.length.length), 0.0) if c is not None else (0, 0.0)
                      for s, c in zip(states, candidates)]
        return _core.send_drafts(states, drafts, candidates, chosen)

    def _follow(self, state: _Request, tokens: np.ndarray, at: int, n: int) -> Tuple[List[int], Optional[Candidate]]:
        """The request takes its row's new tokens (the row starts at flat
        index ``at``; n of them now); then the longest draft its index (or,
        where it has no match, the corpus) holds, at most k and the room
        left, and its bucket (origin, n-gram, support, length); ([], None)
        if there is none (or the request's own schedule skips this step).
        A row's chain has support 1 + the request's last drafts accepted
        whole in a row, at most 3 (the bucket 3+; the index counts no occurrences;
        acceptance runs in streaks: a copy under way)."""
        options = self.options
        want = options.max_model_len - n
        if want > options.k:
            want = options.k
        if want < 0 or state.length is not None and not state.length.next():
            want = 0
        index = state.index
        draft = index.follow(tokens, at, n, want)  # the row's tokens [state.n, n), then the draft
        if draft:
            ngram = index.last_ngram
            return draft, (ROW, ngram if ngram < NGRAM_BUCKETS else NGRAM_BUCKETS - 1, state.support, len(draft))
        if not want or self.corpus is None or not len(self.corpus):
            return draft, None
        return self._corpus_draft(tokens, at, n, want)

    def _corpus_draft(self, tokens: np.ndarray, at: int, n: int, want: int
                      ) -> Tuple[List[int], Optional[Candidate]]:
        """The corpus's longest chain after the row's last tokens, at most
        ``want``, and its bucket; ([], None) if it has none."""
        context = tokens.reshape(-1)[at + max(0, n - self.corpus.max_ngram_size):at + n]
        chain = best_chain(*self.corpus.propose_tree(context, want))
        if not len(chain):
            return [], None
        return chain.tokens, (CORPUS, min(chain.ngrams[0], NGRAM_BUCKETS - 1),
                              min(chain.supports[0], SUPPORT_BUCKETS), len(chain))

    # ------------------------------------------------------ states and keys

    def _key(self, state: _Request, tokens: np.ndarray, i: int, n: int) -> None:
        """File the state of row i (n tokens, its own) under its head
        tokens (again, while it has fewer than HEAD)."""
        key = _head(tokens, i, n)
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
        gone = []
        for state in self.rows.values():
            if id(state) not in kept and id(state) not in self.pool:
                self.pool[id(state)] = state
                gone.append(state)
        self.rows = claimed
        if gone and self._learning:
            self._learn(gone)
        while len(self.pool) > self.pool_size:
            _, state = self.pool.popitem(last=False)
            self._unkey(state)

    @property
    def num_requests(self) -> int:
        """Requests held: in a row, or in the pool."""
        return len({id(s) for bucket in self.keys.values() for s in bucket})

    def _learn(self, states: Sequence[_Request]) -> None:
        """The requests offer the corpus the outputs they hold that it has
        not been offered (in the order given)."""
        learned = False
        for state in states:
            if state.n > state.learned:
                learned = self.corpus.offer(state.unlearned()) or learned
                state.learned = state.n
        if learned:
            self._save_soon()

    def _save_soon(self) -> None:
        """The corpus learned: it is saved (where this rank saves it, if
        anywhere) now if ``save_every`` seconds have passed since the last
        save, else by a timer when they have, whether or not another step
        comes (vLLM may stop the drafter's process without notice: ``vllm
        serve`` kills its workers)."""
        self._unsaved = True
        if self._save_path is None:
            return
        with self._timer_lock:
            if self._timer is not None:  # a save is due: it will hold this
                return
            wait = 0.0 if self._saved_at is None else self._saved_at + self.options.save_every - time.monotonic()
            if wait > 0:
                self._timer = threading.Timer(min(wait, SAVE_WAIT_MAX), _save_when_due, (weakref.ref(self),))
                self._timer.daemon = True  # (a process that exits saves in close, if at all)
                self._timer.start()
                return
        self._save()

    def close(self) -> None:
        """The requests still in rows offer the corpus their outputs, and
        the corpus is saved if it learned since the last save (once; also
        when vLLM drops the drafter, and at exit if the process exits
        normally)."""
        if self._closed:
            return
        self._closed = True
        if self._learning:
            self._learn(list(self.rows.values()))
        with self._timer_lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self._unsaved:
            self._save()

    def _save(self) -> None:
        """Write the corpus where this rank saves it (if anywhere; one
        write at a time, the newest last); a failure warns."""
        if self._save_path is not None:
            with self._timer_lock:
                self._timer = None  # (this write holds what a due one would)
                self._saved_at = time.monotonic()  # (a time only decides when to write, never a draft)
                self._unsaved = False
            with self._write_lock:  # (a step that learns meanwhile sets a timer: it never waits here)
                try:
                    self.corpus.save(self._save_path)
                except (OSError, ValueError) as error:  # the served outputs stand
                    self._unsaved = True
                    logger.warning("pld: could not save the corpus to %r (%s)", self._save_path, error)

    def __del__(self) -> None:
        # vLLM's worker drops its drafter as it shuts down, before the process
        # exits (atexit's weak reference, and a waiting save timer's, are dead
        # by then): the drafter closes as it goes
        if getattr(self, "_closed", True) is False:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - a finalizer raises to no one: say it
                logger.exception("pld: the drafter could not learn or save as it closed")

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's hook for drafters with weights: pld has none."""


def _head(tokens: np.ndarray, i: int, n: int) -> Tuple[int, ...]:
    """The key a request of row i (n tokens) is filed under: its first
    min(HEAD, n) ids, whatever the array's dtype."""
    return tuple(tokens[i, :min(HEAD, n)].tolist())


def _close_at_exit(ref: "weakref.ref[Drafter]") -> None:
    drafter = ref()
    if drafter is not None:
        drafter.close()


def _save_path(path: Optional[str], parallel: Any) -> Optional[str]:
    """Where this rank writes the corpus: ``path`` on tensor-parallel rank
    0 of data-parallel engine 0, ``path + ".dp<i>"`` on rank 0 of engine i
    (each engine serves, and learns, its own requests), nowhere on the
    other tensor-parallel ranks (they learn the same) or without a path."""
    if path is None:
        return None
    tensor = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    if int(getattr(parallel, "rank", 0) or 0) % tensor:
        return None
    engine = int(getattr(parallel, "data_parallel_index", 0) or 0)
    return path if engine == 0 else f"{path}.dp{engine}"


def _save_when_due(ref: "weakref.ref[Drafter]") -> None:
    """The save timer's work (in its own thread)."""
    drafter = ref()
    if drafter is not None:
        drafter._save()


def _stop_ids(model: Any) -> Tuple[int, ...]:
    """The ids that end a request of this model, as far as its configs
    say (its end-of-sequence ids, and its generation config's; at most
    _core.DRAFT_STOP_MAX): a step that samples one learns the request's
    output then. Anything unreadable gives none (the output is learned at
    a later step)."""
    found: List[Any] = []
    for config in (getattr(model, "hf_text_config", None), getattr(model, "hf_config", None)):
        found.append(getattr(config, "eos_token_id", None))
    try:
        found.append(model.try_get_generation_config().get("eos_token_id"))
    except Exception:  # noqa: BLE001 - an optional refinement
        pass
    ids: List[int] = []
    vocab = int(model.get_vocab_size())
    for value in found:
        try:
            given = eos_ids(value)
        except TypeError:  # (not ids: none from this config)
            continue
        for v in given:
            if 0 <= v < vocab and v not in ids:
                ids.append(v)
    return tuple(ids[:_core.DRAFT_STOP_MAX])


def best_chain(tokens: Sequence[int], parents: Sequence[int], depths: Sequence[int],
               ngrams: Sequence[int], supports: Sequence[int]) -> Any:
    """The path of a draft trie (Corpus.propose_tree's result) that follows
    the most supported child at each node (the first on ties), with its
    nodes' features: pld.drafts.base.best_chain."""
    from .drafts.base import best_chain as best
    from .token_tree import TokenTree

    return best(TokenTree(tokens, parents, depths, ngrams, supports))


def _open_corpus(options: DrafterOptions, model: Any) -> Any:
    """The corpus the options ask for, bound to the model's vocabulary
    (ValueError naming the file if it holds ids of another)."""
    if options.corpus is None and not options.learn and options.save_corpus is None:
        return None
    from .corpus import Corpus, model_signature

    if options.corpus is not None:
        try:
            corpus = Corpus.load(options.corpus)
        except (OSError, ValueError) as error:  # (unreadable, or not a corpus file)
            raise ValueError(f"additional_config['pld']['corpus']: {error}") from None
        if options.corpus_max_tokens_given and corpus.max_tokens != options.corpus_max_tokens:
            logger.warning("pld: corpus_max_tokens (%d) sizes a new corpus only: the one loaded from %r "
                           "keeps its file's max_tokens (%d)", options.corpus_max_tokens, options.corpus,
                           corpus.max_tokens)
    else:
        corpus = Corpus(options.corpus_max_tokens)
    vocab = int(model.get_vocab_size())
    try:
        corpus.bind(vocab, model_signature(vocab, getattr(model, "hf_config", None)))
    except ValueError as error:
        raise ValueError(f"additional_config['pld']['corpus'] ({options.corpus!r}): {error}") from None
    return corpus
