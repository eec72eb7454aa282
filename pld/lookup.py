"""find_candidate_pred_tokens: the method's lookup, answered by the C core.

The core returns where the draft lies in the input's only row, so the answer
is a slice of the input for tensors and NumPy arrays (a view, on the input's
device), and a list of the ids the core read for everything else.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Optional, Union

from . import _core

Semantics = str  # "seed" or "transformers"


def _numpy_row(obj: Any) -> Any:
    """A NumPy array's only row: the array itself, or its row when it is
    [1, L] (np.matrix's row is [1, L] again, which the core refuses); None
    if obj is not a NumPy array."""
    np = sys.modules.get("numpy")
    if np is None or not isinstance(obj, np.ndarray):
        return None
    return obj[0] if obj.ndim == 2 and len(obj) == 1 else obj


def find_candidate_pred_tokens(
    input_ids: Any,
    max_ngram_size: int = 3,
    num_pred_tokens: int = 10,
    *,
    min_ngram_size: int = 1,
    semantics: Semantics = "seed",
    max_length: Optional[int] = None,
    eos_token_id: Union[None, int, Iterable[int]] = None,
) -> Any:
    """Propose up to ``num_pred_tokens`` tokens by matching the sequence's end.

    ``semantics="seed"`` answers exactly as the method's original function:
    the longest suffix n-gram (``max_ngram_size`` down to ``min_ngram_size``)
    whose earliest occurrence has a full ``num_pred_tokens`` continuation.
    ``semantics="transformers"`` answers as transformers'
    ``PromptLookupCandidateGenerator`` (without logits processors): the
    continuation may be clipped at the sequence end and at ``max_length``,
    and is cut before the first ``eos_token_id``.

    ``input_ids``: a torch tensor ``[L]`` or ``[1, L]`` (int32/int64, any
    device and strides: only the ids cross to the host), a NumPy integer
    array ``[L]`` or ``[1, L]`` whose row is C-contiguous, a sequence of ints,
    or any 1-D C-contiguous integer buffer in native byte order (others --
    strided, byte-swapped, np.matrix -- are refused: ``np.ascontiguousarray``
    makes one that is not). Returns the same kind: a 1-D int64 tensor on the
    input's device, a NumPy array, or a list; empty when nothing matches.
    """
    if type(input_ids).__module__.startswith("torch") and hasattr(input_ids, "device"):
        if input_ids.device.type == "meta":
            raise ValueError("input_ids: a tensor on the meta device holds no ids")
        host = input_ids if input_ids.device.type == "cpu" else input_ids.cpu()
        start, count = _core._find_candidate(
            host, max_ngram_size, num_pred_tokens, min_ngram_size, semantics,
            max_length, eos_token_id)
        row = input_ids[0] if input_ids.dim() == 2 else input_ids
        return row[start:start + count].long()  # no copy when already int64
    row = _numpy_row(input_ids)
    if row is not None:
        start, count = _core._find_candidate(
            row, max_ngram_size, num_pred_tokens, min_ngram_size, semantics,
            max_length, eos_token_id)
        return row[start:start + count]
    # lists, buffers, other DLPack producers: the ids as the core read them
    # (a list that Python code changed meanwhile does not matter)
    _, _, draft = _core._find_candidate(
        input_ids, max_ngram_size, num_pred_tokens, min_ngram_size, semantics,
        max_length, eos_token_id, True)
    return draft
