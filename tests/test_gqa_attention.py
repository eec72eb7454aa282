"""pld.gqa_attention: shared key/value heads without copies, same numbers.

On a tiny Llama whose 4 query heads share 2 key/value heads: a forward
over several new tokens after a cached prompt gives bit-identical logits
with and without the switch, without transformers' repeat_kv copies while
it is active; one-token forwards keep transformers' own path; the switch
is undone after an exception; pld's loop runs inside it. Across threads:
the switch acts only in a thread inside the block, stays in place until the
last block (in any thread) leaves, and nests.
"""
from __future__ import annotations

import inspect
import random
import threading

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

torch = pytest.importorskip("torch")

from pld.gqa_attention import shared_kv_heads  # noqa: E402

sdpa = pytest.importorskip("transformers.integrations.sdpa_attention")


@pytest.fixture
def repeat_calls(monkeypatch):
    calls = []
    real = sdpa.repeat_kv

    def counting(hidden_states, n_rep):
        calls.append(tuple(hidden_states.shape))
        return real(hidden_states, n_rep)

    monkeypatch.setattr(sdpa, "repeat_kv", counting)
    return calls


def _forward(model, prompt, new):
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=prompt, **mf.cache_kw(model, cache), use_cache=True)
        ids = torch.cat([prompt, new], dim=1)
        out = model(input_ids=new, **mf.cache_kw(model, cache), use_cache=True,
                    attention_mask=torch.ones_like(ids))
    return out.logits


@pytest.mark.parametrize("width", [2, 5, 11])
def test_same_logits_without_copies(width, repeat_calls):
    model = mf.tiny_model("llama")
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    gen = torch.Generator().manual_seed(width)
    prompt = torch.randint(0, mf.PROMPT_VOCAB, (1, 40), generator=gen)
    new = torch.randint(0, mf.PROMPT_VOCAB, (1, width), generator=gen)
    expected = _forward(model, prompt, new)
    assert repeat_calls, "transformers copies the shared heads here (else this tests nothing)"
    repeat_calls.clear()
    with shared_kv_heads() as active:
        got = _forward(model, prompt, new)
    assert active
    assert repeat_calls == []
    assert torch.equal(got, expected)


def test_one_token_forwards_keep_transformers_path(monkeypatch):
    asked = []
    original = sdpa.use_gqa_in_sdpa

    def spy(*args):
        asked.append(original(*args))
        return asked[-1]

    monkeypatch.setattr(sdpa, "use_gqa_in_sdpa", spy)
    model = mf.tiny_model("llama")
    prompt = torch.randint(0, mf.PROMPT_VOCAB, (1, 30))
    # transformers 4.57 asks (attention_mask, key), 5.x (attention_mask, key, value)
    arity = len(inspect.signature(original).parameters)
    with shared_kv_heads():
        patched = sdpa.use_gqa_in_sdpa

        def ask(mask, key, value):
            return patched(*(mask, key, value)[:arity])

        mask = torch.ones(1, 1, 1, 31, dtype=torch.bool)
        key = torch.zeros(1, 2, 31, 8)
        assert ask(mask, key, key) == original(*(mask, key, key)[:arity])  # one query token
        wide = torch.ones(1, 1, 3, 33, dtype=torch.bool)
        assert ask(wide, key, key) is True                                 # several
        if arity == 3:
            assert ask(wide, key, key[..., :4]) is False                   # head dims differ
        _forward(model, prompt, prompt[:, :1])
    assert sdpa.use_gqa_in_sdpa is spy


def test_undone_after_an_exception():
    before = sdpa.use_gqa_in_sdpa
    with pytest.raises(RuntimeError, match="boom"):
        with shared_kv_heads():
            assert sdpa.use_gqa_in_sdpa is not before
            raise RuntimeError("boom")
    assert sdpa.use_gqa_in_sdpa is before


