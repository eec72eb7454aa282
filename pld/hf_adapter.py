"""The model boundary: the only code that calls a transformers causal LM
and touches its cache.

Before a run's first step :func:`decide` answers, once, what the step needs
to know of the model and the batch (:class:`Serving`). Every decoding path
-- one row with linear drafts, token trees, a batch of rows -- then goes
through :class:`TransformersAdapter`: ``forward_rows`` over the tokens not
yet cached, the cache operations a
step needs (``truncate_cache``, ``keep_cache``, ``select_rows``,
``gather_slots``) and ``masks`` (the 4D attention masks of a step whose
queries see only some keys, per kind of layer: pld.attention_masks).

What a model takes is found out by trying it, once per model
(:func:`model_traits`), on a few tokens: which keyword names the cache
(transformers 5.24 renamed ``past_key_values`` to ``cache``; the name the
signature lists is tried first, the other next, and the one whose cache
comes back filled wins), whether ``logits_to_keep`` trims the logits, and
whether custom 4D masks -- a tree's branches, a hole in the cache, a
gathered path, left-padded rows at their own positions -- give each row
the logits it gets decoded alone (ALiBi models that build their bias from
the 2D mask or from cache slots do not: they get exact fallbacks).
``cache_position`` is never passed: every release computes it from the
cache, which holds exactly the tokens before the new ones.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, Optional, Tuple, Union

import torch

from .attention_masks import layer_masks
from .batch_inputs import check_left_padded, check_mask
from .config import eos_ids
from .cpu_kernels import cpu_kernels
from .kv_cache import FULL, OwnedCache, attention_layout, cache_for, dynamic_cache, no_dynamic_cache_reason

#: The keyword a model's forward may take its KV cache under (5.24 and
#: later: ``cache``; before: ``past_key_values``).
CACHE_ARGUMENTS = ("cache", "past_key_values")

logger = logging.getLogger("pld")


@dataclass(frozen=True)
class ModelTraits:
    """What a model's forward was found to take (:func:`model_traits`).

    ``cache_argument``: the keyword that fills a cache it is given (None:
    none did). ``logits_to_keep``: whether that keyword trims the logits.
    ``reason``: why pld's loop cannot serve the model at all (None: it
    can). ``custom_masks``: why 4D masks -- trees, batches with holes --
    cannot be used exactly (None: they can). ``kinds``: each layer's
    attention kind and window, for the masks.
    """

    cache_argument: Optional[str]
    logits_to_keep: bool
    reason: Optional[str]
    custom_masks: Optional[str]
    kinds: Tuple[Tuple[str, Optional[int]], ...] = ((FULL, None),)


_TRAITS: "weakref.WeakKeyDictionary[Any, Dict[Tuple, ModelTraits]]" = weakref.WeakKeyDictionary()


def model_traits(model: Any) -> ModelTraits:
    """The model's :class:`ModelTraits`, probed on its first use (a few
    forwards over at most 5 tokens, torch's RNG states untouched: a model
    in eval mode draws nothing, one in training mode has them restored) and kept
    per attention implementation, dtype, device and training mode (a
    model in training mode: its dropout makes forwards differ, and the
    reason says to call model.eval())."""
    from .forward_cost import in_training, rng_devices, rng_kept

    training = in_training(model)
    key = (getattr(getattr(model, "config", None), "_attn_implementation", None),
           str(getattr(model, "dtype", None)), str(getattr(model, "device", None)), training)
    try:
        known = _TRAITS.setdefault(model, {})
    except TypeError:  # not weakly referenceable: probe every time
        known = {}
    if key not in known:
        with torch.no_grad(), rng_kept(rng_devices(model)):
            traits = _probe(model)
        if training and traits.reason is not None:
            why = (f"{traits.reason} (and it, or one of its modules, is in training mode, where dropout "
                   "makes forwards differ: call model.eval())")
            traits = replace(traits, reason=why, custom_masks=why)
        known[key] = traits
    return known[key]


def cache_blocker(model: Any) -> Optional[str]:
    """Why pld's loop cannot serve ``model`` (its forward fills no cache it
    is given, it is stateful, ...), or None."""
    return model_traits(model).reason


# --------------------------------------------------------------- probing

def _probe(model: Any) -> ModelTraits:
    reason = ("it is an encoder-decoder model" if getattr(getattr(model, "config", None), "is_encoder_decoder", False)
              else no_dynamic_cache_reason(model))
    if reason is not None:
        return ModelTraits(None, False, reason, reason)
    try:
        ids = _probe_ids(model)
    except Exception as error:  # noqa: BLE001 - a module that is no language model
        reason = ("it names no vocabulary size (no config.vocab_size, no get_input_embeddings(): "
                  f"{_describe(error)})")
        return ModelTraits(None, False, reason, reason)
    try:
        argument, keep, croppable = _find_cache_argument(model, ids)
    except Exception as error:  # noqa: BLE001 - any failure of the model's forward is a reason
        reason = f"its forward() failed on a 3-token probe ({_describe(error)})"
        return ModelTraits(None, False, reason, reason)
    if argument is None:
        reason = ("its forward() fills no KV cache it is given (tried the keywords "
                  f"{', '.join(CACHE_ARGUMENTS)}): the model keeps no usable KV cache")
        return ModelTraits(None, False, reason, reason)
    if not croppable:
        reason = ("its cache cannot be cropped back to the accepted tokens (a layer keeps a recurrent "
                  "or convolutional state)")
        return ModelTraits(argument, keep, reason, reason)
    reason = _check_wide_forward(model, argument, ids)
    if reason is not None:
        return ModelTraits(argument, keep, reason, reason)
    layout_reason, kinds = attention_layout(model.config, keep_sliding=True)
    traits = ModelTraits(argument, keep, None, layout_reason, kinds or ((FULL, None),))
    if layout_reason is None:
        try:
            masks_reason = _check_custom_masks(TransformersAdapter(model, None, "torch", traits=traits), ids)
        except Exception as error:  # noqa: BLE001 - a model that cannot take the masks
            masks_reason = f"its forward() does not take pld's 4D attention masks ({_describe(error)})"
        traits = ModelTraits(argument, keep, None, masks_reason, traits.kinds)
    return traits


def _describe(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:160]}"


def _probe_ids(model: Any) -> torch.Tensor:
    """Six fixed token ids within the model's vocabulary, on its device."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 2:
        embeddings = model.get_input_embeddings()
        vocab = embeddings.weight.shape[0]
    device = _device(model)
    return torch.tensor([[(37 * i + 11) % vocab for i in range(6)]], dtype=torch.long, device=device)


