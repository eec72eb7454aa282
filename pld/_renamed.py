"""Options renamed to the names users already know (issue 36).

The old names keep working for one release: each is translated to its new
name with a DeprecationWarning that names the new one; passing both is a
TypeError. (No torch here: pld.config and pld.corpus use it.)
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Dict, Mapping, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: DecodeConfig's (pld.generate's, pld.enable's) old option names -> transformers'.
DECODE_CONFIG = {
    "num_pred_tokens": "prompt_lookup_num_tokens",
    "max_ngram_size": "max_matching_ngram_size",
}
#: pld.Corpus's old keyword names -> pld.NgramIndex's.
CORPUS = {
    "min_ngram": "min_ngram_size",
    "max_ngram": "max_ngram_size",
    "hash_seed": "seed",
}


def translate(options: Dict[str, Any], renamed: Mapping[str, str], where: str,
              stacklevel: int = 2) -> Dict[str, Any]:
    """``options`` (changed in place, and returned) with every old name of
    ``renamed`` replaced by its new name: a DeprecationWarning for each,
    attributed ``stacklevel`` frames up from the caller of translate (2:
    the caller's caller); a TypeError naming both when both are given."""
    for old, new in renamed.items():
        if old not in options:
            continue
        if new in options:
            raise TypeError(f"{where} got both {old}= and {new}=; {old} is the deprecated "
                            f"name of {new}: pass only {new}=")
        warnings.warn(f"{where}: {old}= is deprecated and will be removed in the next release; "
                      f"use {new}=", DeprecationWarning, stacklevel=stacklevel + 1)
        options[new] = options.pop(old)
    return options


def deprecated_alias(old: str, new: str, where: str) -> property:
    """A read-only property ``old`` that warns and returns ``new``."""
    def get(self: Any) -> Any:
        warnings.warn(f"{where}.{old} is deprecated and will be removed in the next release; "
                      f"use {where}.{new}", DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    return property(get, doc=f"Deprecated: {new}.")


def old_keywords_too(renamed: Mapping[str, str], where: str) -> Callable[[F], F]:
    """A decorator: the function also takes the old keyword names of
    ``renamed`` (translated, with a DeprecationWarning at its caller);
    functools.wraps keeps its signature (inspect follows __wrapped__)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            translate(kwargs, renamed, where)
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
