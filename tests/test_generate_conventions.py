"""generate() arguments whose meaning pld's loop must keep under
pld.enable(): caches generate() makes, the caller's stopping criteria and
position_ids, and a batch's stateful processors and criteria. Each case
compares model.generate with prompt lookup under pld.enable() against
plain model.generate (no prompt lookup), in float32: the same tokens.
"""
from __future__ import annotations

import contextlib
import logging

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

PAD = mf.PAD
PROMPTS = [[3, 5, 7, 3, 5, 7, 9, 3, 5, 7], [11, 12, 13, 11, 12, 13, 11], [20, 21, 20, 21, 22, 20, 21, 20]]


def _batch():
    import torch

    L = max(map(len, PROMPTS))
    ids = torch.tensor([[PAD] * (L - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in PROMPTS])
    return ids, mask


def _both(model, ids, make_kwargs, k=4):
    """(plain generate's output, pld's under enable()) as lists; an
    exception's type and text in place of an output."""
    import torch

    import pld

    outs = []
    for on in (False, True):
        try:
            with torch.no_grad():
                if on:
                    with pld.enabled():
                        out = model.generate(ids, prompt_lookup_num_tokens=k, **make_kwargs())
                else:
                    out = model.generate(ids, **make_kwargs())
            outs.append(out[:, ids.shape[1]:].tolist())
        except Exception as error:  # noqa: BLE001 - compared
            outs.append((type(error).__name__, str(error)))
    return outs


def _greedy_kw(**kw):
    return {**dict(do_sample=False, max_new_tokens=16, eos_token_id=None, pad_token_id=PAD), **kw}


@pytest.mark.parametrize("implementation", ["static", "sliding_window"])
def test_a_static_cache_on_sliding_window_layers_gives_greedy_tokens(implementation):
    """generate() makes a StaticCache whose sliding layers keep one window:
    cropping it cannot bring back what it evicted. The loop keeps its own
    cache in its place (it gave other tokens, silently, on it)."""
    import random

    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    V = 96
    model = Gemma2ForCausalLM(Gemma2Config(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=16, max_position_embeddings=512, pad_token_id=V - 1,
        bos_token_id=None, eos_token_id=None)).eval()
    model.generation_config.eos_token_id = None
    rng = random.Random(1)
    for trial in range(4):
        base = [rng.randrange(V - 1) for _ in range(5)]
        prompt = (base * 6)[:20 + trial]
        prompt[rng.randrange(len(prompt))] = rng.randrange(V - 1)
        plain, ours = _both(model, mf.as_ids(prompt),
                            lambda: {**_greedy_kw(max_new_tokens=30, cache_implementation=implementation),
                                     "pad_token_id": V - 1})
        assert isinstance(plain, list) and ours == plain, trial


def test_a_batch_with_a_static_cache_gives_greedy_tokens():
    ids, mask = _batch()
    plain, ours = _both(mf.tiny_model("llama"), ids,
                        lambda: _greedy_kw(attention_mask=mask, cache_implementation="static"))
    assert isinstance(plain, list) and ours == plain


def test_the_callers_length_and_eos_criteria_are_kept():
    """A criterion of a kind generate() makes itself, given by the caller,
    replaces generate()'s: an EosTokenCriteria for a token greedy writes,
    a MaxLengthCriteria shorter than max_new_tokens."""
    from transformers import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

    model = mf.tiny_model("llama")
    ids = mf.as_ids([3, 5, 7, 3, 5, 7, 9, 3, 5, 7, 11, 3, 5])
    free = mf.greedy(model, ids, 16)
    for criterion in (lambda: EosTokenCriteria(eos_token_id=free[3]), lambda: MaxLengthCriteria(ids.shape[1] + 5)):
        plain, ours = _both(model, ids, lambda: _greedy_kw(stopping_criteria=StoppingCriteriaList([criterion()])))
        assert isinstance(plain, list) and len(plain[0]) < 16 and ours == plain


def test_position_ids_given_by_the_caller_are_kept():
    """GPT-2 (learned absolute positions) with two packed segments: the
    positions change the tokens, and pld's output is plain generate's."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=mf.VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                       tie_word_embeddings=False, pad_token_id=PAD, bos_token_id=None,
                                       eos_token_id=None)).eval()
    model.generation_config.eos_token_id = None
    ids = mf.as_ids([3, 5, 7, 3, 5, 7, 9, 3, 5, 7, 11, 3, 5, 7, 9, 3])
    packed = torch.cat([torch.arange(8), torch.arange(ids.shape[1] - 8)])[None]
    plain, ours = _both(model, ids, lambda: _greedy_kw(position_ids=packed))
    assert isinstance(plain, list) and plain != _both(model, ids, _greedy_kw)[0]  # (the positions matter)
    assert ours == plain


class _BanOnNthCall:
    """A stateful processor: bans a token from its n-th call on."""

    def __init__(self, n, token):
        self.calls, self.n, self.token = 0, n, token

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls >= self.n:
            scores = scores.clone()
            scores[:, self.token] = -float("inf")
        return scores


class _StopOnPerRow:
    """Row r stops on its own token (a [B] answer)."""

    def __init__(self, tokens):
        self.tokens = tokens

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        return input_ids[:, -1] == torch.tensor(self.tokens)[:input_ids.shape[0]]


@pytest.mark.parametrize("case", ["stateful processor", "per-row criterion", "stopped row without eos"])
def test_a_batch_pld_cannot_serve_row_by_row_gets_plain_decodings_tokens(case, caplog):
    """In a batch generate() calls a processor or a criterion once a step
    with every row, and without an eos id it writes tokens on in a row a
    criterion stopped. The loop works row by row, so such a batch goes to
    transformers' plain decoding (its own prompt lookup takes one row),
    with one warning."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    model = mf.tiny_model("llama")
    ids, mask = _batch()
    free = model.generate(ids, **_greedy_kw(attention_mask=mask))[:, ids.shape[1]:].tolist()
    if case == "stateful processor":
        extra = lambda: dict(logits_processor=LogitsProcessorList([_BanOnNthCall(3, free[0][5])]))  # noqa: E731
    elif case == "per-row criterion":
        unused = next(t for t in range(PAD) if all(t not in r for r in free))
        extra = lambda: dict(eos_token_id=unused,  # noqa: E731
                             stopping_criteria=StoppingCriteriaList([_StopOnPerRow([free[0][4], free[1][2],
                                                                                    free[2][6]])]))
    else:
        extra = lambda: dict(stopping_criteria=StoppingCriteriaList([_StopOnPerRow([free[1][2]] * 3)]))  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="pld"):
        plain, ours = _both(model, ids, lambda: {**_greedy_kw(attention_mask=mask), **extra()})
    assert isinstance(plain, list) and ours == plain
    warnings = [r.getMessage() for r in caplog.records if r.name == "pld"]
    assert len(warnings) == 1 and "without prompt lookup" in warnings[0], warnings


