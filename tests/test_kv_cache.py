"""pld.kv_cache: the preallocated cache against transformers' DynamicCache.

Token-by-token greedy decoding gives the DynamicCache logits (float32) on
the tiny llama and gpt2 models, across several doublings of the buffers;
crop and keep_last followed by more tokens give what a fresh decode of the
kept sequence gives; model.generate, pld's loop and pld.enabled() take it
as their cache; cache_for falls back to DynamicCache for models it cannot
serve; the embedded model decodes the same tokens with it.
"""
from __future__ import annotations

import types

import pytest

from models_fixtures import ARCHS, as_ids, cache_kw, greedy, one_thread, repeated_prompt, tiny_model  # noqa: F401

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

ATOL = 1e-5
RTOL = 1e-5


def _forward(model, tokens, cache, start, position_ids=None, attention_mask=None):
    """Logits [q, V] of ``tokens`` fed after ``start`` cached tokens."""
    import torch

    ids = as_ids(tokens)
    if position_ids is None:
        position_ids = torch.arange(start, start + len(tokens))[None]
    kwargs = dict(**cache_kw(model, cache), use_cache=True, position_ids=position_ids)
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    with torch.no_grad():
        return model(ids, **kwargs).logits[0]


def _close(a, b):
    import torch

    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def _prompt(seed, n=12):
    import random

    rng = random.Random(seed)
    return [rng.randrange(70) for _ in range(n)]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_logits_equal_dynamic_cache(arch):
    """Prompt, then 60 greedy tokens one by one, from 2 slots: the buffers
    double five times and every step's logits match DynamicCache's."""
    from transformers import DynamicCache

    from pld.kv_cache import OwnedCache

    model = tiny_model(arch)
    prompt = _prompt(1)
    ours, theirs = OwnedCache(capacity=2), DynamicCache()
    a, b = _forward(model, prompt, ours, 0), _forward(model, prompt, theirs, 0)
    _close(a, b)
    capacities = {ours.capacity}
    n = len(prompt)
    token = int(b[-1].argmax())
    for _ in range(60):
        a, b = _forward(model, [token], ours, n), _forward(model, [token], theirs, n)
        _close(a, b)
        assert int(a[-1].argmax()) == int(b[-1].argmax())
        n += 1
        token = int(b[-1].argmax())
        assert ours.get_seq_length() == theirs.get_seq_length() == n
        capacities.add(ours.capacity)
    assert sorted(capacities) == [12, 24, 48, 96]  # the prompt's 12, then doublings
    for mine, ref in zip(ours.layers, theirs.layers):
        _close(mine.keys, ref.keys)
        _close(mine.values, ref.values)
        assert mine.keys.shape == ref.keys.shape


def test_growth_keeps_contents_and_doubles():
    """One token at a time from one slot: capacity 1, 2, 4, ..., 64, and the
    buffers' used part always equals the concatenation of what went in."""
    import torch

    from pld.kv_cache import OwnedLayer

    layer = OwnedLayer(capacity=1)
    torch.manual_seed(0)
    ks, vs, seen = [], [], []
    for _ in range(50):
        k, v = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 5)  # value head size may differ
        ks.append(k)
        vs.append(v)
        keys, values = layer.update(k, v)
        seen.append(layer.capacity)
        assert torch.equal(keys, torch.cat(ks, dim=2)) and torch.equal(values, torch.cat(vs, dim=2))
        assert keys.data_ptr() == layer._k.data_ptr()  # a view of the buffer, no copy
    assert sorted(set(seen)) == [1, 2, 4, 8, 16, 32, 64]
    # a forward of many tokens grows past doubling at once
    big = torch.randn(2, 3, 200, 4)
    keys, _ = layer.update(big, torch.randn(2, 3, 200, 5))
    assert layer.get_seq_length() == 250 and layer.capacity == 250
    assert torch.equal(keys[:, :, 50:], big)


def test_update_checks_layout():
    import torch

    from pld.kv_cache import OwnedLayer

    layer = OwnedLayer(capacity=8)
    layer.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    for k in (torch.zeros(2, 2, 1, 4), torch.zeros(1, 2, 1, 4, dtype=torch.float64)):
        with pytest.raises(ValueError, match="do not match"):
            layer.update(k, k)
    layer.reset()  # empty: a new layout is taken
    keys, _ = layer.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))
    assert keys.shape == (2, 2, 1, 4)


