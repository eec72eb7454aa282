"""pld's transformers glue beyond plain greedy tokens.

* pld.PromptLookupCandidateGenerator against transformers' own (the
  original class in transformers.generation.candidate_generator), on
  growing sequences, with eos and max_length; it ingests only the new tail.
* generate() features while enabled: scores, streamer, stopping criteria,
  logits processors, the token budget.
* enable/disable/enabled/is_enabled restore transformers exactly.
* Calls the native loop refuses go to transformers, with one log line.
"""
from __future__ import annotations

import logging
import random

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(autouse=True)
def _pld_disabled_around():
    """Every test starts and ends with pld disabled."""
    import pld

    pld.disable()
    yield
    pld.disable()


# ============================================================ the generator
class RecordingIndex:
    """Delegates to an NgramIndex and records what extend() received."""

    def __init__(self, index):
        self._index = index
        self.extended = []

    def extend(self, tokens):
        self.extended.append(list(tokens))
        return self._index.extend(tokens)

    def __len__(self):
        return len(self._index)

    def __getattr__(self, name):
        return getattr(self._index, name)


def _growing_sequences(rng, start_len, steps):
    seq = mf.repeated_prompt(rng, min_len=start_len, max_len=start_len)
    yield list(seq)
    for _ in range(steps):
        if rng.random() < 0.5 and len(seq) > 3:  # copy a span, as accepted drafts do
            a = rng.randrange(len(seq) - 1)
            seq.extend(seq[a:a + rng.randint(1, 6)])
        else:
            seq.extend(rng.randrange(12) for _ in range(rng.randint(1, 3)))
        yield list(seq)


def _their_candidates(generator, ids):
    """transformers' generator's candidates for ``ids`` (5.0 also takes
    whether it is the first iteration, which prompt lookup ignores)."""
    import inspect

    if "is_first_iteration" in inspect.signature(generator.get_candidates).parameters:
        return generator.get_candidates(ids, False)
    return generator.get_candidates(ids)


def _eos_tensor(eos):
    import torch

    return None if eos is None else torch.tensor(eos, dtype=torch.long)


@pytest.mark.parametrize("seed", range(12))
def test_candidate_generator_matches_transformers(seed):
    import torch
    from transformers.generation.candidate_generator import (
        PromptLookupCandidateGenerator as Original)

    import pld

    rng = random.Random(f"candgen-{seed}")
    k = rng.choice([1, 2, 3, 5, 10])
    ngram = rng.choice([1, 2, 3, 4])
    eos = rng.choice([None, [rng.randrange(12)], [rng.randrange(12), rng.randrange(12)]])
    start = rng.randint(1, 30)
    steps = 40
    max_length = rng.choice([start + 5, start + 20, 1000])
    ours = pld.PromptLookupCandidateGenerator(
        eos_token_id=_eos_tensor(eos), num_output_tokens=k, max_matching_ngram_size=ngram,
        max_length=max_length)
    # transformers 4.57 needs an eos tensor (generate() always passes one):
    # an id outside the vocabulary means "no eos" on every version.
    theirs = Original(eos_token_id=_eos_tensor(eos if eos is not None else [10**9]), num_output_tokens=k,
                      max_matching_ngram_size=ngram, max_length=max_length)
    ours.index = RecordingIndex(ours.index)
    previous = 0
    nonempty = 0
    for seq in _growing_sequences(rng, start, steps):
        if len(seq) >= max_length:
            break
        ids = torch.tensor([seq])
        got, got_logits = ours.get_candidates(ids)
        want, want_logits = _their_candidates(theirs, ids)
        assert got_logits is None and want_logits is None
        assert got.tolist() == want.tolist(), dict(seq=seq, k=k, ngram=ngram, eos=eos, max_length=max_length)
        assert got.dtype == want.dtype
        nonempty += got.shape[1] > ids.shape[1]
        # only the tail appended since the previous call was ingested
        assert ours.index.extended[-1] == seq[previous:]
        assert len(ours.index) == len(seq)
        previous = len(seq)
    assert sum(len(t) for t in ours.index.extended) == previous


