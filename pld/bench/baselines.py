"""Baselines that pld's lookup is measured against.

* :func:`torch_seed_find_candidate_pred_tokens` -- the method's original
  lookup (prompt lookup decoding's ``find_candidate_pred_tokens``) written
  out in plain torch: per n-gram size, every window of the sequence is
  compared with the suffix n-gram, and the matches are walked in order.
  O(L * max_n) tensor work per call, i.e. per generation step.
* :func:`make_transformers_generator` -- transformers'
  ``PromptLookupCandidateGenerator`` (num_output_tokens=10,
  max_matching_ngram_size=3), wrapped so that one call is one
  ``get_candidates(input_ids)``.
* :class:`PyDictIndex` -- an incremental index in plain Python with the same
  answers as ``pld.NgramIndex(policy="first")`` under the seed semantics: a
  dict from each n-gram (a tuple of n ids) to the position of its first
  occurrence. A step is one :meth:`PyDictIndex.propose` and one
  :meth:`PyDictIndex.extend` of a single int, both O(max_n + k).
"""
from __future__ import annotations

import inspect
from typing import Callable, Dict, Iterable, List, Optional, Tuple


# ------------------------------------------------------------ torch (seed)

def torch_seed_find_candidate_pred_tokens(input_ids, max_ngram_size: int = 3,
                                          num_pred_tokens: int = 10):
    """The seed's lookup in plain torch, operation for operation.

    ``input_ids``: a ``[1, L]`` integer tensor. Returns the draft as a 1-D
    tensor (a view of ``input_ids``), or an empty int64 tensor.
    """
    import torch

    total = input_ids.size(1)
    for n in range(max_ngram_size, 0, -1):
        # the suffix n-gram, round-tripped through a list as in the seed
        suffix = torch.tensor(input_ids[0, -n:].tolist(),
                              device=input_ids.device).unsqueeze(0)
        windows = input_ids.unfold(1, n, 1)        # [1, L - n + 1, n], a view
        hit = (windows == suffix).all(dim=2)       # [1, L - n + 1]
        positions = hit.nonzero(as_tuple=True)[1]  # ascending
        for pos in positions:                      # earliest first
            begin = pos + n
            end = begin + num_pred_tokens
            if end <= total and begin < total - n:  # fits; not the suffix itself
                return input_ids[0, begin:end]
    return torch.tensor([], dtype=torch.long, device=input_ids.device)


# ------------------------------------------------------------ transformers

def make_transformers_generator(max_length: int, num_output_tokens: int = 10,
                                max_matching_ngram_size: int = 3
                                ) -> Tuple[Optional[Callable], str]:
    """``(call, note)``: ``call(input_ids)`` runs one ``get_candidates``;
    ``call`` is None (and ``note`` says why) when transformers is missing or
    its generator cannot be built with these arguments.

    The signature is inspected: some versions take extra positional
    arguments after ``input_ids`` (filled with None), and constructor
    arguments this version does not know are left out.
    """
    try:
        from transformers.generation.candidate_generator import (
            PromptLookupCandidateGenerator)
    except Exception as exc:
        try:
            from transformers.generation import PromptLookupCandidateGenerator
        except Exception:
            return None, f"transformers not importable: {exc!r}"
    wanted = {"num_output_tokens": num_output_tokens,
              "max_matching_ngram_size": max_matching_ngram_size,
              "max_length": max_length}
    try:
        params = inspect.signature(PromptLookupCandidateGenerator.__init__).parameters
    except (TypeError, ValueError):
        params = {}
    if params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        missing = [k for k in wanted if k not in params]
        if missing:
            return None, f"PromptLookupCandidateGenerator lacks {missing}"
    try:
        gen = PromptLookupCandidateGenerator(**wanted)
    except Exception as exc:
        return None, f"PromptLookupCandidateGenerator(...) failed: {exc!r}"
    extra = 0
    try:
        sig = inspect.signature(gen.get_candidates)
        required = [p for p in sig.parameters.values()
                    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                    and p.default is p.empty]
        extra = max(0, len(required) - 1)  # beyond input_ids
    except (TypeError, ValueError):
        pass
    method = gen.get_candidates
    if extra:
        fill = (None,) * extra
        return (lambda ids: method(ids, *fill)), f"get_candidates takes {extra} extra arg(s)"
    return method, ""


def transformers_draft(result, input_length: int) -> List[int]:
    """The draft inside ``get_candidates``' answer (candidates, logits)."""
    candidates = result[0] if isinstance(result, tuple) else result
    return candidates[0, input_length:].tolist()


# ------------------------------------------------------- Python dict index

