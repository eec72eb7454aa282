"""A KV cache the decoding step owns: preallocated, grown by doubling, cut
and compacted in place.

transformers' ``DynamicCache`` concatenates every forward's new keys and
values onto the whole cache (a copy that grows with the context, paid at
every step), can only drop tokens from its end, and has no notion of a step
that keeps some of the tokens it fed. :class:`OwnedCache` keeps, per layer,
a key and a value buffer ``[batch, kv_heads, capacity, head_dim]`` in the
model's dtype on the model's device:

* ``update`` writes the new tokens after the used length and returns views
  of the used length (no concatenation; attention never sees an unused
  slot). When the buffer is full it is reallocated at twice its capacity (or
  more, if one forward needs more), so growth costs amortized O(1) per token.
* ``crop`` moves the length back: O(1), nothing is copied or freed.
* ``keep_last(m, indices)`` keeps a subset of the newest ``m`` positions (a
  token tree's accepted path, say) and compacts it after the older ones: it
  copies only the kept positions, never the older context.

It plugs into transformers through the Cache interface of the installed
release (5.x, and 4.57 whose layer and crop signatures differ): the layers
subclass ``DynamicLayer`` and the cache subclasses ``DynamicCache``, so mask
creation (``get_seq_length`` / ``get_mask_sizes``), ``generate(...,
past_key_values=...)`` and the models' attention code see a dynamic
full-attention cache. It serves full attention only: :func:`cache_for`
returns it for a model whose every layer transformers would give a plain
``DynamicLayer``, and transformers' own ``DynamicCache`` otherwise
(:func:`unsupported_reason` says why, for a log line).

Contracts:

* The returned views, and ``layer.keys`` / ``layer.values``, alias the
  buffers: they hold until the next ``update``, ``crop``, ``keep_last`` or
  ``reset`` of that layer (a growth leaves old views on the old buffer; a
  ``keep_last`` rewrites slots in place).
* It is an inference cache: use it under ``torch.no_grad()`` (writes into a
  buffer are in-place, which autograd would refuse for tensors it saved).
* All rows of a batch have one length (what a row did not keep is a hole
  its mask hides: pld.slot_table).
* Anything that assigns ``layer.keys`` / ``layer.values`` (transformers'
  beam reordering, ``batch_select_indices``, offloading) hands the layer a
  new tensor: the layer adopts it as its buffer, never writes into it (the
  next write reallocates) and goes on.
"""
from __future__ import annotations

import functools
import inspect
import logging
import operator
import sys
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

try:
    from transformers.cache_utils import DynamicSlidingWindowLayer as _SLIDING_LAYER
except ImportError:  # pragma: no cover - a release without it has no sliding layers to keep
    _SLIDING_LAYER = type("NoSlidingLayer", (), {})

from .config import check_size

logger = logging.getLogger("pld")

# Slots a layer allocates at its first update when the caller names no
# capacity (more if the first forward needs more).
DEFAULT_CAPACITY = 256

# transformers 4.57's DynamicLayer.crop(max_length) takes a positive n as the
# length to keep; 5.x's crop(tokens_to_remove) refuses a positive n. Both
# drop -n tokens from the end for a negative n.
_LEGACY_CROP = "max_length" in inspect.signature(DynamicLayer.crop).parameters


def _check_capacity(capacity: Any) -> int:
    return check_size("capacity", capacity, 1, sys.maxsize)