def test_candidate_generator_proposes_something():
    """The cases above are not all empty drafts."""
    import torch

    import pld

    gen = pld.PromptLookupCandidateGenerator(num_output_tokens=3, max_matching_ngram_size=2,
                                             max_length=100)
    ids = torch.tensor([[1, 2, 3, 4, 5, 1, 2]])
    out, _ = gen.get_candidates(ids)
    assert out.tolist() == [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5]]
    # eos cuts the draft, as transformers does
    gen = pld.PromptLookupCandidateGenerator(eos_token_id=_eos_tensor([4]), num_output_tokens=3,
                                             max_matching_ngram_size=2, max_length=100)
    assert gen.get_candidates(ids)[0].tolist() == [[1, 2, 3, 4, 5, 1, 2, 3]]
    # max_length = length + 1: no draft (the model adds one token itself)
    gen = pld.PromptLookupCandidateGenerator(num_output_tokens=3, max_length=8)
    assert gen.get_candidates(ids)[0].tolist() == ids.tolist()


def test_candidate_generator_restarts_on_a_shorter_sequence():
    import torch
    from transformers.generation.candidate_generator import (
        PromptLookupCandidateGenerator as Original)

    import pld

    theirs = Original(eos_token_id=_eos_tensor([10**9]), num_output_tokens=4,
                      max_matching_ngram_size=2, max_length=200)
    rng = random.Random(5)
    for _ in range(20):
        # one generator per sequence: it trusts that a longer input extends
        # what it has seen (as in generate(), which builds one per call)
        ours = pld.PromptLookupCandidateGenerator(num_output_tokens=4, max_matching_ngram_size=2,
                                                  max_length=200)
        seq = mf.repeated_prompt(rng, vocab=10, max_len=40)
        for cut in (len(seq), max(1, len(seq) // 2), len(seq), 1, len(seq)):
            ids = torch.tensor([seq[:cut]])
            assert ours.get_candidates(ids)[0].tolist() == _their_candidates(theirs, ids)[0].tolist()
            assert len(ours.index) == cut


def test_candidate_generator_rejects_batches_and_bad_sizes():
    import torch

    import pld

    gen = pld.PromptLookupCandidateGenerator()
    with pytest.raises(ValueError, match="batch"):
        gen.get_candidates(torch.zeros((2, 5), dtype=torch.long))
    for kwargs in (dict(num_output_tokens=0), dict(max_matching_ngram_size=0)):
        with pytest.raises(ValueError):
            pld.PromptLookupCandidateGenerator(**kwargs)


# ============================================================ features
def _prompts(tag, n, **kwargs):
    rng = random.Random(tag)
    return [mf.repeated_prompt(rng, **kwargs) for _ in range(n)]


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_scores_and_logits_match_greedy(arch, monkeypatch):
    import torch

    import pld

    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    for prompt in _prompts(f"scores-{arch}", 6):
        ids = mf.as_ids(prompt)
        kw = dict(do_sample=False, max_new_tokens=20, return_dict_in_generate=True,
                  output_scores=True, output_logits=True)
        with torch.no_grad():
            plain = model.generate(ids, **kw)
            with pld.enabled():
                ours = model.generate(ids, prompt_lookup_num_tokens=6, **kw)
        assert ours.sequences.tolist() == plain.sequences.tolist()
        n_new = ours.sequences.shape[1] - ids.shape[1]
        assert len(ours.scores) == n_new == len(plain.scores)
        assert len(ours.logits) == n_new
        for a, b in zip(ours.scores, plain.scores):
            assert a.shape == (1, mf.VOCAB)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        for a, b in zip(ours.logits, plain.logits):
            assert a.shape == (1, mf.VOCAB)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert counter.calls == 6


def test_pld_generate_returns_the_scores_and_logits_generate_does():
    """pld.generate(output_scores=True, output_logits=True) puts
    generate()'s scores and logits on the Generation (None when not asked
    for); a batch is refused with a ValueError naming them."""
    import torch
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    import pld

    model = mf.tiny_model("llama")
    prompt = _prompts("pld-generate-scores", 1)[0]
    ids = mf.as_ids(prompt + mf.greedy(model, mf.as_ids(prompt), 24))  # (drafts are accepted)
    with torch.no_grad():
        plain = model.generate(ids, do_sample=False, max_new_tokens=16,
                               return_dict_in_generate=True, output_scores=True, output_logits=True,
                               repetition_penalty=1.01, eos_token_id=None)
    penalty = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.01)])
    ours = pld.generate(model, ids, max_new_tokens=16, eos_token_id=None, output_scores=True,
                        output_logits=True, cost_aware=False, logits_processor=penalty)
    assert ours.sequences.tolist() == plain.sequences.tolist()
    assert len(ours.scores) == len(ours.logits) == 16
    for got, want in ((ours.scores, plain.scores), (ours.logits, plain.logits)):
        for a, b in zip(got, want):
            assert a.shape == (1, mf.VOCAB)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert ours.stats.accepted_draft_tokens > 0
    bare = pld.generate(model, ids, max_new_tokens=4)
    assert bare.scores is None and bare.logits is None
    with pytest.raises(ValueError, match="output_scores/output_logits: not supported for a batch"):
        pld.generate(model, ids.repeat(2, 1), max_new_tokens=4, output_scores=True)


