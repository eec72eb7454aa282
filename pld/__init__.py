"""pld: prompt lookup decoding with a C core.

The lookup (`find_candidate_pred_tokens`, `NgramIndex`) and the acceptance of
a draft (`accept_greedy`, `accept_greedy_logits`, `accept_sample`) run in C
on raw token buffers: torch tensors, NumPy arrays and lists, without copies
where the input is contiguous.
"""
from ._core import Generator, NgramIndex, accept_greedy, accept_greedy_logits, accept_sample
from .lookup import find_candidate_pred_tokens

__version__ = "0.1.0"

#: The match policies an NgramIndex offers (see csrc/pld.h).
POLICIES = ("first", "recent", "frequent")
#: The lookup semantics (see find_candidate_pred_tokens).
SEMANTICS = ("seed", "transformers")

__all__ = [
    "POLICIES",
    "SEMANTICS",
    "Generator",
    "NgramIndex",
    "accept_greedy",
    "accept_greedy_logits",
    "accept_sample",
    "find_candidate_pred_tokens",
]
