"""Type stubs of the C extension pld._core."""
from typing import Any, List, Optional, Sequence, Tuple, Union

# a sequence of ints; a 1-D C-contiguous integer buffer in native byte order
# (NumPy, array.array, memoryview); or a DLPack tensor [L] / [1, L] (torch)
TokenIds = Any
EosIds = Union[None, int, Sequence[int], Any]

MAX_NGRAM: int
MAX_VOTERS: int  # the most voters an NgramIndex takes
MAX_DRAFT: int  # the largest num_pred_tokens
MAX_TOKENS: int  # the most tokens an NgramIndex holds
CORPUS_MAX_TOKENS: int  # the largest Corpus max_tokens
CORPUS_MAX_SEGMENTS: int

class NgramIndex:
    def __init__(self, max_ngram_size: int = 3, min_ngram_size: int = 1, policy: str = "first",
                 *, seed: Optional[int] = None, voters: int = 1) -> None: ...
    def extend(self, tokens: Union[int, TokenIds], /) -> None: ...
    def propose(
        self,
        num_pred_tokens: int = 10,
        semantics: str = "seed",
        max_length: Optional[int] = None,
        eos_token_id: EosIds = None,
    ) -> List[int]: ...
    def propose_tree(
        self, depth: int, per_ngram: int = 4, max_nodes: int = 64, eos_token_id: EosIds = None
    ) -> Tuple[List[int], List[int], List[int], List[int], List[int]]: ...
    def propose_tree_after(
        self, context: TokenIds, depth: int, per_ngram: int = 4, max_nodes: int = 64,
        eos_token_id: EosIds = None,
    ) -> Tuple[List[int], List[int], List[int], List[int], List[int]]: ...
    def reserve(self, n: int, /) -> None: ...
    def truncate(self, n: int, /) -> None: ...
    def tokens(self) -> List[int]: ...
    def first_unequal(self, rows: TokenIds, at: int, /, *spans: int) -> int: ...
    def follow(self, rows: TokenIds, at: int, n: int, want: int, /) -> List[int]: ...
    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def policy(self) -> str: ...
    @property
    def hash_seed(self) -> int: ...
    @property
    def min_ngram_size(self) -> int: ...
    @property
    def max_ngram_size(self) -> int: ...
    @property
    def last_ngram(self) -> int: ...
    @property
    def voters(self) -> int: ...

DRAFT_CHECK: Tuple[int, int, int]  # pld.vllm's row check: (head, tail, window) tokens
DRAFT_STOP_MAX: int  # the most stop_ids draft_rows takes
DRAFT_BUCKETS: Tuple[int, int, int]  # (the row origin, n-gram buckets, support buckets)

Candidate = Tuple[int, int, int, int]  # (origin, n-gram bucket, support bucket, length)

class DraftState:
    """One request's drafting state in pld.vllm's drafter."""
    index: NgramIndex  # read-only
    cursor: int  # where the rolling check goes on
    proposed: int  # tokens of the last draft vLLM has not answered (0: none)
    support: int  # 1 + its last drafts accepted whole in a row, at most DRAFT_BUCKETS[2]
    predicted: float  # tokens the budget expected of that draft
    candidate: Optional[Candidate]  # that draft's bucket
    def __init__(self, index: NgramIndex) -> None: ...
    @property
    def n(self) -> int: ...  # tokens held: len(index)
    def seems(self, rows: TokenIds, at: int, limit: int, /) -> bool:
        """Whether the row of ``limit`` ids at flat index ``at`` of rows
        still looks like this request: its first DRAFT_CHECK[0] tokens and
        the last DRAFT_CHECK[1] it holds; then (the cursor moving on) the
        next rolling window of DRAFT_CHECK[2]."""

