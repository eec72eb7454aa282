"""The architecture matrix: every decoder-only architecture in the installed
transformers' causal-LM mapping that builds from a small config
(pld/bench/arch_zoo.py), each through every path pld has, greedy in float32
against plain greedy decoding, with contexts longer than the 64-token
sliding window the tiny configs give where the architecture has one:

- ``pld.generate`` (one row, linear drafts) and ``draft_tree=True``;
- ``model.generate(..., prompt_lookup_num_tokens=10)`` under
  ``pld.enabled()``, natively (no fallback line) wherever the model's
  traits allow it;
- a left-padded batch of 3 rows of different lengths: each row is its own
  greedy output; natively where pld's 4D masks were found exact, else one
  warning and the rows one at a time;
- a seeded sampling run that repeats;
- the generation options users set (repetition_penalty,
  no_repeat_ngram_size, min_new_tokens, bad_words_ids, a stopping
  criterion, output_scores/output_logits), one row and a batch, against
  plain ``generate`` with the same options.

Stateful (recurrent) models get a clear ValueError from pld.generate and
transformers' plain decoding under enable(). Architectures left out are
skipped with the census's reason (an encoder, an encoder-decoder model, a
config that does not shrink, a model whose plain greedy generate fails).
"""
from __future__ import annotations

import logging
import os

import pytest

pytestmark = [pytest.mark.torch]

NEW = 40
LENGTHS = (90, 75, 100)  # all past the 64-token window


def _model_types():
    if os.environ.get("PLD_SANITIZED"):  # the sanitizer stage runs no torch test
        return []
    try:
        from pld.bench import arch_zoo

        return arch_zoo.model_types()
    except ImportError:
        return []


MODEL_TYPES = _model_types()


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(model_type):
    import warnings

    from pld.bench import arch_zoo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, reason = arch_zoo.census_one(model_type)
    if model is None:
        pytest.skip(f"{model_type}: {reason}")
    return model


def _prompt(seed, n, vocab):
    from pld.bench import arch_zoo

    return arch_zoo.periodic_prompt(seed, n, vocab)


def _batch(prompts, pad):
    from pld.bench import arch_zoo

    return arch_zoo.left_padded(prompts, pad)


def _generate(model, ids, **kwargs):
    import torch

    from pld.bench import arch_zoo

    with torch.no_grad():
        return model.generate(ids, pad_token_id=arch_zoo.VOCAB - 1, **kwargs)


def _pld_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "pld" and r.levelno >= logging.WARNING]


def test_the_matrix_covers_at_least_40_architectures():
    from pld.bench import arch_zoo

    runs, left_out = arch_zoo.census()
    assert len(runs) >= 40, left_out
    for name in ("llama", "mistral", "gemma2", "phi3", "mpt", "bloom", "gpt2", "falcon+alibi", "mixtral"):
        if name in MODEL_TYPES:
            assert name in runs, left_out.get(name)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_path_gives_greedy_tokens(model_type, caplog):
    import torch

    from pld.bench import arch_zoo
    import pld
    from pld.hf_adapter import model_traits

    model = _model(model_type)
    vocab = arch_zoo.VOCAB
    prompts = [_prompt(f"{model_type}-{i}", n, vocab) for i, n in enumerate(LENGTHS)]
    one = torch.tensor([prompts[0]])
    traits = model_traits(model)
    caplog.set_level(logging.INFO, logger="pld")
    if traits.reason is not None:
        _refused_clearly(model, one, traits.reason, caplog)
        return
    alone = [_generate(model, torch.tensor([p]), do_sample=False, max_new_tokens=NEW,
                       eos_token_id=None)[0, len(p):].tolist() for p in prompts]

    assert pld.generate(model, one, max_new_tokens=NEW, eos_token_id=None).new_tokens == alone[0]
    tree = pld.generate(model, one, max_new_tokens=NEW, eos_token_id=None, draft_tree=True)
    assert tree.new_tokens == alone[0]
    lines = _pld_lines(caplog)
    if traits.custom_masks is None:
        assert not lines, lines
    else:  # linear drafts instead, said once, with the reason
        assert len(lines) == 1 and "instead of a token tree" in lines[0] and traits.custom_masks in lines[0]
    caplog.clear()
    with pld.enabled():
        out = _generate(model, one, do_sample=False, max_new_tokens=NEW, eos_token_id=None,
                        prompt_lookup_num_tokens=10)
    assert out[0, one.shape[1]:].tolist() == alone[0]
    assert not _pld_lines(caplog), _pld_lines(caplog)  # the native loop served it

    ids, mask = _batch(prompts, vocab - 1)
    batch = pld.generate(model, ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=None)
    assert batch.new_tokens == alone
    lines = _pld_lines(caplog)
    if traits.custom_masks is None:
        assert not lines, lines
    else:  # an exact fallback, said once, with the reason
        assert len(lines) == 1 and "one at a time" in lines[0] and traits.custom_masks in lines[0]

    torch.manual_seed(11)
    first = pld.generate(model, one, max_new_tokens=12, eos_token_id=None, do_sample=True, temperature=0.8)
    torch.manual_seed(11)
    again = pld.generate(model, one, max_new_tokens=12, eos_token_id=None, do_sample=True, temperature=0.8)
    assert first.new_tokens == again.new_tokens and len(first.new_tokens) == 12