def _bare_greedy_scores_without_dict(model, ids):
    import torch

    import pld

    with torch.no_grad(), pld.enabled():
        return model.generate(ids, do_sample=False, max_new_tokens=8, output_scores=True,
                              prompt_lookup_num_tokens=4)


def test_output_scores_without_return_dict_gives_a_tensor():
    import torch

    model = mf.tiny_model("llama")
    ids = mf.as_ids(_prompts("nodict", 1)[0])
    out = _bare_greedy_scores_without_dict(model, ids)
    assert isinstance(out, torch.Tensor)
    assert out.tolist() == mf.as_ids(ids[0].tolist() + mf.greedy(model, ids, 8)).tolist()


def _recording_streamer():
    from transformers.generation.streamers import BaseStreamer

    class Recorder(BaseStreamer):
        def __init__(self):
            self.puts = []
            self.ends = 0

        def put(self, value):
            assert self.ends == 0, "put() after end()"
            self.puts.append(value.reshape(-1).tolist())

        def end(self):
            self.ends += 1

    return Recorder()


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_streamer(arch, monkeypatch):
    import pld

    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    for prompt in _prompts(f"stream-{arch}", 6):
        ids = mf.as_ids(prompt)
        expected = mf.greedy(model, ids, 24)
        streamer = _recording_streamer()
        got = mf.hf_pld(model, ids, 24, 8, streamer=streamer)
        assert got == expected
        assert streamer.puts[0] == prompt
        assert sum(streamer.puts[1:], []) == expected
        assert all(streamer.puts[1:])  # no empty puts
        assert streamer.ends == 1
    assert counter.calls == 6


def test_streamer_gets_blocks_of_accepted_tokens():
    """With drafts accepted, some put() carries more than one token."""
    import pld

    model = mf.tiny_model("gpt2")  # repeats itself: drafts accepted
    sizes = []
    for prompt in _prompts("stream-blocks", 6):
        streamer = _recording_streamer()
        mf.hf_pld(model, mf.as_ids(prompt), 24, 8, ngram=2, cost_aware=False, streamer=streamer)
        sizes += [len(p) for p in streamer.puts[1:]]
        streamer2 = _recording_streamer()
        gen = pld.generate(model, mf.as_ids(prompt), max_new_tokens=24, streamer=streamer2,
                           eos_token_id=None)
        assert sum(streamer2.puts, [])[-len(gen.new_tokens):] == gen.new_tokens
        assert streamer2.ends == 1
    assert max(sizes) > 1


def test_pld_generate_streamer_follows_the_transformers_protocol():
    """transformers' streamers (TextStreamer(skip_prompt=True),
    TextIteratorStreamer) expect the prompt as the first put(), as
    model.generate sends it; pld.generate should do the same."""
    import pld

    model = mf.tiny_model("gpt2")
    prompt = _prompts("stream-protocol", 1)[0]
    streamer = _recording_streamer()
    gen = pld.generate(model, mf.as_ids(prompt), max_new_tokens=12, streamer=streamer, eos_token_id=None)
    assert streamer.puts[0] == prompt
    assert sum(streamer.puts[1:], []) == gen.new_tokens
    assert streamer.ends == 1