def test_a_batch_of_stateless_processors_stays_in_the_loop(caplog):
    """repetition_penalty and no_repeat_ngram_size read input_ids but keep
    no state: the batch is pld's, exactly, without a warning."""
    model = mf.tiny_model("llama")
    ids, mask = _batch()
    with caplog.at_level(logging.WARNING, logger="pld"):
        plain, ours = _both(model, ids, lambda: _greedy_kw(attention_mask=mask, repetition_penalty=1.3,
                                                            no_repeat_ngram_size=3))
    assert isinstance(plain, list) and ours == plain and not [r for r in caplog.records if r.name == "pld"]


class _StopAfterScores:
    """Stops once generate()'s scores hold n tokens' (None without
    output_scores); counts its calls."""

    def __init__(self, n):
        self.n, self.calls, self.seen = n, 0, []

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        self.calls += 1
        self.seen.append(None if scores is None else (type(scores).__name__, len(scores), tuple(scores[-1].shape)))
        return torch.full((input_ids.shape[0],), scores is not None and len(scores) >= self.n, dtype=torch.bool)


@pytest.mark.parametrize("output_scores", [True, False])
def test_a_criterion_gets_generates_scores_and_every_criterion_is_called(output_scores):
    """generate() hands a criterion its running tuple of every new token's
    processed scores (None without output_scores), and calls every
    criterion at every token (one may count its calls) even after another
    said stop. transformers' own ConfidenceCriteria reads scores[-1][0, t]."""
    import torch
    from transformers import StoppingCriteriaList

    import pld

    model = mf.tiny_model("llama")
    ids = torch.tensor([PROMPTS[0]])
    runs = []
    for on in (False, True):
        first, second = _StopAfterScores(3), _StopAfterScores(10 ** 6)
        kw = _greedy_kw(stopping_criteria=StoppingCriteriaList([first, second]), return_dict_in_generate=True,
                        output_scores=output_scores)
        with torch.no_grad(), (pld.enabled() if on else contextlib.nullcontext()):
            out = model.generate(ids, **({"prompt_lookup_num_tokens": 4} if on else {}), **kw)
        runs.append((out.sequences[:, ids.shape[1]:].tolist(), first.seen, first.calls, second.calls))
    assert runs[1] == runs[0]
    assert len(runs[0][0][0]) == (3 if output_scores else 16)
    assert runs[0][2] == runs[0][3]  # (both called at every token)