def _device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _named_first(model: Any) -> Tuple[str, ...]:
    """CACHE_ARGUMENTS, the one the forward's signature names first (a
    hint for the order of the tries, nothing more)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return CACHE_ARGUMENTS
    return tuple(sorted(CACHE_ARGUMENTS, key=lambda name: name not in params))


def _find_cache_argument(model: Any, ids: torch.Tensor) -> Tuple[Optional[str], bool, bool]:
    """(the cache keyword that works, whether logits_to_keep trims, whether
    the filled cache can be cropped) from forwards over 3 tokens into a
    fresh cache."""
    tokens = ids[:, :3]
    base = {"input_ids": tokens, "attention_mask": torch.ones_like(tokens),
            "position_ids": torch.arange(3, device=tokens.device)[None], "use_cache": True}
    order = _named_first(model)
    for name in order:
        for keep in (True, False):
            cache = dynamic_cache(model)
            inputs = {**base, name: cache, **({"logits_to_keep": 1} if keep else {})}
            try:
                out = model(**inputs)
            except (TypeError, ValueError):  # an argument refused (bloom 4.57: a ValueError)
                if keep:
                    continue  # again without logits_to_keep
                if name != order[-1]:
                    break  # the other keyword
                raise
            if cache.get_seq_length() != 3:
                break  # this keyword is not the cache's
            return name, keep and out.logits.shape[1] == 1, getattr(cache, "is_croppable", True)
    return None, False, False


def _check_wide_forward(model: Any, argument: str, ids: torch.Tensor) -> Optional[str]:
    """None when a forward over 3 tokens after 3 cached ones (what a
    draft's verification is) gives the logits of one forward over all 6 in
    transformers' own cache; else what went wrong (transformers 5.10's
    glm_moe_dsa fails it with a shape error, as its own prompt lookup
    does)."""
    positions = torch.arange(6, device=ids.device)[None]
    ones = torch.ones_like(ids)
    try:
        reference = model(input_ids=ids, attention_mask=ones, position_ids=positions, use_cache=True,
                          **{argument: dynamic_cache(model)}).logits[0, -3:]
        cache = dynamic_cache(model)
        model(input_ids=ids[:, :3], attention_mask=ones[:, :3], position_ids=positions[:, :3], use_cache=True,
              **{argument: cache})
        got = model(input_ids=ids[:, 3:], attention_mask=ones, position_ids=positions[:, 3:].clone(),
                    use_cache=True, **{argument: cache}).logits[0, -3:]
    except Exception as error:  # noqa: BLE001 - any failure of the model's forward is a reason
        return f"its forward() over 3 tokens after 3 cached ones failed ({_describe(error)})"
    tolerance = PROBE_TOLERANCE.get(reference.dtype, HALF_TOLERANCE) * max(1.0, float(reference.abs().max()))
    if bool((got.float() - reference.float()).abs().max() > tolerance):
        return "its forward() over 3 tokens after 3 cached ones gives other logits than one forward over all 6"
    return None


#: Probe logits agree when they differ by at most this share of the
#: largest logit (float32; half precision rounds a wider forward otherwise).
PROBE_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
HALF_TOLERANCE = 5e-2


def _check_custom_masks(adapter: "TransformersAdapter", ids: torch.Tensor) -> Optional[str]:
    """None when 4D masks give the logits of plain decoding; else what
    differed. On tokens a b c d e (x: a decoy): a reference forward over
    a..e; then a b, then a tree [x | c -> d] (x and c siblings at position
    2), then e with x left as a hole, then e again after the path c d is
    gathered; then a left-padded batch of two rows at their own
    positions."""
    model, at = adapter.model, torch.arange(5, device=ids.device)[None]  # a..e's positions
    reference = adapter.forward_rows(ids[:, :5], at, torch.ones_like(ids[:, :5]), 5,
                                     cache=_fresh_cache(model))[0]
    tolerance = PROBE_TOLERANCE.get(reference.dtype, HALF_TOLERANCE) * max(1.0, float(reference.abs().max()))

    def differs(got: torch.Tensor, rows: slice) -> bool:
        return bool((got.float() - reference[rows].float()).abs().max() > tolerance)

    adapter.cache, adapter.cached = _fresh_cache(model), 0
    adapter.forward_rows(ids[:, :2], at[:, :2], torch.ones_like(ids[:, :2]), 1)
    a, b, c, d, e, x = ids[0].tolist()
    tree = torch.tensor([[x, c, d]], device=ids.device)
    tree_positions = torch.tensor([[2, 2, 3]], device=ids.device)
    key_positions = torch.tensor([[0, 1, 2, 2, 3]], device=ids.device)
    allowed = torch.tensor([[[1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]], dtype=torch.bool,
                           device=ids.device)
    got = adapter.forward_rows(tree, tree_positions, adapter.masks(allowed, key_positions, tree_positions), 2)
    if differs(got[0], slice(2, 4)):
        return "a token tree's nodes get other logits than plain decoding"
    hole = torch.tensor([[[1, 1, 0, 1, 1, 1]]], dtype=torch.bool, device=ids.device)
    e_position = torch.tensor([[4]], device=ids.device)
    got = adapter.forward_rows(ids[:, 4:5], e_position,
                               adapter.masks(hole, torch.tensor([[0, 1, 2, 2, 3, 4]], device=ids.device),
                                             e_position), 1)
    if differs(got[0], slice(4, 5)):
        return "a hole in the cache (a batch row's rejected draft) changes the logits of the tokens after it"
    adapter.truncate_cache(5)
    adapter.keep_cache(3, [1, 2])
    seen = torch.ones((1, 1, 5), dtype=torch.bool, device=ids.device)
    got = adapter.forward_rows(ids[:, 4:5], e_position,
                               adapter.masks(seen, at, e_position), 1)
    if differs(got[0], slice(4, 5)):
        return "a gathered tree path changes the logits of the tokens after it"
    return _check_padded_batch(adapter, ids, differs)


def _check_padded_batch(adapter: "TransformersAdapter", ids: torch.Tensor, differs: Any) -> Optional[str]:
    """Row 0: a..e; row 1: a pad slot, then a..d; each at its own positions
    under a 4D mask: their last logits are plain decoding's."""
    adapter.cache, adapter.cached = _fresh_cache(adapter.model), 0
    rows = torch.cat([ids[:, :5], torch.cat([ids[:, 5:6], ids[:, :4]], dim=1)])
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 1, 2, 3]], device=ids.device)
    valid = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool, device=ids.device)
    causal = torch.ones((5, 5), dtype=torch.bool, device=ids.device).tril()
    allowed = causal[None] & valid[:, None, :]
    got = adapter.forward_rows(rows, positions, adapter.masks(allowed, positions, positions), 1)
    if differs(got[0], slice(4, 5)) or differs(got[1], slice(3, 4)):
        return "rows at their own positions under a 4D mask get other logits than each row alone"
    adapter.cache, adapter.cached = _fresh_cache(adapter.model), 0
    got = adapter.forward_rows(rows, positions, valid.long(), 1)  # a batch's prefill: the 2D mask
    if differs(got[0], slice(4, 5)) or differs(got[1], slice(3, 4)):
        return "a left-padded row gets other logits than the row alone (its positions follow the padding)"
    return None