@pytest.mark.parametrize("arch", ARCHS)
def test_crop_then_continue_equals_fresh_decode(arch):
    from transformers import DynamicCache

    from pld.kv_cache import OwnedCache

    model = tiny_model(arch)
    prompt, extra, more = _prompt(2, 20), _prompt(3, 6), _prompt(4, 3)
    cache = OwnedCache(capacity=16)
    _forward(model, prompt, cache, 0)
    _forward(model, extra, cache, len(prompt))
    capacity = cache.capacity
    cache.crop(-4)  # keeps extra[:2]
    assert cache.get_seq_length() == len(prompt) + 2 and cache.capacity == capacity
    ours = _forward(model, more, cache, len(prompt) + 2)
    fresh = _forward(model, prompt + extra[:2] + more, DynamicCache(), 0)[-len(more):]
    _close(ours, fresh)
    cache.crop(-1000)
    assert cache.get_seq_length() == 0
    _close(_forward(model, prompt, cache, 0), _forward(model, prompt, DynamicCache(), 0))


def test_crop_follows_the_installed_release():
    """A negative n drops from the end everywhere; a positive n is the
    length to keep in 4.57 and an error in 5.x, as DynamicLayer's crop.
    Dropping more than is held empties the cache (4.57's DynamicLayer
    would wrap around and keep all but one)."""
    import torch
    from transformers import DynamicCache

    from pld import kv_cache

    def filled(cls):
        cache = cls()
        for i in range(2):
            cache.update(torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4), i)
        return cache

    for n in (-3, -10):
        ours, theirs = filled(kv_cache.OwnedCache), filled(DynamicCache)
        ours.crop(n)
        theirs.crop(n)
        assert ours.get_seq_length() == theirs.get_seq_length()
    ours = filled(kv_cache.OwnedCache)
    ours.crop(-11)
    assert ours.get_seq_length() == 0
    for n in (0, 4, 12):
        ours, theirs = filled(kv_cache.OwnedCache), filled(DynamicCache)
        try:
            theirs.crop(n)
        except ValueError:
            assert not kv_cache._LEGACY_CROP
            with pytest.raises(ValueError):
                ours.crop(n)
            continue
        ours.crop(n)
        assert ours.get_seq_length() == theirs.get_seq_length()


def _tree_mask(past, parents):
    """An additive [1, 1, q, past + q] mask: node i sees the past, itself and
    its ancestors (``parents[i]`` is the parent's index, -1 for a root)."""
    import torch

    q = len(parents)
    allowed = torch.zeros(q, past + q, dtype=torch.bool)
    allowed[:, :past] = True
    for i in range(q):
        j = i
        while j >= 0:
            allowed[i, past + j] = True
            j = parents[j]
    mask = torch.zeros(q, past + q)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask[None, None]


@pytest.mark.parametrize("arch", ARCHS)
def test_keep_last_tree_path_equals_decoding_the_path(arch):
    """A token tree after the prefix, verified in one forward under a tree
    mask; keeping the accepted path and feeding the next token at the
    position the caller gives equals decoding prefix + path from scratch."""
    import torch
    from transformers import DynamicCache

    from pld.kv_cache import OwnedCache

    model = tiny_model(arch)
    prefix = _prompt(5, 15)
    p = len(prefix)
    # tree: 0 a; 1 b (child of a); 2 b' (child of a); 3 c (child of b'); 4 x (child of b)
    tree = [11, 12, 13, 14, 15]
    parents = [-1, 0, 0, 2, 1]
    depth = [0, 1, 1, 2, 2]
    path = [0, 2, 3]  # a, b', c
    cache = OwnedCache(capacity=8)
    _forward(model, prefix, cache, 0)
    tree_logits = _forward(model, tree, cache, p, position_ids=torch.tensor([[p + d for d in depth]]),
                           attention_mask=_tree_mask(p, parents))
    cache.keep_last(len(tree), path)
    assert cache.get_seq_length() == p + len(path)
    nxt = [16, 17]
    ours = _forward(model, nxt, cache, p + len(path))
    reference = DynamicCache()
    fresh = _forward(model, prefix + [tree[i] for i in path] + nxt, reference, 0)
    _close(ours, fresh[-len(nxt):])
    _close(tree_logits[path], fresh[p:p + len(path)])  # the tree forward was right too
    for mine, ref in zip(cache.layers, reference.layers):
        _close(mine.keys, ref.keys)
        _close(mine.values, ref.values)


def test_keep_last_copies_its_index_to_a_device_once_for_all_layers(monkeypatch):
    """A tree step that keeps a path other than the block's prefix copies
    the kept offsets to the cache's device once, not once a layer (on a GPU
    each copy from host memory waits for the device). Meta tensors stand in
    for a device's."""
    import torch

    from pld.kv_cache import OwnedCache

    cache = OwnedCache(capacity=16)
    for layer in range(6):
        k = torch.empty(1, 2, 10, 4, device="meta")
        cache.update(k, k, layer)
    copies = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **kw: copies.append(a) or to(self, *a, **kw))
    cache.keep_last(4, [1, 3])
    assert cache.get_seq_length() == 8 and all(layer.keys.shape[2] == 8 for layer in cache.layers)
    assert len(copies) == 1


