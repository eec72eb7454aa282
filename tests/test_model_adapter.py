"""The model adapter (pld.hf_adapter) and the masks it builds
(pld.attention_masks): what it finds out about a model by trying it, the
sliding windows of a batch with holes, ALiBi models sent to exact
fallbacks, the cache keyword and the crop's sign on every release.
"""
from __future__ import annotations

import random

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


def test_window_keeps_what_transformers_sliding_mask_keeps():
    """For a row without holes, a key at distance d from the query is seen
    by a window-W layer iff transformers' own sliding mask sees it."""
    import torch
    from transformers.masking_utils import causal_mask_function, sliding_window_overlay

    from pld.attention_masks import within_window

    for window in (1, 2, 5):
        n = 9
        positions = torch.arange(n)[None]
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None]
        ours = within_window(causal, positions, positions, window)[0]
        theirs = sliding_window_overlay(window)
        for q in range(n):
            for k in range(n):
                want = causal_mask_function(0, 0, q, k) and theirs(0, 0, q, k)
                assert bool(ours[q, k]) == bool(want), (window, q, k)


def test_layer_masks_by_kind():
    import torch

    from pld.attention_masks import layer_masks

    allowed = torch.ones(1, 2, 6, dtype=torch.bool)
    keys = torch.arange(6)[None]
    queries = torch.tensor([[4, 5]])
    full = layer_masks(allowed, keys, queries, [("full_attention", None)] * 2, torch.float32)
    assert full.shape == (1, 1, 2, 6) and bool((full == 0).all())
    both = layer_masks(allowed, keys, queries, [("sliding_attention", 2), ("full_attention", None)],
                       torch.float32)
    assert set(both) == {"sliding_attention", "full_attention"}
    seen = both["sliding_attention"][0, 0] == 0
    # (allowed lets every query see every key: the window alone cuts)
    assert seen.tolist() == [[False, False, False, True, True, True], [False, False, False, False, True, True]]
    with pytest.raises(ValueError):
        layer_masks(allowed, keys, queries, [("sliding_attention", 2), ("sliding_attention", 3)], torch.float32)