class OwnedLayer(DynamicLayer):
    """One attention layer's keys and values in preallocated buffers.

    ``capacity`` is the number of slots allocated at the first update (or
    at ``early_initialization``), more if that update brings more tokens.
    ``keys`` / ``values`` are views of the used length ``[batch, kv_heads,
    length, head_dim]`` (None before the first update).
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity_hint = _check_capacity(capacity)
        self._k: Optional[torch.Tensor] = None   # buffers [B, H, capacity, D]
        self._v: Optional[torch.Tensor] = None
        self._kview: Optional[torch.Tensor] = None  # the used length of each
        self._vview: Optional[torch.Tensor] = None
        self._n = 0
        self._owned = False  # False: the buffers came from outside, never written
        super().__init__()   # sets keys = values = None through the properties

    # -- the views transformers reads (and sometimes assigns) ---------------

    @property
    def keys(self) -> Optional[torch.Tensor]:
        return self._kview

    @keys.setter
    def keys(self, tensor: Optional[torch.Tensor]) -> None:
        self._k, self._kview, self._n = self._adopt(tensor)

    @property
    def values(self) -> Optional[torch.Tensor]:
        return self._vview

    @values.setter
    def values(self, tensor: Optional[torch.Tensor]) -> None:
        self._v, self._vview, _ = self._adopt(tensor)

    def _adopt(self, tensor: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], int]:
        """A tensor assigned from outside becomes the buffer, full, not ours
        to write into; anything not 4-D (None, an empty placeholder) leaves
        the layer empty."""
        self._owned = False
        if isinstance(tensor, torch.Tensor) and tensor.dim() == 4:
            return tensor, tensor, tensor.shape[-2]
        return None, None, 0

    def _set_length(self, n: int) -> None:
        self._n = n
        self._kview = self._k.narrow(2, 0, n)
        self._vview = self._v.narrow(2, 0, n)

    # -- the DynamicLayer interface ----------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: Optional[torch.Tensor] = None) -> None:
        """Record dtype and device; allocate the buffers when both shapes
        are known (transformers 4.57 passes the keys only)."""
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True
        if value_states is not None and key_states.dim() == 4 and value_states.dim() == 4 and self._k is None:
            self._allocate(key_states, value_states, max(self._capacity_hint, key_states.shape[-2]), copy=0)
            self._set_length(0)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write the new ``[batch, kv_heads, q, head_dim]`` states after the
        used length; return views of all the used length. The buffers grow
        (doubling) when they are full, or are replaced when the batch, head
        count, head size, dtype or device changes while the layer is empty
        (a change while it holds tokens is a ValueError)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self._n
        end = n + key_states.shape[-2]
        k, v = self._k, self._v
        if (k is None or not self._owned or end > k.shape[2] or end > v.shape[2]
                or not _same_layout(k, key_states) or not _same_layout(v, value_states)):
            self._reserve(end, key_states, value_states)
            k, v = self._k, self._v
        k.narrow(2, n, end - n).copy_(key_states)
        v.narrow(2, n, end - n).copy_(value_states)
        self._set_length(end)
        return self._kview, self._vview

    def _reserve(self, need: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Own buffers with room for ``need`` tokens, laid out like the new
        states, with the held tokens copied over."""
        k, n = self._k, self._n
        same = k is not None and _same_layout(k, key_states) and _same_layout(self._v, value_states)
        if n and not same:
            raise ValueError(
                f"OwnedLayer: new states {tuple(key_states.shape)} {key_states.dtype} on {key_states.device} "
                f"do not match the {n} cached tokens {tuple(k.shape)} {k.dtype} on {k.device}")
        if same and self._owned and need <= k.shape[2] and need <= self._v.shape[2]:
            return
        grown = 2 * k.shape[2] if same else 0
        self._allocate(key_states, value_states, max(need, grown, self._capacity_hint), copy=n)

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int, copy: int) -> None:
        """New buffers of ``capacity`` slots; the first ``copy`` slots of the
        old ones carried over."""
        kb, kh, _, kd = key_states.shape
        vb, vh, _, vd = value_states.shape
        new_k = torch.empty((kb, kh, capacity, kd), dtype=key_states.dtype, device=key_states.device)
        new_v = torch.empty((vb, vh, capacity, vd), dtype=value_states.dtype, device=value_states.device)
        if copy:
            new_k.narrow(2, 0, copy).copy_(self._k.narrow(2, 0, copy))
            new_v.narrow(2, 0, copy).copy_(self._v.narrow(2, 0, copy))
        self._k, self._v, self._owned = new_k, new_v, True
        self._set_length(copy)

    def get_seq_length(self) -> int:
        """The used length (0 before the first update)."""
        return self._n

    @property
    def capacity(self) -> int:
        """Slots allocated (0 before the buffers exist)."""
        return 0 if self._k is None else min(self._k.shape[2], self._v.shape[2])

    def reserve(self, total: int) -> None:
        """Make room for ``total`` tokens without a growth on the way (at
        the first update if the buffers do not exist yet)."""
        total = _check_capacity(total)
        if self._k is None:
            self._capacity_hint = max(self._capacity_hint, total)
        elif total > self.capacity or not self._owned:
            kb, kh, _, kd = self._k.shape
            vb, vh, _, vd = self._v.shape
            self._allocate(self._k.new_empty((kb, kh, 0, kd)), self._v.new_empty((vb, vh, 0, vd)),
                           max(total, self._n), copy=self._n)

    def reset(self) -> None:
        """Empty the layer, keeping its buffers for the next tokens."""
        if self._k is not None and self._owned:
            self._set_length(0)
        else:
            self._k = self._v = self._kview = self._vview = None
            self._n = 0

    def crop(self, n: int) -> None:
        """transformers' semantics: a negative ``n`` drops ``-n`` tokens from
        the end (all of them if there are fewer); a positive one is the
        length to keep under transformers 4.57 and a ValueError under 5.x
        (as its DynamicLayer); 0 empties the layer under 4.57 and does
        nothing under 5.x. O(1): nothing is copied or freed."""
        n = operator.index(n)
        if n >= 0 and not _LEGACY_CROP:
            if n > 0:
                raise ValueError(
                    f"Calling `crop` with a positive value (`{n}`) is not supported. "
                    "Please use a negative integer to remove that number of tokens from the cache instead.")
            return
        self._truncate(self._n + n if n < 0 else n)

    def _truncate(self, length: int) -> None:
        length = max(0, min(length, self._n))
        if length == self._n or self._k is None:
            return
        if self._owned:
            self._set_length(length)
        else:  # a view of an adopted tensor: still not ours to write into
            self._n = length
            self._kview = self._k = self._k.narrow(2, 0, length)
            self._vview = self._v = self._v.narrow(2, 0, length)

    def keep_last(self, m: int, index: Dict[Any, torch.Tensor], count: int) -> None:
        """Keep the newest ``m`` positions at ``index`` (``count`` offsets
        among them, increasing, already checked by
        :meth:`OwnedCache.keep_last`: a LongTensor per device, the CPU's
        copied to another device once, for all its layers),
        compacted after the older ones."""
        if self._k is None:
            return
        start = self._n - m
        if not self._owned:
            self._allocate(self._k, self._v, max(self._n, self._capacity_hint), copy=self._n)
        device = self._k.device
        here = index.get(device)
        if here is None:  # (the first layer on this device: one copy, not one a layer)
            here = index[device] = index[_HOST].to(device)
        where = here + start
        kept_k = self._k.index_select(2, where)
        kept_v = self._v.index_select(2, where)
        self._k.narrow(2, start, count).copy_(kept_k)
        self._v.narrow(2, start, count).copy_(kept_v)
        self._set_length(start + count)