def test_a_cache_holding_tokens_gets_plain_decodings_tokens(caplog):
    """A second turn over the first's cache: transformers' assisted decoding
    (5.24) gives other tokens, so the call goes to plain decoding."""
    import torch

    import pld

    model = mf.sharp_model("llama")
    ids = torch.tensor([PROMPTS[0]])
    outs = []
    for on in (False, True):
        with torch.no_grad():
            first = model.generate(ids, **_greedy_kw(max_new_tokens=6, return_dict_in_generate=True))
            cache = first.past_key_values if getattr(first, "past_key_values", None) is not None else first.cache
            turn = torch.cat([first.sequences, torch.tensor([PROMPTS[1]])], dim=1)
            with caplog.at_level(logging.WARNING, logger="pld"), \
                    (pld.enabled() if on else contextlib.nullcontext()):
                out = model.generate(turn, past_key_values=cache, **_greedy_kw(),
                                     **({"prompt_lookup_num_tokens": 4} if on else {}))
        outs.append(out[:, turn.shape[1]:].tolist())
    assert outs[1] == outs[0]
    assert "without prompt lookup (the cache already holds tokens)" in caplog.text


@pytest.mark.parametrize("with_ids", [True, False])
def test_inputs_embeds_get_plain_decodings_tokens(with_ids, caplog):
    import torch

    import pld

    model = mf.tiny_model("llama")
    ids = torch.tensor([PROMPTS[0]])
    embeds = model.get_input_embeddings()(ids)
    args = (ids,) if with_ids else ()
    outs = []
    for on in (False, True):
        with torch.no_grad(), caplog.at_level(logging.WARNING, logger="pld"), \
                (pld.enabled() if on else contextlib.nullcontext()):
            out = model.generate(*args, inputs_embeds=embeds, **_greedy_kw(),
                                 **({"prompt_lookup_num_tokens": 4} if on else {}))
        outs.append(out[:, -16:].tolist())
    assert outs[1] == outs[0]
    assert "without prompt lookup (model inputs ['inputs_embeds'])" in caplog.text


# ------------------------------------------ calls pld's loop cannot serve

def _t5(seed=0):
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    return T5ForConditionalGeneration(T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()


def _bart(seed=0):
    """BART's own layout: the decoder starts at eos, bos forced first."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    return BartForConditionalGeneration(BartConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=256,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_bos_token_id=0,
        forced_eos_token_id=None)).eval()


class _StopAtLength:
    """A caller's criterion: stop once a row holds ``n`` tokens."""

    def __init__(self, n):
        self.n = n

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.n, dtype=torch.bool)


def _routed(model, ids, kwargs, caplog):
    """(plain generate's tokens, pld's under enable(), the pld warnings)."""
    import torch

    import pld

    with torch.no_grad():
        plain = model.generate(ids, **kwargs())
        caplog.clear()
        with pld.enabled(), caplog.at_level(logging.WARNING, logger="pld"):
            ours = model.generate(ids, prompt_lookup_num_tokens=3, **kwargs())
    return plain.tolist(), ours.tolist(), caplog.text


def test_an_encoder_decoder_row_keeps_transformers_assisted_decoding(caplog):
    """The one kind of call transformers' assisted decoding serves that
    pld's loop does not: drafts from pld's generator, plain's tokens."""
    import torch

    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 11]])
    plain, ours, said = _routed(_t5(), ids, lambda: dict(do_sample=False, max_new_tokens=12), caplog)
    assert ours == plain
    assert "using transformers' assisted decoding" in said