def _sliding_model(window):
    """A context-sensitive (sharp) tiny Mistral with a ``window``-token
    sliding window: a key one slot outside or inside the window changes
    its tokens."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=mf.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                           max_position_embeddings=512, pad_token_id=mf.PAD, attn_implementation="sdpa")
    torch.manual_seed(3)
    model = MistralForCausalLM(config).eval()
    qk, v = mf.SHARP_SCALES["llama"]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(qk)
            layer.self_attn.k_proj.weight.mul_(qk)
            layer.self_attn.v_proj.weight.mul_(v)
    return model


def test_a_batch_with_holes_keeps_each_rows_own_window():
    """Rows of different lengths, drafts rejected (holes), contexts many
    windows long: every row is its greedy output alone, natively (4D masks
    with each row's window by its own positions)."""
    import torch

    import pld
    from pld.hf_adapter import model_traits

    model = _sliding_model(window=6)
    assert model_traits(model).custom_masks is None
    rng = random.Random("window")
    for trial in range(3):
        prompts = [mf.repeated_prompt(rng) for _ in range(3)]
        L = max(map(len, prompts))
        ids = torch.tensor([[mf.PAD] * (L - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        gen = pld.generate(model, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=None,
                           prompt_lookup_num_tokens=4, cost_aware=False)
        alone = [mf.greedy(model, mf.as_ids(p), 30) for p in prompts]
        assert gen.new_tokens == alone, trial
        assert gen.stats.proposed_tokens > gen.stats.accepted_draft_tokens  # rejected drafts: holes
    tree = pld.generate(model, mf.as_ids(prompts[0]), max_new_tokens=30, eos_token_id=None, draft_tree=True)
    assert tree.new_tokens == alone[0]


def test_alibi_models_are_found_out_and_decoded_exactly():
    """MPT's ALiBi bias follows cache slots and Bloom's the 2D mask: the
    probe finds that pld's 4D masks would change their logits, and their
    trees and batches take exact paths."""
    import torch
    from transformers import BloomConfig, BloomForCausalLM, MptConfig, MptForCausalLM

    import pld
    from pld.hf_adapter import model_traits

    torch.manual_seed(0)
    mpt = MptForCausalLM(MptConfig(vocab_size=mf.VOCAB, d_model=32, n_heads=4, n_layers=2,
                                   max_seq_len=256)).eval()
    bloom = BloomForCausalLM(BloomConfig(vocab_size=mf.VOCAB, hidden_size=32, n_head=4, n_layer=2)).eval()
    assert "logits" in model_traits(mpt).custom_masks
    assert model_traits(bloom).custom_masks is not None
    rng = random.Random("alibi")
    prompts = [mf.repeated_prompt(rng) for _ in range(3)]
    L = max(map(len, prompts))
    ids = torch.tensor([[mf.PAD] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    for model in (mpt, bloom):
        alone = [mf.greedy(model, mf.as_ids(p), 24) for p in prompts]
        gen = pld.generate(model, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=None)
        assert gen.new_tokens == alone
        tree = pld.generate(model, mf.as_ids(prompts[1]), max_new_tokens=24, eos_token_id=None,
                            draft_tree=True)
        assert tree.new_tokens == alone[1]


def test_mpt_logits_do_change_under_a_hole():
    """What the probe relies on, seen directly: MPT's logits after a hole
    in the cache differ from plain decoding's (so its batch must not take
    holes), a RoPE model's do not."""
    import torch
    from transformers import MptConfig, MptForCausalLM

    from pld.hf_adapter import _check_custom_masks, TransformersAdapter, model_traits

    torch.manual_seed(0)
    mpt = MptForCausalLM(MptConfig(vocab_size=mf.VOCAB, d_model=32, n_heads=4, n_layers=2,
                                   max_seq_len=256)).eval()
    ids = torch.tensor([[5, 9, 14, 3, 22, 40]])
    for model, exact in ((mpt, False), (mf.tiny_model("llama"), True)):
        adapter = TransformersAdapter(model, None, "torch", traits=model_traits(model))
        with torch.no_grad():
            assert (_check_custom_masks(adapter, ids) is None) == exact


def test_the_cache_keyword_is_found_by_trying():
    """A model whose forward takes the cache under either name (or only
    through **kwargs) gets it under the name that fills it."""
    import torch

    from pld.hf_adapter import model_traits

    inner = mf.tiny_model("llama")

    class Wrapper(torch.nn.Module):
        """Passes **kwargs on under the installed release's name only."""

        def __init__(self, model, name):
            super().__init__()
            self.inner, self.name, self.config = model, name, model.config

        def forward(self, input_ids=None, **kwargs):
            cache = kwargs.pop(self.name, None)
            kwargs.pop("cache", None), kwargs.pop("past_key_values", None)
            return self.inner(input_ids=input_ids, **{model_traits(self.inner).cache_argument: cache}, **kwargs)

    for name in ("cache", "past_key_values"):
        assert model_traits(Wrapper(inner, name)).cache_argument == name


def test_truncation_crops_from_the_end_on_this_release():
    """truncate_cache(n) keeps the first n tokens (a negative crop: the
    sign transformers 5.x requires; 4.57 takes either)."""
    import torch

    from pld.hf_adapter import TransformersAdapter
    from pld.kv_cache import OwnedCache

    model = mf.tiny_model("llama")
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    adapter = TransformersAdapter(model, OwnedCache(16), "torch", check_cache=True)
    with torch.no_grad():
        adapter.forward_rows(ids, torch.arange(6)[None], torch.ones_like(ids), 1)
        adapter.truncate_cache(4)
        got = adapter.forward_rows(ids[:, 4:5], torch.tensor([[4]]), torch.ones(1, 5, dtype=torch.long), 1)[0]
        want = model(ids[:, :5]).logits[0, -1:]
    assert adapter.cache.get_seq_length() == 5
    assert torch.allclose(got, want, atol=1e-5)



def test_a_cache_that_records_its_past_is_cropped_after_every_step():
    """transformers 5.x's sliding-window layers (and linear-attention ones)
    keep all that each forward adds until a crop. The adapter crops after
    every step, one whose tokens were all kept (``crop(0)``) included, as
    transformers' assisted decoding does: a sliding layer then holds one
    window, and the next forward's logits are the model's. (Under 5.17 a
    sliding layer not cropped returns more keys than its mask covers: a
    shape error in the next forward.)"""
    import torch
    from transformers import DynamicCache

    from pld.bench import arch_zoo
    from pld.hf_adapter import TransformersAdapter

    model = arch_zoo.tiny_arch_model("mistral")
    cache = DynamicCache(config=model.config)
    window = model.config.sliding_window
    if not any(hasattr(layer, "activate_past_recording") for layer in getattr(cache, "layers", ())):
        pytest.skip("this transformers release's cache layers do not record their past")
    ids = torch.tensor([arch_zoo.periodic_prompt(3, 2 * window + 2)])
    n = ids.shape[1] - 2
    adapter = TransformersAdapter(model, cache, "torch", check_cache=True)
    with torch.no_grad():
        adapter.forward_rows(ids[:, :n], torch.arange(n)[None], torch.ones(1, n, dtype=torch.long), 1)
        adapter.truncate_cache(n)  # every token kept
        sliding = [layer for layer in cache.layers if getattr(layer, "is_sliding", False)]
        assert sliding and all(layer.keys.shape[-2] < window for layer in sliding)
        got = adapter.forward_rows(ids[:, n:], torch.arange(n, n + 2)[None], torch.ones(1, n + 2, dtype=torch.long), 2)
        want = model(ids).logits[:, -2:]
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("fault", ["fails", "differs"])
def test_a_model_whose_verification_forward_is_wrong_is_refused(fault, caplog):
    """A draft's verification is a forward over several tokens after cached
    ones. A model whose such forward fails (transformers 5.10's
    glm_moe_dsa: a shape error, in its own prompt lookup too) or gives other
    logits than one forward is refused with the reason: pld.generate
    raises a ValueError naming it, and under pld.enable() generate() goes
    to transformers' plain decoding (its own prompt lookup needs the same
    forward), with one warning naming it."""
    import logging

    import torch
    from transformers import LlamaForCausalLM

    import pld
    from pld.hf_adapter import model_traits

    class WideForwardFault(LlamaForCausalLM):
        def forward(self, input_ids=None, **kwargs):
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            out = super().forward(input_ids=input_ids, **kwargs)
            if input_ids is not None and input_ids.shape[1] > 1 and cache is not None \
                    and cache.get_seq_length() > input_ids.shape[1]:
                if fault == "fails":
                    raise RuntimeError("index 44 is out of bounds for dimension 2 with size 41")
                out.logits = out.logits.flip(-1)
            return out

    base = mf.tiny_model("llama")
    model = WideForwardFault(base.config).eval()
    model.load_state_dict(base.state_dict())
    model.generation_config = base.generation_config
    assert "3 tokens after 3 cached ones" in model_traits(model).reason
    assert model_traits(base).reason is None
    ids = mf.as_ids(_prompts_for_fault()[0])
    with pytest.raises(ValueError, match="3 tokens after 3 cached ones"):
        pld.generate(model, ids, max_new_tokens=8, eos_token_id=None)
    # (an eos id: 4.57's and 5.0's own prompt lookup fail without one)
    kw = dict(do_sample=False, max_new_tokens=8, prompt_lookup_num_tokens=4, eos_token_id=mf.PAD)

    with torch.no_grad():
        want = model.generate(ids, **dict(kw, prompt_lookup_num_tokens=None)).tolist()
        with caplog.at_level(logging.WARNING, logger="pld"), pld.enabled():
            assert model.generate(ids, **kw).tolist() == want
    lines = [r.getMessage() for r in caplog.records if r.name == "pld"]
    assert len(lines) == 1 and "3 tokens after 3 cached ones" in lines[0], lines
    assert "without prompt lookup" in lines[0]


def _prompts_for_fault():
    return [mf.repeated_prompt(random.Random("wide-forward"))]