def draft_rows(states: List[DraftState], rows: TokenIds, width: int, lengths: TokenIds,
               sampled: List[List[int]], k: int, max_len: int, outcomes: Optional[list],
               corpus_ready: bool, stop_ids: Tuple[int, ...], /
               ) -> Union[List[int], Tuple[List[List[int]], List[Optional[Candidate]], List[int], int, bool,
                                           Optional[List[int]]]]:
    """One vLLM step of pld.vllm's drafter, row i of the batch being
    ``rows[i * width : i * width + lengths[i]]`` (``rows`` C-contiguous,
    ``lengths`` 1-D, both of integer ids) and ``states[i]`` its request
    last seen there.

    First every row is checked: it must hold its state's ids and exactly
    the ids sampled this step (``lengths[i] == states[i].n +
    len(sampled[i])``, ``sampled[i]`` a list) and pass ``seems`` (cursors
    moving on). If one fails, or is out of range, or needs the Python path
    (a decoding row whose state holds fewer than DRAFT_CHECK[0] ids),
    nothing else changes and the list of rows that failed is returned
    (maybe empty).

    Otherwise each decoding row (sampled non-empty, lengths[i] < max_len)
    learns how its last draft fared (``len(sampled[i]) - 1`` accepted:
    the support streak moves, and ((origin, ngram, support), proposed,
    accepted, predicted) goes to ``outcomes`` unless it is None), takes
    its new ids and proposes at most min(k, max_len - lengths[i]) tokens;
    the result is (drafts, candidates, corpus_rows, decoding rows, whether
    every row sampled, ended): a row not decoding has None and None, a
    decoding row without a draft [] and None and, if ``corpus_ready``, its
    number in corpus_rows; ended lists the decoding rows whose last
    ``len(sampled[i])`` ids hold one of ``stop_ids`` (an exact tuple of at
    most DRAFT_STOP_MAX ints: the ids that end a request), None if none do. The drafts
    are not yet
    pending: the caller sets ``proposed``, ``predicted`` and ``candidate``
    of the states whose drafts it sends (``send_drafts``).

    The arguments that can run Python code are converted first; the lists
    are then read with the garbage collector held off (and given back as
    it was), and the GIL is held throughout."""

def send_drafts(states: List[Optional[DraftState]], drafts: List[Optional[List[int]]],
                candidates: List[Optional[Candidate]], chosen: List[Tuple[int, float]], /) -> List[List[int]]:
    """The drafts vLLM gets: row i's ``drafts[i][:length]`` where
    ``chosen[i]`` is (length, predicted), [] where length is 0. A state
    whose draft goes out waits for vLLM's answer: its ``proposed``,
    ``predicted`` and ``candidate`` become length, predicted and
    ``candidates[i]``. Every row is checked first (TypeError/ValueError,
    nothing changed): a length > 0 needs a DraftState, a list of at least
    that many ids and a candidate."""

class Corpus:
    """A bounded set of token sequences with a flat-cost lookup; thread safe (pld.h, "Corpus")."""
    def __init__(self, max_tokens: int, min_ngram: int = 2, max_ngram: int = 4, segments: int = 4,
                 hash_seed: Optional[int] = None) -> None: ...
    def add(self, tokens: TokenIds, /) -> None: ...
    def propose_tree(
        self, context: TokenIds, depth: int, per_ngram: int = 4, max_nodes: int = 64,
        eos_token_id: EosIds = None,
    ) -> Tuple[List[int], List[int], List[int], List[int], List[int]]: ...
    def sequence(self, i: int, /) -> List[int]: ...
    def _export(self) -> Tuple[bytes, bytes, int]: ...  # native int64 (tokens, lengths), evicted: one snapshot
    def _bind_vocab(self, vocab_size: int, set: bool, /) -> int: ...  # the largest id held if >= vocab_size, else -1
    def clear(self) -> None: ...
    def __len__(self) -> int: ...  # tokens held (separators not counted)
    @property
    def num_sequences(self) -> int: ...
    @property
    def evicted(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def max_id(self) -> int: ...  # -1 when empty
    @property
    def segments_used(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def min_ngram(self) -> int: ...
    @property
    def max_ngram(self) -> int: ...
    @property
    def segments(self) -> int: ...
    @property
    def hash_seed(self) -> int: ...

def _find_candidate(
    input_ids: TokenIds, max_ngram_size: int, num_pred_tokens: int, min_ngram_size: int,
    semantics: str, max_length: Optional[int], eos_token_id: EosIds, with_ids: bool = False, /,
) -> Union[Tuple[int, int], Tuple[int, int, List[int]]]: ...
def _ngram_tag(tokens: TokenIds, seed: int = 0, /) -> int: ...  # an n-gram's hash tag under a key (tests)
def accept_greedy(
    tokens: TokenIds, choices: TokenIds, parents: Optional[TokenIds] = None,
) -> Tuple[List[int], List[int]]: ...
def accept_sample(
    tokens: TokenIds, probs: Any, uniforms: Sequence[float], parents: Optional[TokenIds] = None,
) -> Tuple[List[int], List[int]]: ...
