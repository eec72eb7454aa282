"""Type stubs of the C extension pld._core."""
from typing import Any, List, Optional, Sequence, Tuple, Union, overload

TokenIds = Any  # torch tensor [L] / [1, L], NumPy integer array, buffer, or sequence of ints
EosIds = Union[None, int, Sequence[int], Any]
DraftBuffer = Any  # writable contiguous 1-D int64/int32 array in CPU memory (NumPy, torch, array.array)

MAX_NGRAM: int
MAX_DRAFT: int  # the largest num_pred_tokens
MAX_TOKENS: int  # the most tokens an NgramIndex holds

class NgramIndex:
    def __init__(self, max_ngram_size: int = 3, min_ngram_size: int = 1, policy: str = "first",
                 *, seed: Optional[int] = None) -> None: ...
    def extend(self, tokens: Union[int, TokenIds]) -> None: ...
    @overload
    def propose(
        self,
        num_pred_tokens: int = 10,
        semantics: str = "seed",
        max_length: Optional[int] = None,
        eos_token_id: EosIds = None,
        out: None = None,
    ) -> List[int]: ...
    @overload
    def propose(
        self,
        num_pred_tokens: int = 10,
        semantics: str = "seed",
        max_length: Optional[int] = None,
        eos_token_id: EosIds = None,
        *,
        out: DraftBuffer,
    ) -> int: ...  # the draft is out[:n]; returns n
    def propose_tree(
        self, depth: int, per_ngram: int = 4, max_nodes: int = 64, eos_token_id: EosIds = None
    ) -> Tuple[List[int], List[int], List[int], List[int], List[int]]: ...
    def reserve(self, n: int) -> None: ...
    def truncate(self, n: int) -> None: ...
    def tokens(self) -> List[int]: ...
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

class Generator:
    def __init__(self, seed: Optional[int] = None) -> None: ...
    def random(self) -> float: ...

def _find_candidate(
    input_ids: TokenIds, max_ngram_size: int, num_pred_tokens: int, min_ngram_size: int,
    semantics: str, max_length: Optional[int], eos_token_id: EosIds, with_ids: bool = False,
) -> Union[Tuple[int, int], Tuple[int, int, List[int]]]: ...
def _ngram_tag(tokens: TokenIds, seed: int = 0) -> int: ...  # an n-gram's hash tag under a key (tests)
def _reseed_after_fork() -> None: ...
def accept_greedy(draft: TokenIds, chosen: TokenIds) -> Tuple[int, List[int]]: ...
def accept_greedy_logits(draft: TokenIds, logits: Any) -> Tuple[int, List[int]]: ...
def accept_sample(
    draft: TokenIds, probs: Any, *, generator: Optional[Generator] = None,
    uniforms: Optional[Sequence[float]] = None,
) -> Tuple[int, List[int]]: ...