def _fresh_cache(model: Any) -> Any:
    return OwnedCache(8, config=model.config, keep_sliding=True)


# --------------------------------------------------------------- the decision

@dataclass(frozen=True)
class Serving:
    """What the step needs to know of a model and a batch, decided once
    before the first step (:func:`decide`).

    ``config``: the run's options (eos resolved; linear drafts where a
    token tree cannot be verified exactly). ``cache``: the empty cache the
    run fills. ``mask``: the batch's padding mask [B, L] (bool, checked
    left-padded; None: a row without one). ``pad``: the id finished rows
    are filled with. ``vocab``: how many token ids the model embeds (None:
    unknown). ``one_at_a_time``: why a batch's rows go through the loop
    one at a time (pld's 4D masks would change its logits), else None.
    """

    traits: ModelTraits
    config: Any
    cache: Any
    mask: Optional[torch.Tensor]
    pad: int
    vocab: Optional[int]
    one_at_a_time: Optional[str] = None


def decide(model: Any, input_ids: torch.Tensor, config: Any, trees: bool, *, cache: Any = None,
           attention_mask: Optional[torch.Tensor] = None, pad_token_id: Optional[int] = None) -> Serving:
    """Everything a run needs to know of ``model`` and the batch
    ``input_ids`` ([B, L]) under ``config`` (a DecodeConfig, eos
    resolved), once: a ValueError where the loop cannot serve the model or
    the inputs are malformed; a warning where it serves them another
    exact way (a batch's rows one at a time; linear drafts where
    ``trees`` -- the sources draft trees -- cannot be verified exactly)."""
    traits = model_traits(model)
    if traits.reason is not None:
        raise ValueError(f"model: {type(model).__name__} cannot be used by pld's loop: {traits.reason}")
    if not config.do_sample and tf32_products(input_ids.device, getattr(model, "dtype", None)):
        _warn_tf32()
    B, L = input_ids.shape
    if B == 1 and attention_mask is not None:
        check_mask(input_ids, attention_mask)  # (a row: any 0/1 mask)
    mask = check_left_padded(input_ids, attention_mask) if B > 1 else attention_mask
    if config.corpus is not None:
        bind_corpus(model, config.corpus)
    eos = config.eos_token_id
    pad = eos_ids(pad_token_id if pad_token_id is not None else getattr(
        getattr(model, "generation_config", None), "pad_token_id", None)) or tuple(eos) or (0,)
    serving = Serving(traits, config, cache, mask, pad[0], _input_vocabulary(model))
    masks = masks_blocker(model)
    if B > 1 and masks is not None:
        logger.warning("pld: decoding the batch's %d rows one at a time (%s: %s)", B, type(model).__name__, masks)
        return replace(serving, one_at_a_time=masks)
    if cache is None:
        cache = _loop_cache(model, B, L, config)
    tree = masks or (None if callable(getattr(cache, "keep_last", None))
                     else f"its cache ({type(cache).__name__}) cannot keep a tree's accepted path")
    if trees and tree is not None:
        logger.warning("pld: linear drafts instead of a token tree (%s: %s)", type(model).__name__, tree)
        config = config.replace(draft_tree=False, draft_sources=None)
    return replace(serving, config=config, cache=cache)


