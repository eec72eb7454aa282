"""The layout of the acceptance model's buckets (pld.token_tree), apart
from torch so that pld.corpus, which keeps and saves what generations
learned per bucket, can check a bucket without it.

A node's bucket is (n-gram, support, depth, agreement) and its origin:

- n-gram: source 0 (the model's own successors, pld.successors; "support"
  is then the successor's rank 1, 2, 3+) or n-gram size 1, 2, 3+;
- support 1, 2, 3+; depth 1, 2, 3-4, 5-8, 9+ (DEPTH_EDGES);
- agreement with what the model last predicted after the tokens before it
  (pld.successors.SuccessorTable.agreement): PAIR_AGREES (the prediction
  after its grandparent and parent tokens is this node), TOKEN_AGREES (no
  such pair seen; the prediction after its parent token is), DISAGREES, or
  UNKNOWN (nothing remembered after its parent, or no table:
  tree_successors=False). A prompt-lookup node the model also predicted is
  accepted several times as often as one it did not;
- origin, where its text was found (each origin learns its own buckets,
  from the same prior): the row's own sequence or the model's guesses,
  another row of the batch with the same prompt (pld.drafts.siblings), or a
  corpus of other sequences (pld.drafts.corpus_source).
"""
from __future__ import annotations

from typing import Any, Tuple

NGRAM_BUCKETS = 4
SUPPORT_BUCKETS = 3
DEPTH_EDGES = (1, 2, 4, 8)
AGREEMENT_BUCKETS = 4
PAIR_AGREES, TOKEN_AGREES, DISAGREES, UNKNOWN = range(AGREEMENT_BUCKETS)
ORIGINS = 3
ROW, SIBLING, CORPUS = range(ORIGINS)

#: How many buckets each field has, in key order: a saved count keyed
#: under another layout means something else.
LAYOUT: Tuple[int, int, int, int] = (NGRAM_BUCKETS, SUPPORT_BUCKETS, len(DEPTH_EDGES) + 1,
                                     AGREEMENT_BUCKETS)


def is_bucket(key: Any) -> bool:
    """Is ``key`` an (n-gram, support, depth, agreement) bucket of LAYOUT:
    a tuple of four ints (not bools), each in [0, its field's count)?"""
    return (isinstance(key, tuple) and len(key) == len(LAYOUT)
            and all(type(k) is int and 0 <= k < size for k, size in zip(key, LAYOUT)))