def test_keep_last_semantics():
    import torch

    from pld.kv_cache import OwnedCache

    cache = OwnedCache(capacity=4)
    k = torch.arange(10.0).reshape(1, 1, 10, 1)
    cache.update(k, -k, 0)
    cache.keep_last(6, torch.tensor([1, 4, 5]))  # of slots 4..9 keep 5, 8, 9
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 2, 3, 5, 8, 9]
    assert cache.layers[0].values.flatten().tolist() == [0, -1, -2, -3, -5, -8, -9]
    before = cache.layers[0]._k.data_ptr()
    cache.keep_last(3, [0, 1])  # a prefix: a crop
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 2, 3, 5, 8]
    cache.keep_last(2, [])
    assert cache.get_seq_length() == 4
    cache.keep_last(0, [])
    assert cache.get_seq_length() == 4 and cache.layers[0]._k.data_ptr() == before
    for m, bad in ((2, [1, 0]), (2, [0, 0]), (2, [2]), (2, [-1]), (5, [0])):
        with pytest.raises(ValueError):
            cache.keep_last(m, bad)
    with pytest.raises(TypeError):
        cache.keep_last(2, torch.tensor([0.0]))
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 2, 3]
    # on an adopted tensor (transformers assigned layer.keys) it copies first
    cache.batch_select_indices(torch.tensor([0]))
    adopted = cache.layers[0].keys
    cache.keep_last(3, [0, 2])
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 3]
    assert adopted.flatten().tolist() == [0, 1, 2, 3]
    cache.crop(-1)
    cache.update(torch.full((1, 1, 1, 1), 7.0), torch.full((1, 1, 1, 1), -7.0), 0)
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 7]
    cache.batch_select_indices(torch.tensor([0]))
    adopted = cache.layers[0].keys
    cache.crop(-2)
    cache.update(torch.full((1, 1, 1, 1), 8.0), torch.full((1, 1, 1, 1), -8.0), 0)
    assert cache.layers[0].keys.flatten().tolist() == [0, 8]
    assert adopted.flatten().tolist() == [0, 1, 7]


@pytest.mark.parametrize("arch", ARCHS)
def test_adopted_tensors_beam_style(arch):
    """transformers assigns layer.keys in batch_repeat_interleave /
    reorder_cache: the layer adopts the new tensors, never writes into
    them, and goes on like DynamicCache."""
    import torch
    from transformers import DynamicCache

    from pld.kv_cache import OwnedCache

    model = tiny_model(arch)
    prompt = _prompt(6, 10)
    results = []
    for cache in (OwnedCache(capacity=64), DynamicCache()):
        _forward(model, prompt, cache, 0)
        cache.batch_repeat_interleave(2)
        adopted = cache.layers[0].keys
        snapshot = adopted.clone()
        with torch.no_grad():
            out = model(torch.tensor([[3], [4]]), **cache_kw(model, cache), use_cache=True,
                        position_ids=torch.tensor([[10], [10]])).logits
            cache.reorder_cache(torch.tensor([1, 0]))
            out2 = model(torch.tensor([[5], [6]]), **cache_kw(model, cache), use_cache=True,
                         position_ids=torch.tensor([[11], [11]])).logits
        assert torch.equal(adopted, snapshot)
        results.append((out, out2, cache.get_seq_length()))
    _close(results[0][0], results[1][0])
    _close(results[0][1], results[1][1])
    assert results[0][2] == results[1][2] == 12


def test_reset_keeps_buffers():
    from transformers import DynamicCache

    from pld.kv_cache import OwnedCache

    model = tiny_model("llama")
    prompt = _prompt(7)
    cache = OwnedCache(capacity=32)
    _forward(model, prompt, cache, 0)
    pointer = cache.layers[0]._k.data_ptr()
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.layers[0]._k.data_ptr() == pointer
    other = _prompt(8, 5)
    _close(_forward(model, other, cache, 0), _forward(model, other, DynamicCache(), 0))
    assert cache.layers[0]._k.data_ptr() == pointer


@pytest.mark.parametrize("arch", ARCHS)
def test_model_generate_with_owned_cache(arch):
    from pld.kv_cache import OwnedCache

    model = tiny_model(arch)
    ids = as_ids(_prompt(9, 10))
    cache = OwnedCache(capacity=4)
    assert greedy(model, ids, 40, **cache_kw(model, cache)) == greedy(model, ids, 40)
    assert cache.get_seq_length() == 10 + 40 - 1  # the last token is never fed
    assert cache.capacity >= 49


