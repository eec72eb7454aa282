"""The most that sibling drafts could add to a set of samples: a replay.

Given n sampled outputs of one prompt, each row's output is replayed step
by step with token-tree drafts in which every candidate is verified (no
width budget), first from the row's own prompt and output only, then also
from its siblings' outputs *whole* (as if every sibling had finished before
the row began). A step accepts the longest path of the tree that the
output continues with, plus the model's one token. With exact tree
verification the tokens a step accepts, given the sampled text, are
exactly that longest match, so the replay's tokens per forward is an
upper bound for any draft budget and any order of writing: sibling drafts
written concurrently, with a width budget, can only do worse than
``with_siblings``.

    alone, with_siblings = replay_bound(prompt, outputs)

Pure functions over token lists; used by ``python -m pld bench siblings``.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from .. import _core


def _longest_path(tree: Tuple[list, list, list, list, list], target: Sequence[int]) -> int:
    """Length of the longest root path of ``tree`` (tokens, parents, ...)
    that ``target`` starts with."""
    tokens, parents = tree[0], tree[1]
    children = {}
    for j, p in enumerate(parents):
        children.setdefault(p, {})[tokens[j]] = j
    node, depth = -1, 0
    for t in target:
        node = children.get(node, {}).get(t)
        if node is None:
            break
        depth += 1
    return depth


def replay_steps(prompt: Sequence[int], output: Sequence[int], others: Sequence[Sequence[int]],
                 max_n: int = 3, depth: int = 10, per_ngram: int = 4, max_nodes: int = 64) -> int:
    """Forwards a replay of ``output`` after ``prompt`` takes when each
    step verifies the whole tree of the row's own suffix matches (newest
    ``per_ngram`` occurrences of each n-gram size, at most ``max_nodes``)
    and, for each of ``others``, the tree of the same suffix's matches in
    that output (after the prompt's last ``max_n`` tokens)."""
    own = _core.NgramIndex(max_n, 1, "recent")
    own.extend(list(prompt))
    theirs = []
    for other in others:
        index = _core.NgramIndex(max_n, 1, "recent")
        index.extend(list(prompt[-max_n:]) + list(other))
        theirs.append(index)
    context = list(prompt)
    pos = steps = 0
    while pos < len(output):
        rest = output[pos:pos + depth]
        best = _longest_path(own.propose_tree(depth, per_ngram=per_ngram, max_nodes=max_nodes), rest)
        tail = context[-max_n:]
        for index in theirs:
            found = index.propose_tree_after(tail, depth, per_ngram=per_ngram, max_nodes=max_nodes)
            best = max(best, _longest_path(found, rest))
        take = min(best + 1, len(output) - pos)
        written = list(output[pos:pos + take])
        own.extend(written)
        context += written
        pos += take
        steps += 1
    return steps


def replay_bound(prompt: Sequence[int], outputs: Sequence[Sequence[int]], **kw) -> Tuple[int, int, int]:
    """(tokens, forwards alone, forwards with siblings) summed over the rows
    of ``outputs`` (the n samples of ``prompt``); keywords as for
    :func:`replay_steps`."""
    tokens = alone = with_siblings = 0
    for r, out in enumerate(outputs):
        others: List[Sequence[int]] = [o for q, o in enumerate(outputs) if q != r]
        tokens += len(out)
        alone += replay_steps(prompt, out, [], **kw)
        with_siblings += replay_steps(prompt, out, others, **kw)
    return tokens, alone, with_siblings
