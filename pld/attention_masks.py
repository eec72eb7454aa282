"""The 4D attention masks of a verification forward, per kind of layer.

A step that verifies a token tree, or a batch whose rows hold holes in the
cache, cannot let transformers build its masks from a 2D padding mask: each
new token sees its row's kept slots and its own ancestors only. The caller
says which keys each query may see (``allowed``, structure only) and where
every key and query sits in its row (real positions, as the row decoded
alone would number them); :func:`layer_masks` turns that into what the
model's forward takes: one additive ``[b, 1, q, K]`` mask when every layer
is of one kind, or a dict ``{kind: mask}`` (transformers' models with
sliding-window and full-attention layers take one) when they differ. A
sliding-window layer of window ``W`` sees a key only if the query's
position minus the key's is below ``W``, as transformers' own sliding mask
does for a row decoded alone -- by real positions, so holes and left
padding do not shift the window.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Union

import torch

Kinds = Sequence[Tuple[str, Optional[int]]]


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``allowed`` (bool) as an additive mask of ``dtype``: 0 where
    attended, the dtype's minimum elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def within_window(allowed: torch.Tensor, key_positions: torch.Tensor, query_positions: torch.Tensor,
                  window: int) -> torch.Tensor:
    """``allowed`` ([b, q, K]) restricted to keys whose position is less
    than ``window`` before the query's (``key_positions`` [b, K],
    ``query_positions`` [b, q])."""
    distance = query_positions[:, :, None] - key_positions[:, None, :]
    return allowed & (distance < window)


def layer_masks(allowed: torch.Tensor, key_positions: torch.Tensor, query_positions: torch.Tensor,
                kinds: Kinds, dtype: torch.dtype) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
    """The forward's attention mask for layers of ``kinds`` (one (kind,
    window) a layer; window None: full attention): ``allowed`` ([b, q, K]
    bool) with each sliding layer's window applied, additive in ``dtype``,
    ``[b, 1, q, K]``; a dict by kind when the layers' kinds differ. Two
    sliding windows of different sizes are a ValueError (no model names
    its masks for that)."""
    distinct = sorted(set(kinds), key=lambda kw: (kw[0], kw[1] or 0))
    if len({kind for kind, _ in distinct}) != len(distinct):
        raise ValueError(f"layer_masks: one kind of layer with different windows: {distinct}")
    masks = {}
    for kind, window in distinct:
        seen = allowed if window is None else within_window(allowed, key_positions, query_positions, window)
        masks[kind] = additive(seen, dtype)[:, None]
    if len(masks) == 1:
        return next(iter(masks.values()))
    return masks