@pytest.mark.parametrize("arch", ARCHS)
def test_pld_loop_and_enabled_generate_with_owned_cache(arch):
    """pld's loop crops the cache after every partly rejected draft: with
    an OwnedCache passed as its cache (and through generate under
    pld.enabled()) the tokens are plain greedy's."""
    import random

    import torch

    import pld
    from pld import loop
    from pld.kv_cache import OwnedCache

    model = tiny_model(arch)
    rng = random.Random(10)
    rejected = 0
    for _ in range(4):
        ids = as_ids(repeated_prompt(rng))
        want = greedy(model, ids, 30)
        with torch.no_grad():
            result = loop.run(model, ids, cache=OwnedCache(capacity=8), max_new_tokens=30,
                              prompt_lookup_num_tokens=5, linear_kernel="torch")
        assert result.sequences[0, ids.shape[1]:].tolist() == want
        assert isinstance(result.past_key_values, OwnedCache)
        rejected += result.stats.proposed_tokens - result.stats.accepted_draft_tokens
        cache = OwnedCache(capacity=8)
        with pld.enabled(cost_aware=False, linear_kernel="torch"), torch.no_grad():
            out = model.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=None,
                                 prompt_lookup_num_tokens=5, **cache_kw(model, cache))
        assert out[0, ids.shape[1]:].tolist() == want
        assert cache.get_seq_length() > ids.shape[1]  # it was the cache used
    assert rejected > 0  # crops happened


def test_cache_for_falls_back_with_a_reason():
    from transformers import DynamicCache, MistralConfig
    from transformers.cache_utils import DynamicLayer

    from pld import kv_cache

    for arch in ARCHS:
        model = tiny_model(arch)
        assert kv_cache.unsupported_reason(model) is None
        cache = kv_cache.cache_for(model, capacity=16)
        assert isinstance(cache, kv_cache.OwnedCache) and len(cache.layers) == 2
    sliding = MistralConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, sliding_window=16)
    model = types.SimpleNamespace(config=sliding)
    reason = kv_cache.unsupported_reason(model)
    assert reason is not None and "DynamicSlidingWindowLayer" in reason
    cache = kv_cache.cache_for(model)
    assert type(cache) is DynamicCache and type(cache.layers[0]) is not DynamicLayer
    with pytest.raises(ValueError, match="cannot serve"):
        kv_cache.OwnedCache(config=sliding)
    assert "stateful" in kv_cache.unsupported_reason(types.SimpleNamespace(_is_stateful=True, config=sliding))
    assert "encoder-decoder" in kv_cache.unsupported_reason(
        types.SimpleNamespace(config=types.SimpleNamespace(is_encoder_decoder=True)))
    assert kv_cache.unsupported_reason(types.SimpleNamespace()) == "it has no config"
    with pytest.raises(ValueError):
        kv_cache.OwnedCache(capacity=0)
    with pytest.raises(TypeError):
        kv_cache.OwnedCache(capacity=2.0)


def test_reserve_ahead():
    from pld.kv_cache import OwnedCache

    model = tiny_model("llama")
    cache = OwnedCache(capacity=2)
    cache.reserve(100)  # before the layers exist: their first allocation
    _forward(model, _prompt(11, 5), cache, 0)
    assert cache.capacity == 100
    pointer = cache.layers[0]._k.data_ptr()
    for i in range(20):
        _forward(model, [i], cache, 5 + i)
    assert cache.layers[0]._k.data_ptr() == pointer and cache.capacity == 100
    cache.reserve(300)
    assert cache.capacity == 300 and cache.get_seq_length() == 25


@pytest.fixture(scope="module")
def embedded(one_thread):  # noqa: F811 - load on one thread too
    from pld import models

    try:
        models.embedded_model_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return models.load()


def test_embedded_model_greedy_tokens(embedded):
    from pld.bench import demo
    from pld.kv_cache import OwnedCache, cache_for

    model, tokenizer = embedded
    ids = demo.build_input_ids(tokenizer, "Name three rivers of Europe and one fact about each.")
    assert isinstance(cache_for(model), OwnedCache)
    cache = OwnedCache(capacity=ids.shape[1] + 24)
    ours = greedy(model, ids, 24, **cache_kw(model, cache))
    assert ours == greedy(model, ids, 24)
    assert cache.get_seq_length() == ids.shape[1] + 23


@pytest.mark.parametrize("arch", ARCHS)
def test_bench_methods_with_owned_cache(arch):
    import random

    from pld.bench import methods

    model = tiny_model(arch)
    setup = methods.Setup(model=model, max_new_tokens=24, prompt_lookup_num_tokens=5, max_matching_ngram_size=3)
    runs = methods.build([methods.REGISTRY[n] for n in ("greedy", "greedy_owncache", "pld_owncache")], setup)
    ids = as_ids(repeated_prompt(random.Random(12)))
    want = runs["greedy"](ids)[0].tolist()
    assert runs["greedy_owncache"](ids)[0].tolist() == want
    assert runs["pld_owncache"](ids)[0].tolist() == want
