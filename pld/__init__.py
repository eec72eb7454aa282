"""pld: prompt lookup decoding with a C core.

The lookup (`find_candidate_pred_tokens`, `NgramIndex`) and the acceptance of
a verified token tree run in C on raw token buffers: torch tensors, NumPy
arrays and lists, without copies where the input is contiguous.
`accept_greedy(tokens, choices, parents=None)` walks the tree (a chain when
parents is None) from the root along the model's chosen ids;
`accept_sample(tokens, probs, uniforms, parents=None)` walks it along tokens
drawn by inverse CDF from the model's probabilities, one uniform a depth
(exact speculative sampling). Both return (path, accepted): the accepted
nodes and the tokens to append. The decoding loop (pld.generate) runs them.
"""
from ._core import NgramIndex, accept_greedy, accept_sample
from .config import POLICIES, SEMANTICS, DecodeConfig  # (no torch: the options, validated)
from .lookup import find_candidate_pred_tokens

__version__ = "0.1.0"

_LAZY = {
    # these need torch and transformers, imported on first use
    "enable": "from_generate", "disable": "from_generate", "enabled": "from_generate",
    "is_enabled": "from_generate", "PromptLookupCandidateGenerator": "candidate_generator",
    "generate": "generate", "Generation": "generate",
    "Corpus": "corpus", "tokenizer_fingerprint": "corpus",
}


#: subpackages reachable as attributes after ``import pld`` (imported on first use)
_SUBMODULES = ("models", "bench", "drafts")


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
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
    "NgramIndex",
    "accept_greedy",
    "accept_sample",
    "find_candidate_pred_tokens",
]