def test_the_loop_reads_shared_heads_in_place(repeat_calls):
    from transformers import DynamicCache

    from pld import loop

    model = mf.tiny_model("llama")
    rng = random.Random("gqa-loop")
    drafted = 0
    for _ in range(4):
        ids = mf.as_ids(mf.repeated_prompt(rng))
        with torch.no_grad():
            result = loop.run(model, ids, cache=DynamicCache(), max_new_tokens=16, prompt_lookup_num_tokens=4,
                              record_steps=True, cost_aware=False)  # every draft: wide forwards
        drafted += sum(1 for r in result.stats.records[1:] if r.proposed)
    assert drafted > 0
    assert repeat_calls == []


# -- threads ------------------------------------------------------------------

WAIT = 60  # seconds a thread waits for another before the test fails


def _ask_wide() -> bool:
    """What transformers' attention (its module function, looked up now)
    answers for a three-token query with a mask over shared CPU heads:
    False from transformers itself, True from the switch."""
    arity = len(inspect.signature(_ORIGINAL).parameters)
    mask = torch.ones(1, 1, 3, 33, dtype=torch.bool)
    key = torch.zeros(1, 2, 33, 8)
    return sdpa.use_gqa_in_sdpa(*(mask, key, key)[:arity])


_ORIGINAL = sdpa.use_gqa_in_sdpa


def _in_threads(*targets):
    mf.in_threads(*targets, wait=WAIT)


def test_the_switch_outlives_a_thread_that_leaves_first():
    """A enters, B enters, A leaves while B is inside: B still gets the
    switch; after both, transformers' function is the original again."""
    assert not _ask_wide()
    both_in = threading.Barrier(2, timeout=WAIT)
    a_left = threading.Event()
    seen = {}

    def a():
        with shared_kv_heads() as active:
            assert active
            both_in.wait()
            seen["a"] = _ask_wide()
        a_left.set()

    def b():
        with shared_kv_heads():
            both_in.wait()
            assert a_left.wait(WAIT)
            seen["b_after_a"] = _ask_wide()
            seen["installed"] = sdpa.use_gqa_in_sdpa is not _ORIGINAL

    _in_threads(a, b)
    assert seen == {"a": True, "b_after_a": True, "installed": True}
    assert sdpa.use_gqa_in_sdpa is _ORIGINAL
    assert not _ask_wide()


def test_a_thread_outside_keeps_transformers_path(repeat_calls):
    """While thread A is inside, another thread gets transformers' own
    answer and its forwards copy the heads as transformers does."""
    model = mf.tiny_model("llama")
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, mf.PROMPT_VOCAB, (1, 30), generator=gen)
    new = torch.randint(0, mf.PROMPT_VOCAB, (1, 4), generator=gen)
    expected = _forward(model, prompt, new)
    a_in, outside_done = threading.Event(), threading.Event()
    seen = {}

    def a():
        with shared_kv_heads():
            a_in.set()
            assert outside_done.wait(WAIT)
            repeat_calls.clear()
            seen["inside"] = (_ask_wide(), torch.equal(_forward(model, prompt, new), expected),
                              len(repeat_calls))

    def outside():
        assert a_in.wait(WAIT)
        try:
            repeat_calls.clear()
            seen["outside"] = (_ask_wide(), torch.equal(_forward(model, prompt, new), expected),
                               len(repeat_calls) > 0)
            seen["installed"] = sdpa.use_gqa_in_sdpa is not _ORIGINAL
        finally:
            outside_done.set()

    _in_threads(a, outside)
    assert seen == {"outside": (False, True, True), "installed": True, "inside": (True, True, 0)}
    assert sdpa.use_gqa_in_sdpa is _ORIGINAL


def test_nested_blocks_in_one_thread():
    with shared_kv_heads():
        with shared_kv_heads():
            assert _ask_wide()
        assert _ask_wide()  # the outer block still holds it
        assert sdpa.use_gqa_in_sdpa is not _ORIGINAL
    assert sdpa.use_gqa_in_sdpa is _ORIGINAL
    assert not _ask_wide()