def _stop_on(token):
    import torch
    from transformers import StoppingCriteria

    class StopOnToken(StoppingCriteria):
        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.calls += 1
            return torch.full((input_ids.shape[0],), bool(input_ids[0, -1] == token), dtype=torch.bool)

    return StopOnToken()


@pytest.mark.parametrize("arch", mf.ALL_ARCHS)
def test_custom_stopping_criterion(arch, monkeypatch):
    from transformers import StoppingCriteriaList

    import pld

    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    stopped_early = 0
    for prompt in _prompts(f"stop-{arch}", 8):
        ids = mf.as_ids(prompt)
        free = mf.greedy(model, ids, 24)
        token = free[len(free) // 2]
        expected = mf.greedy(model, ids, 24, stopping_criteria=StoppingCriteriaList([_stop_on(token)]))
        assert expected == free[:free.index(token) + 1]
        for k in (3, 10):
            got = mf.hf_pld(model, ids, 24, k, stopping_criteria=StoppingCriteriaList([_stop_on(token)]))
            assert got == expected, dict(prompt=prompt, token=token, k=k)
            gen = pld.generate(model, ids, max_new_tokens=24, prompt_lookup_num_tokens=k, eos_token_id=None,
                               stopping_criteria=[_stop_on(token)])
            assert gen.new_tokens == expected
        stopped_early += len(expected) < 24
    assert stopped_early
    assert counter.calls == 8 * 4


@pytest.mark.parametrize("arch", mf.ARCHS)
def test_max_new_tokens_never_exceeded(arch):
    import torch

    import pld

    model = mf.tiny_model(arch)
    for prompt in _prompts(f"budget-{arch}", 10):
        ids = mf.as_ids(prompt)
        for n_new in (1, 2, 3, 7):
            for k in (1, 5, 20):
                with torch.no_grad(), pld.enabled():
                    out = model.generate(ids, do_sample=False, max_new_tokens=n_new,
                                         prompt_lookup_num_tokens=k)
                assert out.shape[1] == ids.shape[1] + n_new
                gen = pld.generate(model, ids, max_new_tokens=n_new, prompt_lookup_num_tokens=k, eos_token_id=None)
                assert len(gen.new_tokens) == n_new
                assert all(len(r.tokens) <= n_new for r in gen.stats.records)
        # max_length instead of max_new_tokens
        with torch.no_grad(), pld.enabled():
            out = model.generate(ids, do_sample=False, max_length=ids.shape[1] + 5, prompt_lookup_num_tokens=8)
        assert out.shape[1] == ids.shape[1] + 5
    # a positive budget, as transformers asks (test_hostile_generate has the rest)
    with pytest.raises(ValueError, match="max_new_tokens"):
        pld.generate(model, mf.as_ids([1, 2, 3]), max_new_tokens=0)


PROCESSOR_SETTINGS = [
    dict(repetition_penalty=1.5),
    dict(repetition_penalty=0.7),
    dict(no_repeat_ngram_size=2),
    dict(no_repeat_ngram_size=1),
    dict(bad_words_ids="first"),      # the greedy output's first token, banned
    dict(bad_words_ids="pair"),       # a two-token sequence from the greedy output
    dict(min_new_tokens=6),           # with eos = a token greedy produces early
    dict(repetition_penalty=1.3, no_repeat_ngram_size=3),
]


@pytest.mark.parametrize("arch", mf.ARCHS)
@pytest.mark.parametrize("setting", PROCESSOR_SETTINGS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_logits_processors_match_greedy(arch, setting, monkeypatch):
    import pld

    model = mf.tiny_model(arch)
    counter = mf.install_counter(monkeypatch)
    differs = 0
    for prompt in _prompts(f"proc-{arch}", 6):
        ids = mf.as_ids(prompt)
        free = mf.greedy(model, ids, 20)
        kw = dict(setting)
        eos = None
        if kw.get("bad_words_ids") == "first":
            kw["bad_words_ids"] = [[free[0]]]
        elif kw.get("bad_words_ids") == "pair":
            kw["bad_words_ids"] = [free[2:4]]
        if "min_new_tokens" in kw:
            eos = free[1]
        expected = mf.greedy(model, ids, 20, eos=eos, **kw)
        differs += expected != free
        for k in (2, 8):
            got = mf.hf_pld(model, ids, 20, k, eos=eos, **kw)
            assert got == expected, dict(prompt=prompt, k=k, **kw)
    assert differs, "the processors never changed the output: a weak test"
    assert counter.calls == 6 * 2


def test_logits_processors_through_pld_generate(monkeypatch):
    """pld.generate with transformers' processor objects, directly."""
    from transformers import (LogitsProcessorList, NoRepeatNGramLogitsProcessor,
                              RepetitionPenaltyLogitsProcessor)

    import pld

    model = mf.tiny_model("gpt2")
    for prompt in _prompts("proc-direct", 6):
        ids = mf.as_ids(prompt)
        expected = mf.greedy(model, ids, 20, repetition_penalty=1.4, no_repeat_ngram_size=2)
        processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.4),
                                          NoRepeatNGramLogitsProcessor(2)])
        gen = pld.generate(model, ids, max_new_tokens=20, prompt_lookup_num_tokens=5, eos_token_id=None,
                           logits_processor=processors)
        assert gen.new_tokens == expected


