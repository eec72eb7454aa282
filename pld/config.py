"""DecodeConfig: every option of a prompt-lookup generation, declared once.

``pld.generate``, the ``model.generate()`` glue (``pld.enable()``), the
native loop and the benchmark's method registry all build a
:class:`DecodeConfig` and pass it on; the options are validated here, once,
with the messages users see. What is not an option -- the model, the
prompt, its attention mask, logits processors, stopping criteria, the
streamer, a per-step callback -- travels beside it.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

from . import _renamed

# The C core's limits (csrc/pld_module.c PLD_MAX_DRAFT, csrc/pld.h
# PLD_INDEX_MAX_TOKENS, PLD_MAX_NGRAM): checked here first, with the
# caller's names.
MAX_DRAFT_TOKENS = 1 << 20
MAX_INDEX_TOKENS = (1 << 32) - 3
MAX_NGRAM = 64
MAX_TREE_WIDTH = 4096  # PLD_TREE_MAX_NODES
MAX_TREE_CANDIDATES = 16  # PLD_TREE_MAX_PER_NGRAM

POLICIES = ("first", "recent", "frequent")
SEMANTICS = ("seed", "transformers")
LINEAR_KERNELS = ("auto", "onednn", "torch")
#: eos_token_id's default: the model's generation config decides.
EOS_FROM_MODEL = -1


def _is_bool(value: Any) -> bool:
    """A bool: Python's, NumPy's (``bool_``; NumPy 2 names its type
    ``bool``) or a torch tensor of dtype bool."""
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool")) \
        or (kind.__module__.startswith("torch") and str(getattr(value, "dtype", "")) == "torch.bool")


def is_index(value: Any) -> bool:
    """An integer in Python's sense (__index__: int, NumPy integers, a
    one-element integer tensor), not a bool (nor a bool tensor)."""
    if _is_bool(value):
        return False
    try:
        operator.index(value)
    except (TypeError, RuntimeError):  # (a tensor of another shape, on the meta device, beyond int64...)
        return False
    return True


def check_size(name: str, value: Any, minimum: int, maximum: int, why: str = "") -> int:
    """``value`` as an int in [minimum, maximum]: anything with __index__ (a
    NumPy integer...) but not a bool; a TypeError or ValueError naming
    ``name`` otherwise (``why`` explains the maximum)."""
    if not is_index(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}{f' ({why})' if why else ''}, got {value}")
    return value


def eos_at(tokens: Sequence[int], eos: Sequence[int]) -> Optional[int]:
    """The index of the first eos token in ``tokens`` (None: there is none):
    a row stops after it, and a draft is cut before it (nothing after an
    eos is ever generated)."""
    eos = set(eos)
    return next((j for j, t in enumerate(tokens) if t in eos), None)


def eos_ids(value: Any) -> Tuple[int, ...]:
    """eos_token_id as a tuple of ids: None, an int (a NumPy integer, a 0-d
    tensor), or a list/tuple/array/tensor of them, as transformers takes it."""
    if value is None:
        return ()
    if type(value).__module__.startswith("torch") and hasattr(value, "dtype"):
        if value.dtype.is_floating_point or value.dtype.is_complex or str(value.dtype) == "torch.bool":
            raise TypeError(f"eos_token_id: expected integer ids, got a {value.dtype} tensor")
        if getattr(value, "is_meta", False):
            raise ValueError("eos_token_id: a tensor on the meta device holds no ids")
        return _int64_ids(int(v) for v in value.reshape(-1).tolist())
    if is_index(value):
        return _int64_ids((operator.index(value),))
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"eos_token_id: expected an int or a list of ints, got {type(value).__name__}")
    ids = list(value)
    bad = [v for v in ids if not is_index(v)]
    if bad:
        raise TypeError(f"eos_token_id: expected a list of ints, got an item of type {type(bad[0]).__name__}")
    return _int64_ids(operator.index(v) for v in ids)


def _int64_ids(ids: Any) -> Tuple[int, ...]:
    """The ids as a tuple, each in int64's range (a ValueError naming
    eos_token_id otherwise: no token id lies beyond it)."""
    out = tuple(ids)
    for v in out:
        if not -(1 << 63) <= v < 1 << 63:
            raise ValueError(f"eos_token_id: {v} is beyond the range of token ids (int64)")
    return out


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and _is_bool(value)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _number(name: str, value: Any, integer: bool = False) -> Any:
    """None, or a real number (an int for ``integer``), not a bool."""
    if value is None:
        return None
    if integer:
        if not is_index(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        return operator.index(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a finite number, got an int of {int(value).bit_length()} bits") from None


def _choice(name: str, value: Any, choices: Tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def _sources(value: Any) -> Optional[Tuple[str, ...]]:
    """None, or a non-empty list of registered draft-source names."""
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not hasattr(value, "__iter__"):
        raise TypeError(f"draft_sources must be a list of names, got {type(value).__name__}")
    value = tuple(value)  # (read once: an iterator too)
    if not all(isinstance(v, str) for v in value):
        raise TypeError(f"draft_sources must be a list of names, got an item of type "
                        f"{type(next(v for v in value if not isinstance(v, str))).__name__}")
    from .drafts import REGISTRY, check_memory

    names = tuple(dict.fromkeys(value))
    unknown = [n for n in names if n not in REGISTRY]
    if not names or unknown:
        raise ValueError(f"draft_sources: expected names from {tuple(REGISTRY)}, got {list(value)}")
    check_memory(names)
    return names


def _check_corpus(corpus: Any, sources: Optional[Tuple[str, ...]]) -> None:
    """None or a pld.Corpus; the "corpus" source needs one."""
    if corpus is not None:
        from .corpus import Corpus

        if not isinstance(corpus, Corpus):
            raise TypeError(f"corpus must be a pld.Corpus or None, got {type(corpus).__name__}")
    if corpus is None and sources is not None and "corpus" in sources:
        raise ValueError("draft_sources: \"corpus\" needs corpus=pld.Corpus(...)")


@dataclass(frozen=True)
class DecodeConfig:
    """The options of one generation (frozen; validated on construction).

    Budget and draft:
      max_new_tokens   new tokens at most (>= 1; prompt + it <= 2**32 - 3)
      prompt_lookup_num_tokens
                       draft length k (<= 2**20, the C core's limit);
                       transformers' name (was num_pred_tokens)
      max_matching_ngram_size, min_ngram_size
                       the suffix n-gram sizes a draft is looked up with
                       (max_matching_ngram_size: transformers' name, was
                       max_ngram_size; its default here is 3, the
                       method's, where transformers' is 2)
      policy           "first" (the method's earliest occurrence), "recent"
                       or "frequent" (see pld.NgramIndex)
      semantics        "seed" (the method's rule: a match needs k tokens
                       after it) or "transformers" (a match near the end
                       proposes the shorter continuation there is)
      adaptive         the draft length follows acceptance
                       (pld.draft_length.DraftLength)
      draft_tree       several candidate continuations a step, verified as
                       a token tree under a width budget (pld.decoder;
                       policy is then the index's "recent", which keeps
                       every occurrence); False: one linear draft
      tree_width       the most draft tokens a tree step verifies; the
                       budget picks fewer where wider does not pay
      tree_candidates  occurrences a tree takes of each n-gram size
                       (<= 16)
      tree_successors  with draft_tree, also offer the model's own recent
                       guesses of what follows each node's token
                       (pld.successors; False: prompt lookup's candidates only)
      draft_sources    the draft sources by name (pld.drafts.REGISTRY), in
                       place of what draft_tree and tree_successors pick:
                       None (default): ("prompt",) for linear drafts,
                       ("prompt_tree", "ahead", "successors") for trees;
                       "siblings" and "corpus" are added as the two
                       options below ask
      sibling_drafts   rows of a batch with the same prompt (as
                       num_return_sequences makes them) also draft from
                       each other's tokens as they are written
                       (pld.drafts.siblings)
      corpus           a pld.Corpus to draft from as well (its candidates
                       learn their own acceptance; pld.drafts.corpus_source)
      corpus_add       add each finished row's new tokens to ``corpus``
      cost_aware       the width budget (pld.width_budget): verify the draft
                       nodes whose expected gain pays for the wider forward,
                       from the forward cost learned on the model from its
                       timed forwards (pld.forward_cost) and the
                       acceptance model; False verifies every draft node
                       (a tree's up to tree_width)
    Stopping and sampling:
      eos_token_id     an id or ids; EOS_FROM_MODEL (-1): the model's
                       generation config; None: none
      do_sample        sample (exact speculative sampling) instead of greedy
      temperature, top_k, top_p
                       the usual warpers (do_sample only)
    Kernels and records:
      linear_kernel    "auto" (oneDNN for a float32 model on the CPU where
                       it is measured faster), "onednn" or "torch"
                       (pld.cpu_kernels)
      output_scores, output_logits
                       keep the processed scores / raw logits of every new
                       token (as transformers' return_dict_in_generate)
      record_steps     keep a StepRecord of every step, default on (the coloured
                       rendering reads them)

    None of these changes the tokens of greedy decoding; only the cost.
    """

    max_new_tokens: int = 128
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 3
    min_ngram_size: int = 1
    policy: str = "first"
    semantics: str = "seed"
    adaptive: bool = False
    draft_tree: bool = False
    tree_width: int = 32
    tree_candidates: int = 4
    tree_successors: bool = True
    draft_sources: Optional[Tuple[str, ...]] = None
    sibling_drafts: bool = True
    corpus: Any = None
    corpus_add: bool = True
    cost_aware: bool = True
    eos_token_id: Any = EOS_FROM_MODEL
    do_sample: bool = False
    temperature: Optional[float] = None
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    linear_kernel: str = "auto"
    output_scores: bool = False
    output_logits: bool = False
    record_steps: bool = True

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("max_new_tokens", check_size("max_new_tokens", self.max_new_tokens, 1, MAX_INDEX_TOKENS,
                                         f"the index holds at most {MAX_INDEX_TOKENS} tokens"))
        put("prompt_lookup_num_tokens", check_size("prompt_lookup_num_tokens", self.prompt_lookup_num_tokens,
                                                   1, MAX_DRAFT_TOKENS, "the C core's limit on a draft"))
        put("max_matching_ngram_size", check_size("max_matching_ngram_size", self.max_matching_ngram_size,
                                                  1, MAX_NGRAM))
        put("min_ngram_size", check_size("min_ngram_size", self.min_ngram_size, 1, MAX_NGRAM))
        if self.min_ngram_size > self.max_matching_ngram_size:
            raise ValueError(f"min_ngram_size ({self.min_ngram_size}) must not exceed "
                             f"max_matching_ngram_size ({self.max_matching_ngram_size})")
        put("tree_width", check_size("tree_width", self.tree_width, 1, MAX_TREE_WIDTH,
                                     "the C core's limit on a tree"))
        put("tree_candidates", check_size("tree_candidates", self.tree_candidates, 1,
                                          MAX_TREE_CANDIDATES))
        _choice("policy", self.policy, POLICIES)
        _choice("semantics", self.semantics, SEMANTICS)
        _choice("linear_kernel", self.linear_kernel, LINEAR_KERNELS)
        for name in ("adaptive", "draft_tree", "tree_successors", "sibling_drafts", "corpus_add", "cost_aware",
                     "do_sample", "output_scores", "output_logits", "record_steps"):
            put(name, _flag(name, getattr(self, name)))
        if not (is_index(self.eos_token_id) and operator.index(self.eos_token_id) == EOS_FROM_MODEL):
            put("eos_token_id", eos_ids(self.eos_token_id))
        put("draft_sources", _sources(self.draft_sources))
        _check_corpus(self.corpus, self.draft_sources)
        put("temperature", _number("temperature", self.temperature))
        put("top_k", _number("top_k", self.top_k, integer=True))
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no top-k filter), got {self.top_k}")
        put("top_p", _number("top_p", self.top_p))
        if self.temperature is not None and not 0.0 < self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")
        if self.top_p is not None and not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if not self.do_sample and (self.temperature, self.top_k, self.top_p) != (None, None, None):
            raise ValueError("temperature/top_k/top_p need do_sample=True")

    def replace(self, **changes: Any) -> "DecodeConfig":
        """A copy with ``changes`` (validated again)."""
        _renamed.translate(changes, _renamed.DECODE_CONFIG, "DecodeConfig.replace()")
        return dataclasses.replace(self, **changes)

    # the old names, read: deprecated for one release
    num_pred_tokens = _renamed.deprecated_alias("num_pred_tokens", "prompt_lookup_num_tokens", "DecodeConfig")
    max_ngram_size = _renamed.deprecated_alias("max_ngram_size", "max_matching_ngram_size", "DecodeConfig")

    def with_model_eos(self, model: Any) -> "DecodeConfig":
        """eos_token_id resolved: EOS_FROM_MODEL becomes the model's."""
        if isinstance(self.eos_token_id, tuple):
            return self
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        return self.replace(eos_token_id=eos)

    def warpers(self) -> list:
        """The sampling warpers temperature/top_k/top_p ask for."""
        if not self.do_sample:
            return []
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

        out: list = []
        if self.temperature is not None and self.temperature != 1.0:
            out.append(TemperatureLogitsWarper(self.temperature))
        if self.top_k is not None and self.top_k > 0:
            out.append(TopKLogitsWarper(self.top_k))
        if self.top_p is not None and self.top_p < 1.0:
            out.append(TopPLogitsWarper(self.top_p))
        return out

    @classmethod
    def option_names(cls) -> Tuple[str, ...]:
        """The options' names (the current ones, not the deprecated)."""
        return tuple(f.name for f in dataclasses.fields(cls))


# The generated __init__ also takes the deprecated names num_pred_tokens and
# max_ngram_size for one release (a DeprecationWarning at the caller; its
# signature stays the generated one). dataclasses.replace goes through it.
DecodeConfig.__init__ = _renamed.old_keywords_too(  # type: ignore[method-assign]
    _renamed.DECODE_CONFIG, "DecodeConfig()")(DecodeConfig.__init__)