def tf32_products(device: torch.device, dtype: Any) -> bool:
    """Whether a float32 model's matrix products on ``device`` run in TF32
    (10 bits of mantissa): CUDA with ``torch.backends.cuda.matmul``'s
    precision set so (``allow_tf32``, ``fp32_precision = "tf32"`` or
    ``torch.set_float32_matmul_precision("high")``). Read without raising
    where the old and new settings were mixed."""
    if device.type != "cuda" or dtype != torch.float32:
        return False
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)  # (torch >= 2.9; reflects the old setting too)
    if precision is not None:
        return precision not in ("ieee", "none")
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:
        return False


_tf32_warned = False


def _warn_tf32() -> None:
    """Once a process: greedy output can differ from plain greedy's."""
    global _tf32_warned
    if not _tf32_warned:
        _tf32_warned = True
        logger.warning("pld: float32 products run in TF32 on this GPU (torch.backends.cuda.matmul): a verification "
                       "forward over several tokens rounds differently from a one-token one, so a near-tie can "
                       "flip and greedy output differ from plain greedy's, as in half precision; "
                       "torch.backends.cuda.matmul.fp32_precision = \"ieee\" keeps float32 products")


def masks_blocker(model: Any) -> Optional[str]:
    """Why pld's 4D masks (trees, batches with holes) cannot serve
    ``model`` exactly, or None."""
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager"
    if attn not in ("eager", "sdpa"):
        return f"its attention implementation ({attn}) takes no 4D attention mask"
    return model_traits(model).custom_masks