def _same_layout(buffer: torch.Tensor, states: torch.Tensor) -> bool:
    bs, ss = buffer.shape, states.shape
    return (bs[0] == ss[0] and bs[1] == ss[1] and bs[3] == ss[3]
            and buffer.dtype == states.dtype and buffer.device == states.device)


class OwnedCache(DynamicCache):
    """A transformers ``DynamicCache`` whose layers are :class:`OwnedLayer`.

    ``capacity``: slots each layer allocates at its first update (the
    prompt's length is a good choice, plus the tokens to come). ``config``:
    the model's config; when given the layers are made up front, and a
    config with any layer that is not full attention (sliding window,
    chunked, linear, shared) is a ValueError -- use :func:`cache_for` to
    fall back instead. ``keep_sliding=True`` accepts sliding-window layers
    and keeps every position of them too: the caller's attention masks
    must then apply each window (pld.attention_masks does). Without a
    config the layers appear as the model updates them (like
    ``DynamicCache()``).

    Beyond the Cache interface: :meth:`keep_last` (keep a subset of the
    newest positions), :meth:`reserve` and :attr:`capacity`. ``crop`` is
    O(1); ``reset`` empties the cache and keeps its buffers.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, config: Any = None,
                 keep_sliding: bool = False) -> None:
        capacity = _check_capacity(capacity)
        if config is not None:
            reason, kinds = attention_layout(config, keep_sliding)
            if reason is not None:
                raise ValueError(f"OwnedCache cannot serve this model: {reason}")
            Cache.__init__(self, layers=[OwnedLayer(capacity) for _ in kinds])
        else:
            Cache.__init__(self, layer_class_to_replicate=functools.partial(OwnedLayer, capacity))

    @property
    def capacity(self) -> int:
        """Slots allocated in the smallest layer (0 before the first update)."""
        return min((layer.capacity for layer in self.layers), default=0)

    def reserve(self, total: int) -> None:
        """Room for ``total`` tokens in every layer, so that no growth
        happens until then (layers not made yet get it at their first
        update)."""
        total = _check_capacity(total)
        for layer in self.layers:
            layer.reserve(total)
        if self.layer_class_to_replicate is not None:
            self.layer_class_to_replicate = functools.partial(
                OwnedLayer, max(total, self.layer_class_to_replicate.args[0]))

    def keep_last(self, m: int, indices: Union[Sequence[int], torch.Tensor]) -> None:
        """Of the newest ``m`` cached positions keep those at ``indices``
        (offsets in ``[0, m)``, strictly increasing), moved to follow the
        older positions; the others are dropped. The cache then holds
        ``length - m + len(indices)`` positions.

        Only the kept positions are copied (nothing when they are the first
        ``len(indices)``: that is a crop). Keys keep the positions (RoPE or
        learned) they were computed at: the caller passes the positions of
        the next tokens accordingly (for a tree's accepted path, its depth
        after the older positions), and makes sure each kept token attended
        only to tokens that are kept (a tree attention mask).
        A tensor ``indices`` is read on the host (a sync on an accelerator).
        """
        length = self.get_seq_length()
        m = operator.index(m)
        if not 0 <= m <= length:
            raise ValueError(f"keep_last: m must be in [0, {length}] (the cached length), got {m}")
        if isinstance(indices, torch.Tensor):
            if (indices.dim() != 1 or indices.is_floating_point() or indices.is_complex()
                    or indices.dtype == torch.bool):
                raise TypeError("keep_last: indices must be a 1-D integer tensor or a sequence of ints")
            offsets = indices.tolist()
        else:
            offsets = [operator.index(i) for i in indices]
        previous = -1
        for i in offsets:
            if i <= previous or i >= m:
                raise ValueError(f"keep_last: indices must increase strictly within [0, {m}), got {offsets}")
            previous = i
        count = len(offsets)
        if offsets == list(range(count)):  # a prefix of the newest m: a crop
            for layer in self.layers:
                layer._truncate(length - m + count)
            return
        index = {_HOST: torch.tensor(offsets, dtype=torch.long)}
        for layer in self.layers:
            layer.keep_last(m, index, count)


_HOST = torch.device("cpu")

#: A layer's attention kind as transformers' models name their masks.
FULL, SLIDING = "full_attention", "sliding_attention"


def attention_layout(config: Any, keep_sliding: bool = False
                     ) -> Tuple[Optional[str], Tuple[Tuple[str, Optional[int]], ...]]:
    """(None, one (kind, window) a layer) when transformers would give every
    layer of the model a plain ``DynamicLayer`` (kind FULL, window None) --
    or, with ``keep_sliding``, a ``DynamicSlidingWindowLayer`` (SLIDING and
    its window) too; (why not, ()) otherwise. Read from the cache
    transformers itself lays out for the config."""
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model (its cache has a cross-attention part)", ()
    try:
        probe = DynamicCache(config=config)
    except Exception as error:  # noqa: BLE001 - a config transformers cannot read: its own cache decides
        return f"transformers could not lay out a cache from its config ({type(error).__name__}: {error})", ()
    kinds = []
    for layer in probe.layers:
        window = getattr(layer, "sliding_window", None) if keep_sliding else None
        if type(layer) is DynamicLayer:
            kinds.append((FULL, None))
        elif type(layer) is _SLIDING_LAYER and isinstance(window, int) and window > 0:
            kinds.append((SLIDING, window))
        else:
            kinds.append((type(layer).__name__, None))
    if not kinds:
        return "its config names no attention layers", ()
    others = sorted({k for k, _ in kinds if k not in (FULL, SLIDING)})
    if others:
        return (f"not every layer is full attention: transformers gives it {', '.join(others)} "
                f"({sum(k not in (FULL, SLIDING) for k, _ in kinds)} of {len(kinds)} layers)"), ()
    return None, tuple(kinds)


def no_dynamic_cache_reason(model: Any) -> Optional[str]:
    """Why transformers keeps no croppable DynamicCache for ``model`` (a
    stateful model, or one whose class says so), or None."""
    if getattr(model, "_is_stateful", False):
        return "it is a stateful (recurrent) model, whose state cannot be rolled back to a prefix"
    supports = getattr(type(model), "_supports_default_dynamic_cache", None)
    if callable(supports):
        try:
            if not supports():
                return "transformers gives it no DynamicCache (_supports_default_dynamic_cache() is False)"
        except Exception:  # noqa: BLE001 - an odd class: what follows decides
            pass
    return None


def unsupported_reason(model: Any, keep_sliding: bool = False) -> Optional[str]:
    """Why :class:`OwnedCache` cannot serve ``model``, or None when it can
    (a decoder-only transformers model whose layers are all full attention
    -- or sliding-window attention, with ``keep_sliding`` -- with a default
    dynamic cache)."""
    reason = no_dynamic_cache_reason(model)
    if reason is not None:
        return reason
    config = getattr(model, "config", None)
    if config is None:
        return "it has no config"
    return attention_layout(config, keep_sliding)[0]


def cache_for(model: Any, capacity: int = DEFAULT_CAPACITY, keep_sliding: bool = False) -> Cache:
    """An empty cache for ``model``: an :class:`OwnedCache` when it can
    serve the model (``keep_sliding``: see :class:`OwnedCache`),
    transformers' ``DynamicCache(config=model.config)`` otherwise (the
    reason is logged at INFO on the ``pld`` logger, and
    :func:`unsupported_reason` returns it)."""
    capacity = _check_capacity(capacity)
    reason = unsupported_reason(model, keep_sliding)
    if reason is None:
        return OwnedCache(capacity, config=model.config, keep_sliding=keep_sliding)
    logger.info("pld: using transformers' DynamicCache for %s: %s", type(model).__name__, reason)
    return dynamic_cache(model)


def dynamic_cache(model: Any) -> DynamicCache:
    """An empty ``DynamicCache`` as transformers lays it out for ``model``
    (its default where it cannot read the model's config)."""
    try:
        return DynamicCache(config=getattr(model, "config", None))
    except Exception:  # noqa: BLE001 - as transformers would without a config
        return DynamicCache()
