"""Tiny random transformers models and prompts for the integration tests.

Nothing here imports torch or transformers at import time: the test modules
that use it carry the ``torch`` marker, and a run with ``-m "not torch"``
must be able to collect them without loading torch.

The models are built from configs (no Hub access), in float32 and eval
mode, with fixed seeds; ``pad_token_id`` is the last id of the vocabulary,
which prompts never use. Their generation config has no eos: a test passes
the eos it wants explicitly.
"""
from __future__ import annotations

import functools
import os
import random
from typing import Any, List, Optional, Sequence

import pytest

VOCAB = 80
PAD = VOCAB - 1
PROMPT_VOCAB = VOCAB - 2  # prompts use ids 0 .. VOCAB - 3

# The device of the tests that can run elsewhere (the sampling laws, the
# device draws, the CPU machinery's entry): the CPU unless PLD_TEST_DEVICE
# names another (``PLD_TEST_DEVICE=cuda`` in .ci/gpu's device-tests part).
DEVICE = os.environ.get("PLD_TEST_DEVICE", "cpu")

ARCHS = ("llama", "gpt2")
ALL_ARCHS = ARCHS + ("gpt2-untied",)


@pytest.fixture(scope="module", autouse=False)
def one_thread():
    """Run the module's tests with one intra-op thread (restored after).

    The tiny models do microseconds of work per op; with several threads on
    a busy machine the OpenMP hand-offs dominate (measured: 100x slower on
    2 loaded cores). Test modules use it with
    ``pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]``
    after ``from models_fixtures import one_thread``.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def tiny_model(arch: str = "llama", vocab: int = VOCAB, seed: int = 0, attn: str = "sdpa") -> Any:
    """A 2-layer, hidden-32 random model (cached: treat it as read-only)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    pad = vocab - 1
    if arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            pad_token_id=pad, bos_token_id=None, eos_token_id=None, attn_implementation=attn)
        model = LlamaForCausalLM(config)
    elif arch in ("gpt2", "gpt2-untied"):
        config = GPT2Config(
            vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=1024,
            # tied (the default), a random GPT-2 mostly repeats its last token:
            # many accepted drafts; untied, its output varies more
            tie_word_embeddings=(arch == "gpt2"),
            pad_token_id=pad, bos_token_id=None, eos_token_id=None, attn_implementation=attn)
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(arch)
    model.eval()
    gc = model.generation_config
    gc.eos_token_id = None
    gc.bos_token_id = None
    gc.pad_token_id = pad
    return model


# sharp_model's scales: (query/key, value) per arch, chosen so that changing
# one token 20 positions back changes most 16-token greedy continuations
# (tests/test_cache_exactness.py checks it); at q/k scale 1 (tiny_model) only
# a third of llama's and almost none of tied GPT-2's change.
SHARP_SCALES = {"llama": (16.0, 16.0), "gpt2": (24.0, 16.0)}


@functools.lru_cache(maxsize=None)
def sharp_model(arch: str = "llama", seed: int = 0) -> Any:
    """A context-sensitive variant of ``tiny_model(arch, seed=seed)``: its
    attention queries and keys scaled up (sharp attention, which picks out
    particular earlier tokens) and its values scaled up (what attention
    reads outweighs the current token's own embedding), so the next token
    depends on earlier context, and a KV cache that holds one entry too
    many or too few changes the logits and often the tokens. A copy:
    ``tiny_model`` is unchanged (cached: treat it as read-only)."""
    import copy

    import torch

    qk, v = SHARP_SCALES[arch]
    model = copy.deepcopy(tiny_model(arch, seed=seed))
    with torch.no_grad():
        if arch == "llama":
            for layer in model.model.layers:
                attn = layer.self_attn
                attn.q_proj.weight.mul_(qk)
                attn.k_proj.weight.mul_(qk)
                attn.v_proj.weight.mul_(v)
        else:  # GPT-2's c_attn is a Conv1D: [n_embd, 3 * n_embd], q | k | v
            for block in model.transformer.h:
                d = block.attn.c_attn.weight.shape[0]
                for p in (block.attn.c_attn.weight, block.attn.c_attn.bias):
                    p[..., :2 * d].mul_(qk)
                    p[..., 2 * d:].mul_(v)
    return model


def repeated_prompt(rng: random.Random, vocab: int = PROMPT_VOCAB, min_len: int = 6,
                    max_len: int = 60) -> List[int]:
    """A random prompt made of random tokens and copies of its own spans, so
    that prompt lookup finds matches (and often the tail repeats)."""
    target = rng.randint(min_len, max_len)
    alphabet = rng.randint(3, vocab)  # small alphabets give many n-gram matches
    seq = [rng.randrange(alphabet) for _ in range(rng.randint(2, 6))]
    while len(seq) < target:
        if rng.random() < 0.6 and len(seq) >= 2:
            a = rng.randrange(len(seq) - 1)
            b = rng.randint(a + 1, min(len(seq), a + 12))
            seq.extend(seq[a:b])
        else:
            seq.extend(rng.randrange(alphabet) for _ in range(rng.randint(1, 4)))
    seq = seq[:target]
    if rng.random() < 0.5 and len(seq) >= 4:  # end on a span that occurred before
        a = rng.randrange(len(seq) - 3)
        seq.extend(seq[a:a + rng.randint(1, 3)])
    return seq


def as_ids(tokens: Sequence[int]) -> Any:
    import torch

    return torch.tensor([list(tokens)], dtype=torch.long)


def cache_kw(model: Any, cache: Any) -> dict:
    """``{name: cache}`` under the keyword the model takes its cache by
    (``cache`` from transformers 5.24, ``past_key_values`` before), for
    ``model(...)`` and ``model.generate(...)``."""
    from pld.hf_adapter import model_traits

    return {model_traits(model).cache_argument: cache}


def greedy(model: Any, ids: Any, max_new_tokens: int, eos: Any = None, **kwargs: Any) -> List[int]:
    """Plain transformers greedy decoding; the new tokens as a list."""
    import torch

    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=eos, **kwargs)
    return out[0, ids.shape[1]:].tolist()


def hf_pld(model: Any, ids: Any, max_new_tokens: int, k: int, eos: Any = None,
           ngram: Optional[int] = None, cost_aware: bool = True, **kwargs: Any) -> List[int]:
    """model.generate with prompt lookup while pld is enabled; the new tokens.
    ``cost_aware=False`` verifies every draft: tests that count accepted
    drafts need it, since the gate's choices depend on timings."""
    import torch

    import pld

    with pld.enabled(cost_aware=cost_aware), torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                             prompt_lookup_num_tokens=k, max_matching_ngram_size=ngram, **kwargs)
    return out[0, ids.shape[1]:].tolist()


class CountingRun:
    """Wraps pld.loop.run (install with monkeypatch) to count native calls."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.calls = 0
        self.results: list = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        result = self.run(*args, **kwargs)
        self.results.append(result)
        return result


def install_counter(monkeypatch: Any) -> CountingRun:
    from pld import loop

    counter = CountingRun(loop.run)
    monkeypatch.setattr(loop, "run", counter)
    return counter


def in_threads(*targets: Any, wait: float = 60) -> None:
    """Run each target in its own thread with the caller's intra-op
    thread count (a new thread's OpenMP default differs, and with it the
    last bits of a product); re-raise the first failure."""
    import threading

    import torch

    errors: list = []
    n_threads = torch.get_num_threads()

    def guarded(target):
        try:
            torch.set_num_threads(n_threads)
            target()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]