def _loop_cache(model: Any, batch: int, prompt_len: int, config: Any) -> Any:
    """The run's cache when the caller gives none: pld.kv_cache's, with
    room for the prompt, the first stretch of output and a draft or two (it
    doubles as the output grows); sliding-window layers kept whole, since
    the masks apply the windows and a crop never loses a state."""
    from .row_state import INITIAL_NEW_TOKENS

    draft = config.prompt_lookup_num_tokens + 1
    room = min(config.max_new_tokens, INITIAL_NEW_TOKENS) + draft * (2 if batch > 1 else 1)
    return cache_for(model, capacity=prompt_len + room, keep_sliding=True)


def bind_corpus(model: Any, corpus: Any) -> None:
    """Check that ``corpus`` (a pld.Corpus) holds ids of this model's
    tokenizer: none beyond its vocabulary, and the model's signature
    (vocabulary size and special ids) the one it was first used with;
    a ValueError says which."""
    from .corpus import model_signature

    config = getattr(model, "config", None)
    embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    vocab = int(weight.shape[0]) if weight is not None else int(getattr(config, "vocab_size", 0) or 0)
    corpus.bind(vocab, model_signature(vocab, config))


# --------------------------------------------------------------- the adapter

class TransformersAdapter:
    """A transformers causal LM and the KV cache it fills, for one generation.

    ``cache`` is an empty transformers cache with ``crop`` (an OwnedCache
    for trees and batches). The adapter counts the cache's slots
    (``cached``); after the first forward it checks that the model filled
    the cache it was given, and with ``check_cache`` after every
    truncation that the cache holds exactly the slots the step kept.
    """

    def __init__(self, model: Any, cache: Any, linear_kernel: str = "auto",
                 check_cache: bool = False, traits: Optional[ModelTraits] = None) -> None:
        self.model = model
        self.cache = cache
        self.cached = 0
        self.forwards = 0
        self.check_cache = check_cache
        self.traits = traits if traits is not None else model_traits(model)
        if self.traits.reason is not None:
            raise ValueError(f"model: {type(model).__name__} cannot be used by pld's loop: {self.traits.reason}")
        self.dtype = _model_dtype(model)
        self._kernel_mode = linear_kernel
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()
        #: whether a layer records its past until a crop (5.x sliding-window and linear-attention layers)
        self._records_past = any(getattr(layer, "record_past", False) for layer in getattr(cache, "layers", ()))

    @contextlib.contextmanager
    def kernels(self) -> Iterator[None]:
        """The kernel choices of the run (pld.cpu_kernels): for a model on
        the CPU, its linear layers on the chosen matrix product and
        grouped-query attention over shared heads; a model elsewhere runs
        its own kernels, and none of this machinery is entered."""
        with cpu_kernels(self.model, self._kernel_mode):
            yield

    def learned_cost(self, key: Tuple, probe: Any, widths: Any, synchronize: Any) -> Any:
        """The model's learned forward cost under ``key``
        (pld.forward_cost.learned: kept per model, or made by ``probe``)."""
        from . import forward_cost

        with torch.no_grad():
            return forward_cost.learned(self.model, key, probe, widths, clock=forward_cost.clock,
                                        synchronize=synchronize)

    # -- forwards ------------------------------------------------------------
    def forward_rows(self, ids: torch.Tensor, positions: torch.Tensor, mask: Any, keep_last: int,
                     cache: Any = None) -> torch.Tensor:
        """Logits [b, keep_last, V] of the last ``keep_last`` tokens of each
        row of ``ids`` ([b, m], after the cached slots), whose positions
        are ``positions`` ([b, m]); ``mask`` is a 2D padding mask over all
        slots ([b, cached + m]: transformers builds the causal masks) or
        what :meth:`masks` made. The cache then holds cached + m slots.
        ``cache``: another cache to fill instead (a probe's)."""
        traits = self.traits
        m = ids.shape[1]
        # (a copy: some releases' models add an offset to position_ids in place)
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions.clone(),
                  traits.cache_argument: self.cache if cache is None else cache, "use_cache": True}
        if traits.logits_to_keep:
            inputs["logits_to_keep"] = keep_last
        out = self.model(**inputs)
        if cache is not None:
            return out.logits[:, -keep_last:]
        if self.forwards == 0:
            self._check_filled(self.cached + m)
        self.forwards += 1
        self.cached += m
        return out.logits[:, -keep_last:]

    def masks(self, allowed: torch.Tensor, key_positions: torch.Tensor,
              query_positions: torch.Tensor) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """The attention mask(s) of a forward whose queries ([b, q], at
        ``query_positions``) see the keys ``allowed`` says ([b, q, cached +
        q] bool; every key at ``key_positions`` [b, cached + q]), each
        sliding-window layer's window applied (pld.attention_masks)."""
        return layer_masks(allowed, key_positions, query_positions, self.traits.kinds, self.dtype)

    # -- the cache -----------------------------------------------------------
    def truncate_cache(self, n: int) -> None:
        """Keep the first ``n`` cached slots (n <= cached)."""
        drop = self.cached - n
        if drop > 0:  # (crop(0) empties a 4.57 cache)
            self.cache.crop(-drop)
        elif self._records_past:
            # a crop after every forward, as transformers' assisted decoding does: layers that record
            # their past trim it to what the next forward needs (5.17's sliding-window layer returns
            # more keys than its mask covers without one)
            self.cache.crop(0)
        self.cached = n
        self._check_held(n)

    def keep_cache(self, m: int, offsets: list) -> None:
        """Of the newest ``m`` cached slots keep those at ``offsets``
        (increasing), moved after the older ones: a token tree's accepted
        path (the cache needs ``keep_last``: pld.kv_cache.OwnedCache)."""
        self.cache.keep_last(m, offsets)
        self.cached = self.cached - m + len(offsets)
        self._check_held(self.cached)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows at ``index`` (finished rows leave)."""
        self.cache.batch_select_indices(index)

    def gather_slots(self, index: torch.Tensor) -> None:
        """Row r's new slot j is its old slot ``index[r, j]`` ([b, width]):
        the cache then holds ``width`` slots."""
        width = index.shape[1]
        for layer in self.cache.layers:
            k, v = layer.keys, layer.values
            if k is None or k.dim() != 4:
                continue
            where = index[:, None, :, None]
            layer.keys = torch.gather(k, 2, where.expand(k.shape[0], k.shape[1], width, k.shape[3]))
            layer.values = torch.gather(v, 2, where.expand(v.shape[0], v.shape[1], width, v.shape[3]))
        self.cached = width
        self._check_held(width)

    def _check_held(self, n: int) -> None:
        if self.check_cache:
            held = self.cache.get_seq_length()
            if held != n:
                raise RuntimeError(f"pld: after a step the KV cache holds {held} tokens, the loop "
                                   f"counts {n} cached tokens")

    def _check_filled(self, expected: int) -> None:
        """After the first forward the cache must hold every token fed to it: a
        model that ignores the cache it is given (or keeps its own) would
        otherwise see only the newest tokens in the next step."""
        held = self.cache.get_seq_length()
        if held != expected:
            name = type(self.model).__name__
            raise ValueError(
                f"model: {name} did not fill the KV cache passed as {self.traits.cache_argument} (it holds "
                f"{held} tokens after a forward over {expected}); pld's loop needs a model that uses the "
                "cache it is given (use plain model.generate() for this model)")


def _input_vocabulary(model: Any) -> Optional[int]:
    """How many token ids the model embeds (its input embedding's rows,
    else its config's vocab_size; None when neither says)."""
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embeddings = None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is None:
        weight = getattr(embeddings, "weight", None)
        rows = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None
    if rows is None:
        config = getattr(model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        rows = getattr(text, "vocab_size", None)
    return int(rows) if isinstance(rows, int) and rows > 0 else None


def _model_dtype(model: Any) -> torch.dtype:
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32
