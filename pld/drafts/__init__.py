"""Draft sources: where a step's candidate tokens come from.

A source adds candidate nodes to a row's token tree (pld.token_tree.TokenTree:
each node's token, parent, depth and the features the acceptance model
scores it by: n-gram size or 0 for a model-made guess, support or rank)
and may learn from what a verified forward computed. The step
(pld.decoder) asks every source of the run in turn, in registration
order, then scores the merged tree and picks the nodes to verify (pld.width_budget).

A new source is one module here with one :func:`register` call; the bench's
methods and the demo's ``--drafts`` list what the registry holds.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

from .base import DraftSource, Proposal, RowView

#: name -> (factory, one line on what it drafts), in registration order
REGISTRY: Dict[str, Tuple[Callable[[Any], DraftSource], str]] = {}


def register(name: str, description: str) -> Callable[[Callable[[Any], DraftSource]], Callable[[Any], DraftSource]]:
    """Decorator: add a source factory under ``name``."""
    def wrap(factory: Callable[[Any], DraftSource]) -> Callable[[Any], DraftSource]:
        if name in REGISTRY:
            raise ValueError(f"draft source {name!r} is registered twice")
        REGISTRY[name] = (factory, description)
        return factory
    return wrap


def build(names: Sequence[str], config: Any) -> List[DraftSource]:
    """The sources ``names`` (in registry order), made fresh for one
    generation under ``config`` (a DecodeConfig); a ValueError where a
    name is unknown or a source reads row memory no source of ``names``
    writes (:func:`check_memory`)."""
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise ValueError(f"draft_sources: unknown {unknown}; registered: {list(REGISTRY)}")
    check_memory(names)
    return [REGISTRY[n][0](config) for n in REGISTRY if n in names]


def check_memory(names: Sequence[str]) -> None:
    """A ValueError naming the first source of ``names`` (registered) that
    reads a ``row.memory`` key (its ``reads``) that none of them writes
    (their ``writes``): sources share a row's memory only as declared."""
    written = {key for n in names for key in REGISTRY[n][0].writes}
    for n in names:
        missing = [key for key in REGISTRY[n][0].reads if key not in written]
        if missing:
            writers = [m for m in REGISTRY if set(missing) & set(REGISTRY[m][0].writes)]
            raise ValueError(f"draft_sources: {n!r} reads row memory {missing}, which only {writers} "
                             f"write; add {writers[0]!r}" if writers else
                             f"draft_sources: {n!r} reads row memory {missing}, which no source writes")


def describe() -> Dict[str, str]:
    """name -> description of every registered source."""
    return {name: text for name, (_, text) in REGISTRY.items()}


# the built-in sources register themselves on import (registry order is
# the order a step asks them: text found in the row, its siblings and the
# corpus first, the model's guesses after, since "successors" marks every
# node already in the tree by the model's agreement)
from . import prompt_chain, prompt_tree, siblings, corpus_source, guesses_ahead, successors  # noqa: E402,F401

__all__ = ["REGISTRY", "DraftSource", "Proposal", "RowView", "build", "check_memory", "describe", "register"]