# ============================================================ the switch
def test_enable_disable_round_trip():
    from transformers.generation import candidate_generator, utils

    import pld
    from pld import from_generate as hf

    original_cls = utils.PromptLookupCandidateGenerator
    original_fn = utils.GenerationMixin._assisted_decoding
    assert original_cls is candidate_generator.PromptLookupCandidateGenerator
    assert not pld.is_enabled()

    pld.enable()
    assert pld.is_enabled()
    assert utils.PromptLookupCandidateGenerator is pld.PromptLookupCandidateGenerator
    assert utils.GenerationMixin._assisted_decoding is hf._pld_assisted_decoding
    # the candidate_generator module itself is never touched
    assert candidate_generator.PromptLookupCandidateGenerator is original_cls

    pld.enable()  # idempotent: still one level of patching
    assert pld.is_enabled()
    assert hf._original["_assisted_decoding"] is original_fn
    assert hf._original["PromptLookupCandidateGenerator"] is original_cls

    pld.disable()
    assert not pld.is_enabled()
    assert utils.PromptLookupCandidateGenerator is original_cls
    assert utils.GenerationMixin._assisted_decoding is original_fn
    pld.disable()  # idempotent
    assert utils.PromptLookupCandidateGenerator is original_cls
    assert utils.GenerationMixin._assisted_decoding is original_fn


def test_context_manager_restores():
    from transformers.generation import utils

    import pld

    original_cls = utils.PromptLookupCandidateGenerator
    original_fn = utils.GenerationMixin._assisted_decoding
    with pld.enabled():
        assert pld.is_enabled()
        assert utils.GenerationMixin._assisted_decoding is not original_fn
    assert not pld.is_enabled()
    assert utils.PromptLookupCandidateGenerator is original_cls
    assert utils.GenerationMixin._assisted_decoding is original_fn

    # restores on an exception too
    with pytest.raises(RuntimeError):
        with pld.enabled():
            raise RuntimeError("boom")
    assert not pld.is_enabled()
    assert utils.GenerationMixin._assisted_decoding is original_fn

    # nested in an enable(): leaves it enabled
    pld.enable()
    with pld.enabled():
        assert pld.is_enabled()
    assert pld.is_enabled()
    pld.disable()
    assert utils.GenerationMixin._assisted_decoding is original_fn


def test_disabled_means_transformers_runs(monkeypatch):
    """After disable(), prompt-lookup generate() no longer reaches pld."""
    import pld

    model = mf.tiny_model("llama")
    counter = mf.install_counter(monkeypatch)
    ids = mf.as_ids(_prompts("disabled", 1)[0])
    expected = mf.greedy(model, ids, 10)
    with pld.enabled():
        pass
    import torch

    # transformers 4.57's own prompt lookup needs an eos id: one greedy never emits
    unused = next(t for t in range(model.config.vocab_size) if t not in expected)
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=10, prompt_lookup_num_tokens=4,
                             eos_token_id=unused)
    assert out[0, ids.shape[1]:].tolist() == expected
    assert counter.calls == 0
    assert mf.hf_pld(model, ids, 10, 4) == expected
    assert counter.calls == 1