class PyDictIndex:
    """A pure-Python incremental n-gram index, seed semantics, policy first.

    One dict maps every n-gram (a tuple of n ids, n in [min_n, max_n]; tuples
    of different lengths never compare equal) to the start of its earliest
    occurrence. ``propose`` answers exactly as ``pld.NgramIndex(max_n, min_n,
    "first").propose(k)`` and so as the seed's function on the same sequence.

    ``PyDictIndex(3, 1)`` (the default sizes) gives an unrolled subclass that
    keeps the suffix n-gram keys from one ``extend`` to the next ``propose``;
    other sizes use the generic loops.
    """

    __slots__ = ("max_n", "min_n", "tokens", "first", "tail", "_sizes", "_down")

    def __new__(cls, max_ngram_size: int = 3, min_ngram_size: int = 1):
        if cls is PyDictIndex and (max_ngram_size, min_ngram_size) == (3, 1):
            cls = _PyDictIndex31
        return super().__new__(cls)

    def __init__(self, max_ngram_size: int = 3, min_ngram_size: int = 1):
        if not 1 <= min_ngram_size <= max_ngram_size:
            raise ValueError("need 1 <= min_ngram_size <= max_ngram_size")
        self.max_n = max_ngram_size
        self.min_n = min_ngram_size
        self.tokens: List[int] = []
        self.first: Dict[tuple, int] = {}
        self.tail: tuple = ()  # the last max_n tokens
        self._sizes = tuple(range(min_ngram_size, max_ngram_size + 1))
        self._down = tuple((n, -n) for n in range(max_ngram_size, min_ngram_size - 1, -1))

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, token: int) -> None:
        """Append one token: O(max_n) dict inserts (no-ops when present)."""
        tokens = self.tokens
        tokens.append(token)
        end = len(tokens)
        tail = (self.tail + (token,))[-self.max_n:]
        self.tail = tail
        setdefault = self.first.setdefault
        for n in self._sizes:
            if n > end:
                break
            setdefault(tail[-n:], end - n)

    def extend_many(self, tokens: Iterable[int]) -> None:
        ext = self.extend
        for t in tokens:
            ext(t)

    def propose(self, num_pred_tokens: int = 10) -> List[int]:
        """The seed's draft: longest suffix n-gram whose earliest occurrence
        has a full continuation and is not the suffix itself."""
        tokens = self.tokens
        total = len(tokens)
        tail = self.tail
        first = self.first
        for n, neg in self._down:
            if n > total:
                continue
            begin = first[tail[neg:]] + n  # the suffix is always indexed
            if begin + num_pred_tokens <= total and begin < total - n:
                return tokens[begin:begin + num_pred_tokens]
        return []

    def truncate(self, new_len: int) -> None:
        """Keep the first ``new_len`` tokens; O((len - new_len) * max_n)."""
        tokens = self.tokens
        total = len(tokens)
        if new_len < 0:
            raise ValueError("new_len must be >= 0")
        if new_len >= total:
            return
        first = self.first
        # n-grams that end past new_len go; a key whose earliest occurrence
        # goes has no occurrence left (later ones end later still).
        for start in range(max(0, new_len - self.max_n + 1), total):
            for n in self._sizes:
                if start + n > total:
                    break
                if start + n <= new_len:
                    continue
                key = tuple(tokens[start:start + n])
                if first.get(key) == start:
                    del first[key]
        del tokens[new_len:]
        self._refresh_suffix()

    def _refresh_suffix(self) -> None:
        self.tail = tuple(self.tokens[-self.max_n:]) if self.tokens else ()


class _PyDictIndex31(PyDictIndex):
    """PyDictIndex(3, 1) unrolled: the keys of the suffix 1-, 2- and 3-gram
    are made once, by extend, and reused by the next propose."""

    __slots__ = ("k1", "k2", "k3")

    def __init__(self, max_ngram_size: int = 3, min_ngram_size: int = 1):
        super().__init__(max_ngram_size, min_ngram_size)
        self.k1 = self.k2 = self.k3 = None

    def extend(self, token: int) -> None:
        tokens = self.tokens
        pos = len(tokens)  # where token goes
        tokens.append(token)
        setdefault = self.first.setdefault
        k1 = (token,)
        setdefault(k1, pos)
        if pos >= 2:
            prev = self.k1[0]
            k2 = (prev, token)
            setdefault(k2, pos - 1)
            k3 = (self.k2[0], prev, token)
            setdefault(k3, pos - 2)
            self.k3 = k3
        elif pos == 1:
            k2 = (self.k1[0], token)
            setdefault(k2, 0)
        else:
            k2 = None
        self.k1 = k1
        self.k2 = k2

    def propose(self, num_pred_tokens: int = 10) -> List[int]:
        tokens = self.tokens
        total = len(tokens)
        first = self.first
        if total >= 3:
            begin = first[self.k3] + 3
            if begin + num_pred_tokens <= total and begin < total - 3:
                return tokens[begin:begin + num_pred_tokens]
        if total >= 2:
            begin = first[self.k2] + 2
            if begin + num_pred_tokens <= total and begin < total - 2:
                return tokens[begin:begin + num_pred_tokens]
        if total >= 1:
            begin = first[self.k1] + 1
            if begin + num_pred_tokens <= total and begin < total - 1:
                return tokens[begin:begin + num_pred_tokens]
        return []

    def _refresh_suffix(self) -> None:
        t = self.tokens
        self.k1 = tuple(t[-1:]) if len(t) >= 1 else None
        self.k2 = tuple(t[-2:]) if len(t) >= 2 else None
        self.k3 = tuple(t[-3:]) if len(t) >= 3 else None
        self.tail = tuple(t[-3:])
