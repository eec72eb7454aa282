"""pld: prompt lookup decoding with a C core.

The lookup (`find_candidate_pred_tokens`, `NgramIndex`) and the acceptance of
a draft (`accept_greedy`, `accept_greedy_logits`, `accept_sample`) run in C
on raw token buffers: torch tensors, NumPy arrays and lists, without copies
where the input is contiguous.
"""
from ._core import Generator, NgramIndex, accept_greedy, accept_greedy_logits, accept_sample
from .config import POLICIES, SEMANTICS, DecodeConfig  # (no torch: the options, validated)
from .lookup import find_candidate_pred_tokens

__version__ = "0.1.0"

_LAZY = {
    # these need torch and transformers, imported on first use
    "enable": "hf", "disable": "hf", "enabled": "hf", "is_enabled": "hf",
    "PromptLookupCandidateGenerator": "hf",
    "generate": "generate", "Generation": "generate",
    "Corpus": "corpus", "tokenizer_fingerprint": "corpus",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pld' has no attribute {name!r}")


__all__ = [
    "Corpus",
    "DecodeConfig",
    "Generation",
    "PromptLookupCandidateGenerator",
    "disable",
    "enable",
    "enabled",
    "generate",
    "is_enabled",
    "tokenizer_fingerprint",
    "POLICIES",
    "SEMANTICS",
    "Generator",
    "NgramIndex",
    "accept_greedy",
    "accept_greedy_logits",
    "accept_sample",
    "find_candidate_pred_tokens",
]