# ============================================================ fallback
def _pld_warnings(caplog):
    return [r for r in caplog.records if r.name == "pld" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("flag", ["output_attentions", "output_hidden_states"])
@pytest.mark.parametrize("arch", mf.ARCHS)
def test_fallback_is_correct_and_logged_once(arch, flag, attn, caplog, monkeypatch):
    import torch

    import pld

    model = mf.tiny_model(arch, attn=attn)  # (transformers' own prompt lookup fails on sdpa's)
    counter = mf.install_counter(monkeypatch)
    for prompt in _prompts(f"fallback-{arch}-{flag}", 3):
        ids = mf.as_ids(prompt)
        kw = dict(do_sample=False, max_new_tokens=16, return_dict_in_generate=True, **{flag: True})
        with torch.no_grad():
            plain = model.generate(ids, **kw)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pld"), torch.no_grad(), pld.enabled():
            ours = model.generate(ids, prompt_lookup_num_tokens=5, **kw)
        assert ours.sequences.tolist() == plain.sequences.tolist()
        records = _pld_warnings(caplog)
        assert len(records) == 1, [r.getMessage() for r in records]
        assert flag in records[0].getMessage()
        assert "transformers' decoding without prompt lookup" in records[0].getMessage()
        field = "attentions" if flag == "output_attentions" else "hidden_states"
        assert len(getattr(ours, field)) == len(getattr(plain, field)) == 16
    assert counter.calls == 0


def test_native_call_logs_nothing(caplog):
    import pld  # noqa: F401

    model = mf.tiny_model("llama")
    ids = mf.as_ids(_prompts("quiet", 1)[0])
    with caplog.at_level(logging.DEBUG, logger="pld"):
        mf.hf_pld(model, ids, 10, 4)
    assert not [r for r in caplog.records if r.name == "pld"]


def test_use_cache_false_gets_plain_decodings_tokens(caplog):
    """Without a cache the native loop steps aside, and so does
    transformers' assisted decoding (it refuses the call): transformers'
    plain decoding serves it, with one warning, as generate() without
    prompt lookup would."""
    import torch

    import pld

    model = mf.tiny_model("llama")
    ids = mf.as_ids(_prompts("nocache", 1)[0])
    kw = dict(do_sample=False, max_new_tokens=8, use_cache=False)
    with torch.no_grad():
        plain = model.generate(ids, **kw)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pld"):
        with torch.no_grad(), pld.enabled():
            served = model.generate(ids, prompt_lookup_num_tokens=4, **kw)
    assert served.tolist() == plain.tolist()
    records = _pld_warnings(caplog)
    assert len(records) == 1 and "without prompt lookup (use_cache=False)" in records[0].getMessage()


def test_a_generate_that_makes_no_cache_is_served_natively(caplog, monkeypatch):
    """transformers 5.0.0 (not 4.57, nor 5.1 and later) makes no cache for
    assisted decoding: the model makes its own on its first forward. The
    native loop then makes its own too, and serves the call, exactly."""
    import pld  # noqa: F401

    model = mf.tiny_model("llama")
    ids = mf.as_ids(_prompts("nocache-made", 1)[0])
    want = mf.greedy(model, ids, 24)
    prepare = type(model)._prepare_cache_for_generation

    def prepare_none(self, *args, **kwargs):
        prepare(self, *args, **kwargs)
        made = kwargs["model_kwargs"] if "model_kwargs" in kwargs else args[1]
        made.pop("cache", None), made.pop("past_key_values", None)

    monkeypatch.setattr(type(model), "_prepare_cache_for_generation", prepare_none)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pld"):
        assert mf.hf_pld(model, ids, 24, 6) == want
    assert not _pld_warnings(caplog)


# ============================================================ transformers' defaults
def _generation_config(**kw):
    from transformers import GenerationConfig

    return GenerationConfig(prompt_lookup_num_tokens=kw.pop("k", 6), **kw)


@pytest.mark.parametrize("given,expected", [(None, 2), (0, 2), (1, 1), (3, 3), (5, 5)])
def test_unset_max_matching_ngram_size_is_transformers_default(given, expected):
    """A generate() call that leaves max_matching_ngram_size unset looks up
    n-grams of at most 2, as transformers gives its own generator
    (``generation_config.max_matching_ngram_size or 2``), not DecodeConfig's
    3; a value the call gives is kept."""
    from pld import from_generate as hf

    options = hf._decode_config(_generation_config(max_matching_ngram_size=given), budget=10)
    assert (options.max_matching_ngram_size, options.prompt_lookup_num_tokens) == (expected, 6)


def test_unset_max_matching_ngram_size_is_at_least_enables_min_ngram_size():
    import pld
    from pld import from_generate as hf

    pld.enable(min_ngram_size=3)
    options = hf._decode_config(_generation_config(), budget=10)
    assert (options.min_ngram_size, options.max_matching_ngram_size) == (3, 3)
    pld.enable(min_ngram_size=1)
    assert hf._decode_config(_generation_config(), budget=10).max_matching_ngram_size == 2


def test_generate_under_enable_looks_up_as_transformers_does(monkeypatch):
    """model.generate(prompt_lookup_num_tokens=k) under pld.enabled(): with
    max_matching_ngram_size unset the loop's index looks up 2-grams at
    most, as transformers' PromptLookupCandidateGenerator does: with
    semantics="transformers" each step drafts what transformers' own
    generator (its defaults) proposes there. An explicit value is kept.
    The tokens are plain greedy's either way."""
    import inspect

    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator as HFGenerator

    import pld
    from pld import loop

    model = mf.tiny_model("llama")
    # the suffix (7, 5, 6): its 2-gram (5, 6) first continues 11..14, the 3-gram 21..24
    ids = mf.as_ids([5, 6, 11, 12, 13, 14, 7, 5, 6, 21, 22, 23, 24, 30, 31, 7, 5, 6])
    seen, steps = [], []
    real_run = loop.run

    def spy(m, input_ids, config=None, **kw):
        seen.append(config)
        return real_run(m, input_ids, config, on_step=steps.append, **kw)

    monkeypatch.setattr(loop, "run", spy)
    kw = dict(do_sample=False, max_new_tokens=12, prompt_lookup_num_tokens=4)
    with torch.no_grad():
        plain = model.generate(ids, do_sample=False, max_new_tokens=12)
        with pld.enabled(cost_aware=False, semantics="transformers"):
            unset = model.generate(ids, **kw)
            first_steps = list(steps)
            explicit = model.generate(ids, max_matching_ngram_size=3, **kw)
    assert [c.max_matching_ngram_size for c in seen] == [2, 3]
    assert [c.prompt_lookup_num_tokens for c in seen] == [4, 4]
    assert inspect.signature(HFGenerator).parameters["max_matching_ngram_size"].default == 2
    assert unset.tolist() == explicit.tolist() == plain.tolist()
    limit = ids.shape[1] + 12
    at, sequence, drafted = ids.shape[1], unset[0].tolist(), 0
    for step in first_steps:
        # (an eos id no sequence holds: 4.57's generator needs one as a tensor)
        hf_gen = HFGenerator(eos_token_id=torch.tensor([10**6]), num_output_tokens=4, max_length=limit)
        candidates, _ = _their_candidates(hf_gen, torch.tensor([sequence[:at]]))
        # (near the budget's end pld drafts no more than can still be kept)
        expected = candidates[0, at:at + max(0, limit - at - 1)].tolist()
        draft = [step.tree.tokens[i] for i in step.chosen] if step.tree is not None else []
        assert draft == expected, (at, step)
        assert all(n <= 2 for n in (step.tree.ngrams if step.tree is not None else []))
        drafted += len(draft)
        at += len(step.tokens)
    assert drafted > 0 and first_steps[0].tree.tokens[:4] == [11, 12, 13, 14]