def _refused_clearly(model, one, reason, caplog):
    """A model pld's loop cannot serve (stateful, a cache that cannot be
    cropped, no KV cache, a verification forward that fails): pld.generate
    says why in a ValueError; under enable() the call is transformers'
    plain decoding (its own prompt lookup needs what the loop needs), the
    tokens (or the error) of generate() without prompt lookup, with one
    line that says why."""
    import pld

    assert any(word in reason for word in ("stateful", "cropped", "no DynamicCache", "no usable KV cache",
                                           "3 tokens after 3 cached ones")), reason
    with pytest.raises(ValueError) as error:
        pld.generate(model, one, max_new_tokens=8)
    assert reason in str(error.value)
    options = dict(do_sample=False, max_new_tokens=8, eos_token_id=None)

    def outcome(**extra):
        try:
            return _generate(model, one, **options, **extra).tolist()
        except Exception as failure:  # noqa: BLE001 - transformers' own (a 90-token prompt fails some)
            return (type(failure), str(failure))

    plain = outcome()
    caplog.clear()
    with pld.enabled():
        assert outcome(prompt_lookup_num_tokens=10) == plain
    lines = _pld_lines(caplog)
    assert len(lines) == 1 and reason in lines[0] and "without prompt lookup" in lines[0], lines


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_generation_options_as_plain_generate(model_type):
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    from pld.bench import arch_zoo
    import pld

    from pld.hf_adapter import model_traits

    model = _model(model_type)
    reason = model_traits(model).reason
    if reason is not None:
        pytest.skip(f"{model_type}: pld's loop refuses it ({reason}); test_every_path_gives_greedy_tokens "
                    "checks the refusal")
    vocab = arch_zoo.VOCAB
    prompts = [_prompt(f"{model_type}-options-{i}", n, vocab) for i, n in enumerate(LENGTHS)]
    one = torch.tensor([prompts[0]])
    plain = _generate(model, one, do_sample=False, max_new_tokens=NEW, eos_token_id=None)[0].tolist()
    stop_token = plain[one.shape[1] + 25]

    class StopAt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == stop_token

    options = dict(do_sample=False, max_new_tokens=NEW, eos_token_id=plain[one.shape[1] + 3],
                   repetition_penalty=1.3, no_repeat_ngram_size=4, min_new_tokens=8,
                   bad_words_ids=[[plain[one.shape[1] + 1]]], stopping_criteria=StoppingCriteriaList([StopAt()]),
                   return_dict_in_generate=True, output_scores=True, output_logits=True)
    want = _generate(model, one, **options)
    with pld.enabled():
        got = _generate(model, one, prompt_lookup_num_tokens=10, **options)
    if got.sequences.tolist() != want.sequences.tolist():
        # only a mixture of experts whose routing a wider forward changes
        # (near ties: transformers 4.57's phimoe here) may differ, and then
        # transformers' own prompt lookup differs from greedy as well
        assert _experts(model), "greedy tokens differ"
        own = _generate(model, one, prompt_lookup_num_tokens=10, **options)
        assert own.sequences.tolist() != want.sequences.tolist(), "only pld's tokens differ from greedy"
        return
    assert len(got.scores) == len(want.scores) and len(got.logits) == len(want.logits)
    # a mixture of experts routes each token to its top experts: a near tie
    # between two experts, summed in another order, can swap one (the
    # tokens are still compared exactly above)
    tolerance = 5e-2 if _experts(model) else 1e-4
    for a, b in zip(got.scores + got.logits, want.scores + want.logits):
        finite = torch.isfinite(b)
        assert torch.equal(finite, torch.isfinite(a))
        assert torch.allclose(a[finite], b[finite], atol=tolerance, rtol=tolerance)

    # a batch: each row as plain generate gives it alone, under options
    # whose effect does not depend on the left padding a batch adds
    ids, mask = _batch(prompts, vocab - 1)
    batch_options = dict(do_sample=False, max_new_tokens=NEW, eos_token_id=options["eos_token_id"],
                         min_new_tokens=8, bad_words_ids=options["bad_words_ids"])
    with pld.enabled():
        got = _generate(model, ids, attention_mask=mask, prompt_lookup_num_tokens=10, **batch_options)
    for row, p in zip(got[:, ids.shape[1]:].tolist(), prompts):
        alone = _generate(model, torch.tensor([p]), **batch_options)[0, len(p):].tolist()
        assert row[:len(alone)] == alone and set(row[len(alone):]) <= {vocab - 1}


def _experts(model):
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return any(getattr(config, name, None) for name in ("num_experts", "num_local_experts", "n_routed_experts",
                                                        "moe_num_experts"))