@pytest.mark.parametrize("case", ["use_cache=False", "static cache", "stopping criterion", "output_attentions",
                                  "streamer"])
def test_an_encoder_decoder_call_assisted_decoding_gets_wrong_gets_plain_decodings_tokens(case, caplog):
    """Calls a differential audit found transformers' assisted decoding
    fails (use_cache=False; a static cache on 5.17+; attentions on 4.57-5.3),
    stops late (a caller's criterion) or streams past max_length (4.57-5.10)
    go to plain decoding: plain's tokens, and the warning says so."""
    import torch
    from transformers import StoppingCriteriaList

    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 11]])
    extra = {"use_cache=False": lambda: dict(use_cache=False),
             "static cache": lambda: dict(cache_implementation="static"),
             "stopping criterion": lambda: dict(stopping_criteria=StoppingCriteriaList([_StopAtLength(10)])),
             "output_attentions": lambda: dict(output_attentions=True, return_dict_in_generate=True),
             "streamer": lambda: dict(streamer=_Tokens())}[case]
    model = _t5()

    def kwargs():
        return dict(do_sample=False, max_new_tokens=12, **extra())

    plain, ours, said = _routed(model, ids, lambda: {**kwargs(), **({"return_dict_in_generate": False}
                                                                  if case == "output_attentions" else {})},
                                caplog)
    assert ours == plain
    if case != "static cache":  # (4.57 to 5.10 make a dynamic cache for assisted decoding: it serves)
        assert "using transformers' decoding without prompt lookup" in said and "assisted decoding" not in said


class _Tokens:
    """A streamer that keeps what it is given."""

    def __init__(self):
        self.got = []

    def put(self, value):
        self.got.append(value.tolist())

    def end(self):
        pass


def test_a_decoder_that_starts_at_eos_gets_plain_decodings_tokens(caplog):
    """BART's decoder starts at its eos id: releases whose assisted
    decoding asks the criteria about a draft before verifying it stopped
    at once (no new token); each release now gives plain's tokens."""
    import torch

    ids = torch.tensor([[0, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 2]])
    plain, ours, _ = _routed(_bart(), ids, lambda: dict(do_sample=False, max_new_tokens=10, forced_bos_token_id=0),
                             caplog)
    assert len(plain[0]) > 2 and ours == plain


def test_an_eos_criterion_for_other_ids_gets_plain_decodings_tokens(caplog):
    """A caller's EosTokenCriteria for another id than the call's eos: the
    loop does not apply it, and transformers' assisted decoding checks it
    only after a whole draft (5.24: it ran on past three of them)."""
    import torch
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import EosTokenCriteria

    torch.manual_seed(0)
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, bos_token_id=1, eos_token_id=2,
                                         pad_token_id=0)).eval()
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 11, 30, 53, 7, 31, 54, 13, 4,
                         22, 40, 31, 54, 13, 4, 22, 40]])
    plain, ours, said = _routed(model, ids, lambda: dict(
        do_sample=False, max_new_tokens=25,
        stopping_criteria=StoppingCriteriaList([EosTokenCriteria(eos_token_id=13)])), caplog)
    assert ours == plain
    assert "without prompt lookup (an EosTokenCriteria for other ids" in said


def test_transformers_early_exit_drafts_keep_its_assisted_decoding(caplog):
    """assistant_early_exit asks for transformers' own draft generator,
    not prompt lookup's: its assisted decoding runs it, with plain's tokens."""
    import torch

    ids = torch.tensor([[5, 9, 13, 7, 22, 5, 9, 13, 7, 22, 5, 9]])
    plain, ours, said = _routed(mf.tiny_model("llama"), ids,
                                lambda: dict(do_sample=False, max_new_tokens=10, assistant_early_exit=1), caplog)
    assert ours == plain
    assert "assisted decoding (generation_config.assistant_early_exit is set)" in said


def test_an_encoder_decoder_row_with_a_time_limit_keeps_assisted_decoding(caplog):
    import torch

    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 11]])
    plain, ours, said = _routed(_t5(), ids, lambda: dict(do_sample=False, max_new_tokens=12, max_time=600.0),
                                caplog)
    assert ours == plain
    assert "using transformers' assisted decoding" in said and "without prompt lookup" not in said
