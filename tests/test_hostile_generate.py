"""Hostile input at the Python edge: pld.generate, the enable() switch and
the benchmark's data default.

* Memory: the loop's buffers grow with the output (amortised doubling), so a
  huge ``max_new_tokens`` on a prompt that stops at once costs no more memory
  than a small one (peak RSS measured in a child process); growing many
  times keeps greedy token-identical. ``max_new_tokens`` and
  ``prompt_lookup_num_tokens`` (of pld.generate and of model.generate) are
  checked against the C core's limits before anything is allocated.
* Models without a usable KV cache: refused by pld.generate with a clear
  ValueError; under pld.enable() handed to transformers' own path with one
  log line; a model that silently ignores ``past_key_values`` raises instead
  of giving wrong tokens.
* Argument types: attention_mask as a list/array, eos_token_id as a NumPy
  integer or a tensor are accepted; wrong types raise errors that name the
  argument.
* ``python -m pld bench --source spec-bench`` without ``--data``: a default
  found from $PLD_SPEC_BENCH or the working directory and its parents, or a
  clear error that lists the paths tried.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture

TESTS = Path(__file__).resolve().parent


def torch_test(fn):
    """The ``torch`` marker and one intra-op thread, as the other modules."""
    return pytest.mark.torch(pytest.mark.usefixtures("one_thread")(fn))


@pytest.fixture(autouse=True)
def _pld_disabled_around():
    """Every test that touches the switch starts and ends with pld disabled."""
    yield
    if "pld.from_generate" in sys.modules:
        sys.modules["pld.from_generate"].disable()


def _ids():
    return mf.as_ids([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])


# ============================================================ A. memory
_MEMORY_CHILD = textwrap.dedent("""
    import resource, sys
    import torch
    import pld
    import models_fixtures as mf

    torch.set_num_threads(1)
    n = int(sys.argv[1])
    model = mf.tiny_model("gpt2")
    ids = mf.as_ids([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    first = mf.greedy(model, ids, 1)[0]  # the token it emits first: eos, so it stops at once
    # a guard, not the measure: a run that tries to allocate gigabytes fails
    # here instead of taking the machine's memory
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), resource.RLIM_INFINITY))
    warm = pld.generate(model, ids, max_new_tokens=100, eos_token_id=first)
    gen = pld.generate(model, ids, max_new_tokens=n, eos_token_id=first)
    assert gen.new_tokens == warm.new_tokens == [first], (gen.new_tokens, warm.new_tokens)
    print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
""")


def _peak_rss_kb(max_new_tokens: int) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(max_new_tokens)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MAXRSS_KB"))
    return int(line.split()[1])


@pytest.mark.torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and ru_maxrss in KB")
def test_huge_max_new_tokens_costs_no_more_memory_than_a_small_one():
    small = _peak_rss_kb(100)
    huge = _peak_rss_kb(10**9)
    assert huge - small < 16 * 1024, dict(small_kb=small, huge_kb=huge)


@torch_test
@pytest.mark.parametrize("arch", mf.ARCHS)
def test_growing_buffers_keep_greedy_tokens(arch, monkeypatch):
    """A start of 2 new tokens (plus a draft): the buffers grow several times
    in a short run; pld.generate and the enable() path give plain greedy's
    tokens."""
    from pld import row_state
    from pld.sequence_buffer import SequenceBuffer

    monkeypatch.setattr(row_state, "INITIAL_NEW_TOKENS", 2)
    grown = []
    real_ensure = SequenceBuffer.ensure

    def counting_ensure(self, size):
        did = real_ensure(self, size)
        if did:
            grown.append(size)
        return did

    monkeypatch.setattr(SequenceBuffer, "ensure", counting_ensure)
    import pld

    model = mf.tiny_model(arch)
    rng = random.Random(f"grow-{arch}")
    for _ in range(4):
        prompt = mf.repeated_prompt(rng, min_len=4, max_len=20)
        ids = mf.as_ids(prompt)
        expected = mf.greedy(model, ids, 200)
        grown.clear()
        gen = pld.generate(model, ids, max_new_tokens=200, prompt_lookup_num_tokens=rng.choice([1, 3, 10]),
                           eos_token_id=None)
        assert gen.new_tokens == expected
        assert len(grown) >= 3  # about 35 slots, 70, 140, then prompt + 200
        grown.clear()
        assert mf.hf_pld(model, ids, 200, 5) == expected
        assert len(grown) >= 3


@torch_test
def test_draft_length_beyond_the_core_limit_is_refused_first():
    import pld

    model = mf.tiny_model("gpt2")
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        pld.generate(model, _ids(), max_new_tokens=4, prompt_lookup_num_tokens=(1 << 20) + 1)
    # the limit itself is fine
    gen = pld.generate(model, _ids(), max_new_tokens=4, prompt_lookup_num_tokens=1 << 20, eos_token_id=None)
    assert gen.new_tokens == mf.greedy(model, _ids(), 4)


@torch_test
def test_prompt_lookup_num_tokens_beyond_the_core_limit_is_refused_first():
    import torch

    import pld

    model = mf.tiny_model("gpt2")
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"), torch.no_grad(), pld.enabled():
        model.generate(_ids(), do_sample=False, max_new_tokens=4, prompt_lookup_num_tokens=(1 << 20) + 1)


@torch_test
def test_max_new_tokens_accepts_index_types():
    import numpy as np

    import pld

    model = mf.tiny_model("gpt2")
    ref = pld.generate(model, _ids(), max_new_tokens=8, eos_token_id=None).new_tokens
    for value in (np.int64(8), np.int32(8), np.uint16(8)):
        assert pld.generate(model, _ids(), max_new_tokens=value, eos_token_id=None).new_tokens == ref
    for value in (np.int64(8), np.int32(3)):
        gen = pld.generate(model, _ids(), max_new_tokens=8, prompt_lookup_num_tokens=value, eos_token_id=None)
        assert gen.new_tokens == ref
    for value in (np.float64(8), 8.0, True):  # no __index__, or a bool: refused
        with pytest.raises(TypeError, match="max_new_tokens"):
            pld.generate(model, _ids(), max_new_tokens=value)


@torch_test
def test_max_new_tokens_zero_is_refused():
    """A positive int, as transformers asks (it refuses max_new_tokens=0)."""
    import pld

    with pytest.raises(ValueError, match="max_new_tokens"):
        pld.generate(mf.tiny_model("gpt2"), _ids(), max_new_tokens=0)


@torch_test
def test_max_new_tokens_is_bounded_by_the_index_limit():
    """prompt + max_new_tokens up to 2**32 - 3 (the index's limit) is
    accepted, and costs nothing when the output stops at once; one more is a
    ValueError before anything is allocated."""
    import pld

    model = mf.tiny_model("gpt2")
    ids = _ids()
    limit = (1 << 32) - 3
    with pytest.raises(ValueError, match="max_new_tokens"):
        pld.generate(model, ids, max_new_tokens=limit - ids.shape[1] + 1)
    first = mf.greedy(model, ids, 1)[0]
    gen = pld.generate(model, ids, max_new_tokens=limit - ids.shape[1], eos_token_id=first)
    assert gen.new_tokens == [first]


# ============================================================ B. no usable cache
def _openai_gpt():
    import torch
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    torch.manual_seed(0)
    config = OpenAIGPTConfig(vocab_size=mf.VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256)
    model = OpenAIGPTLMHeadModel(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = mf.PAD
    return model


@torch_test
def test_model_without_a_cache_is_refused_by_generate():
    import pld

    with pytest.raises(ValueError, match="OpenAIGPTLMHeadModel") as error:
        pld.generate(_openai_gpt(), _ids(), max_new_tokens=12)
    assert "cache" in str(error.value)


@torch_test
@pytest.mark.parametrize("do_sample", [False, True])
def test_model_without_a_cache_is_decoded_plainly_under_enable(do_sample, caplog):
    """transformers' own assisted decoding cannot serve a model without a
    KV cache either (it fails in the model's output): generate() goes to
    transformers' plain decoding, with one warning that says why, and
    gives the tokens of generate() without prompt lookup."""
    import torch

    import pld

    model = _openai_gpt()
    ids = _ids()
    kw = dict(do_sample=do_sample, max_new_tokens=12, pad_token_id=0)
    torch.manual_seed(4)
    with torch.no_grad():
        plain = model.generate(ids, **kw).tolist()
    caplog.clear()
    torch.manual_seed(4)
    with caplog.at_level(logging.INFO, logger="pld"), torch.no_grad(), pld.enabled():
        ours = model.generate(ids, prompt_lookup_num_tokens=4, **kw).tolist()
    assert ours == plain
    records = [r for r in caplog.records if r.name == "pld"]
    assert len(records) == 1, [r.getMessage() for r in records]
    message = records[0].getMessage()
    assert records[0].levelno == logging.WARNING and "no usable KV cache" in message
    assert "transformers' decoding without prompt lookup" in message


def _drops_cache(inner):
    """A model that takes past_key_values and ignores it (it runs the inner
    model without a cache): it looks cache-capable and is not."""
    import torch

    class DropsCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner
            self.config = inner.config
            self.generation_config = inner.generation_config

        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=None, **kwargs):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, use_cache=use_cache)

    return DropsCache()


@torch_test
@pytest.mark.parametrize("arch", mf.ARCHS)
def test_model_ignoring_past_key_values_raises(arch):
    import pld

    model = _drops_cache(mf.tiny_model(arch))
    with pytest.raises(ValueError, match="DropsCache") as error:
        pld.generate(model, _ids(), max_new_tokens=12, eos_token_id=None)
    assert "past_key_values" in str(error.value)


# ============================================================ C. argument types
@torch_test
def test_attention_mask_forms_are_accepted():
    import numpy as np
    import torch

    import pld

    model = mf.tiny_model("llama")
    ids = mf.as_ids([mf.PAD, mf.PAD, 5, 6, 7, 5, 6])
    mask = [[0, 0, 1, 1, 1, 1, 1]]
    ref = pld.generate(model, ids, max_new_tokens=8, eos_token_id=None,
                       attention_mask=torch.tensor(mask)).new_tokens
    for form in (mask, tuple(mask[0]), mask[0], np.array(mask), torch.tensor(mask[0])):
        gen = pld.generate(model, ids, max_new_tokens=8, eos_token_id=None, attention_mask=form)
        assert gen.new_tokens == ref, type(form)


@torch_test
@pytest.mark.parametrize("form", ["list", "shape", "string", "half", "two", "meta"])
def test_bad_attention_mask_names_the_argument(form):
    import torch

    import pld

    ids = _ids()
    bad = {"list": [[1, 1], [1]], "shape": [[1, 1, 1]], "string": "1111111111",
           "half": torch.full(ids.shape, 0.5), "two": torch.full(ids.shape, 2),  # (one row: 0/1 all the same)
           "meta": torch.ones(ids.shape, device="meta")}[form]
    with pytest.raises((TypeError, ValueError), match="attention_mask"):
        pld.generate(mf.tiny_model("gpt2"), ids, max_new_tokens=4, attention_mask=bad)


@torch_test
def test_a_mask_pld_cannot_read_goes_to_transformers_under_enable(caplog):
    """A mask of other values than 0/1 (which a model may weigh in
    between): transformers' plain decoding, with one log line, and its
    tokens (its assisted decoding served it, but stopped before the first
    token on 4.57 to 5.17 when the prompt ended in an eos id)."""
    import torch

    import pld

    model = mf.tiny_model("llama")
    ids = mf.as_ids([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    mask = torch.full(ids.shape, 0.5)
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, eos_token_id=None)
    with torch.no_grad():
        plain = model.generate(ids, **kwargs)
        with pld.enabled(), caplog.at_level(logging.WARNING, logger="pld"):
            got = model.generate(ids, prompt_lookup_num_tokens=5, **kwargs)
    assert got.tolist() == plain.tolist()
    assert "transformers' decoding without prompt lookup (attention_mask: expected 0/1 values)" in caplog.text


@torch_test
def test_eos_token_id_forms_are_accepted():
    import numpy as np
    import torch

    import pld

    model = mf.tiny_model("gpt2")
    ids = _ids()
    first = mf.greedy(model, ids, 1)[0]
    ref = pld.generate(model, ids, max_new_tokens=8, eos_token_id=first).new_tokens
    assert ref == [first]
    for form in (np.int64(first), torch.tensor(first), torch.tensor([first, 0]),
                 [np.int32(first)], (first,), np.array([first])):
        gen = pld.generate(model, ids, max_new_tokens=8, eos_token_id=form)
        assert gen.new_tokens == ref, form


@torch_test
@pytest.mark.parametrize("bad", ["3", 3.0, True, [1.5], [None], object(), "meta", "uint64", 1 << 63])
def test_bad_eos_token_id_names_the_argument(bad):
    import torch

    import pld

    if bad == "meta":
        bad = torch.tensor([3], device="meta")
    elif bad == "uint64":
        bad = torch.tensor([1 << 63], dtype=torch.uint64)
    with pytest.raises((TypeError, ValueError), match="eos_token_id"):
        pld.generate(mf.tiny_model("gpt2"), _ids(), max_new_tokens=4, eos_token_id=bad)


@torch_test
def test_input_ids_on_the_meta_device_name_the_argument():
    import pld

    with pytest.raises(ValueError, match="input_ids.*meta"):
        pld.generate(mf.tiny_model("gpt2"), _ids().to("meta"), max_new_tokens=4)


@torch_test
@pytest.mark.parametrize("config", [5, {"max_new_tokens": 4}, "generation_config"])
def test_a_config_of_another_type_names_the_argument(config):
    import pld

    model = mf.tiny_model("gpt2")
    if config == "generation_config":
        config = model.generation_config
    with pytest.raises(TypeError, match="config: expected a pld.DecodeConfig"):
        pld.generate(model, _ids(), config)


@torch_test
def test_negative_top_k_is_refused_and_draft_sources_may_be_an_iterator():
    import pld

    with pytest.raises(ValueError, match="top_k"):
        pld.generate(mf.tiny_model("gpt2"), _ids(), max_new_tokens=4, do_sample=True, top_k=-3)
    assert pld.DecodeConfig(draft_sources=iter(["prompt"])).draft_sources == ("prompt",)


@pytest.mark.parametrize("name,value", [("temperature", 0.0), ("temperature", -1.0), ("temperature", float("nan")),
                                        ("temperature", float("inf")), ("top_p", 1.5), ("top_p", -0.1),
                                        ("top_p", float("nan"))])
def test_sampling_values_out_of_range_are_refused_by_the_config(name, value):
    """As transformers' warpers refuse them, but when the config is made
    (a top_p above 1 was dropped without a word: top-p acts below 1 only)."""
    import pld

    with pytest.raises(ValueError, match=name):
        pld.DecodeConfig(do_sample=True, **{name: value})
    assert getattr(pld.DecodeConfig(do_sample=True, **{name: 1.0}), name) == 1.0  # (the edge is taken)


_BAD_ARGUMENTS = [
    ("model", None),
    ("model", "gpt2"),
    ("logits_processor", 3),
    ("logits_processor", "lambda"),
    ("logits_processor", "list-of-int"),
    ("stopping_criteria", "lambda"),
    ("streamer", object()),
    ("on_step", 3),
    ("do_sample", "no"),
    ("cost_aware", "no"),
    ("top_k", "5"),
    ("top_p", "0.5"),
    ("temperature", [0.5]),
]


@torch_test
@pytest.mark.parametrize("name,value", _BAD_ARGUMENTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(_BAD_ARGUMENTS)])
def test_wrong_types_name_the_argument(name, value):
    import pld

    if value == "lambda":
        value = lambda *args: False  # noqa: E731 - a callable where a list is expected
    elif value == "list-of-int":
        value = [3]
    kwargs = dict(max_new_tokens=4, eos_token_id=None)
    model = mf.tiny_model("gpt2")
    if name == "model":
        model = value
    else:
        kwargs[name] = value
        if name in ("top_k", "top_p", "temperature"):
            kwargs["do_sample"] = True
    with pytest.raises(TypeError, match=name):
        pld.generate(model, _ids(), **kwargs)


# ============================================================ D. benchmark data
def test_spec_bench_default_from_the_environment(tmp_path, monkeypatch):
    from pld.bench import tasks

    data = tmp_path / "elsewhere" / "q.jsonl"
    data.parent.mkdir()
    data.write_text(json.dumps({"question_id": 1, "category": "rag", "turns": ["R"]}) + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLD_SPEC_BENCH", str(data))
    assert Path(tasks.default_spec_bench()) == data
    # set to a file that is not there: an error naming the variable
    monkeypatch.setenv("PLD_SPEC_BENCH", str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="PLD_SPEC_BENCH"):
        tasks.default_spec_bench()


@pytest.mark.parametrize("where", ["cwd", "parent", "sibling"])
def test_spec_bench_default_from_the_working_directory(tmp_path, monkeypatch, where):
    from pld.bench import tasks

    data = tmp_path / "shared" / "data" / "spec_bench" / "question.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text(json.dumps({"question_id": 1, "category": "rag", "turns": ["R"]}) + "\n")
    cwd = {"cwd": tmp_path, "parent": tmp_path / "a" / "b", "sibling": tmp_path / "main"}[where]
    cwd.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("PLD_SPEC_BENCH", raising=False)
    assert Path(tasks.default_spec_bench()).resolve() == data.resolve()
    assert [p.id for p in tasks.load("spec-bench", ["rag"], 1, tasks.default_spec_bench())] == [
        "spec-bench/1"]


def _folder_with_no_spec_bench_above(tmp_path):
    """tmp_path, or a folder made elsewhere where it has a Spec-Bench file
    above it (a checkout's ../shared beside /tmp/pytest-of-*: the lookup
    walks up to the root)."""
    import tempfile

    from pld.bench import tasks

    for base in (tmp_path, Path("/dev/shm"), Path("/var/tmp"), Path.home()):
        if base.is_dir() and os.access(base, os.W_OK) and \
                not any(os.path.isfile(p) for p in tasks.spec_bench_candidates(str(base))):
            return base if base == tmp_path else Path(tempfile.mkdtemp(dir=base))
    pytest.fail("no writable folder without a Spec-Bench file above it")


def test_spec_bench_without_data_is_a_clear_error(tmp_path):
    import shutil

    env = {k: v for k, v in os.environ.items() if k != "PLD_SPEC_BENCH"}
    where = _folder_with_no_spec_bench_above(tmp_path)
    try:  # the prompts are found before the model loads: nothing is benchmarked
        proc = subprocess.run([sys.executable, "-m", "pld", "bench", "--source", "spec-bench", "--limit", "1",
                               "--out", str(where / "out"), "--no-progress"],
                              capture_output=True, text=True, cwd=where, env=env, timeout=300)
    finally:
        if where != tmp_path:
            shutil.rmtree(where, ignore_errors=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "--data" in proc.stderr and "PLD_SPEC_BENCH" in proc.stderr, proc.stderr
    tried = where.resolve() / "shared" / "data" / "spec_bench" / "question.jsonl"
    assert str(tried) in proc.stderr, proc.stderr


@torch_test
def test_a_model_in_training_mode_is_probed_again_once_in_eval_mode(caplog):
    """The probe is kept per training mode: a model with dropout used in
    train() is refused (pld.generate) or decoded plainly (enable), with
    the reason saying to call eval(); after eval() it is served natively,
    with plain greedy's tokens; back in train() it is refused again."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import pld

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                       resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5,
                                       bos_token_id=None, eos_token_id=None))
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    ids = torch.tensor([[5, 9, 13, 7, 22, 5, 9, 13, 7, 22, 5, 9]])
    model.train()
    with pytest.raises(ValueError, match=r"training mode.*call model\.eval\(\)"):
        pld.generate(model, ids, max_new_tokens=8)
    with pld.enabled(), caplog.at_level(logging.WARNING, logger="pld"), torch.no_grad():
        model.generate(ids, prompt_lookup_num_tokens=4, max_new_tokens=8)
    assert "without prompt lookup" in caplog.text and "training mode" in caplog.text
    model.eval()
    with torch.no_grad():
        plain = model.generate(ids, do_sample=False, max_new_tokens=8)
    assert pld.generate(model, ids, max_new_tokens=8).sequences.tolist() == plain.tolist()
    caplog.clear()
    with pld.enabled(), caplog.at_level(logging.WARNING, logger="pld"), torch.no_grad():
        ours = model.generate(ids, prompt_lookup_num_tokens=4, max_new_tokens=8, do_sample=False)
    assert ours.tolist() == plain.tolist() and "pld:" not in caplog.text
    model.train()
    with pytest.raises(ValueError, match="training mode"):
        pld.generate(model, ids, max_new_tokens=8)
    model.eval()
    model.transformer.drop.train()  # (one module: a LoRA dropout switched back on)
    state = torch.get_rng_state()
    with pytest.raises(ValueError, match="training mode"):
        pld.generate(model, ids, max_new_tokens=8)
    assert torch.equal(torch.get_rng_state(), state)  # (the probe's draws undone)


@torch_test
def test_ids_beyond_the_vocabulary_are_a_value_error_naming_input_ids():
    import torch

    import pld

    model = mf.tiny_model("llama")
    rows = model.get_input_embeddings().weight.shape[0]
    for bad in (-1, rows, 1 << 40):
        with pytest.raises(ValueError, match=rf"input_ids: token ids must be in \[0, {rows}\).*got {bad}"):
            pld.generate(model, torch.tensor([[1, 2, bad, 3]]), max_new_tokens=2)


@torch_test
def test_a_processor_that_returns_no_scores_is_a_type_error_naming_it():
    import torch

    import pld

    model = mf.tiny_model("llama")
    for returned in (lambda ids, scores: None, lambda ids, scores: scores[:, :3]):
        with pytest.raises(TypeError, match="logits_processor: function returned"):
            pld.generate(model, torch.tensor([[1, 2, 3, 1, 2]]), max_new_tokens=3, logits_processor=[returned])


@torch_test
def test_scores_with_no_probability_left_are_a_value_error_naming_the_callers_arguments():
    """A processor that masks every token, or a temperature so small that
    the scores overflow: the error names what the caller passed, not the
    C core's argument (probs)."""
    import torch

    import pld

    model = mf.tiny_model("llama")
    ids = torch.tensor([[1, 2, 3, 1, 2]])
    for kwargs in (dict(logits_processor=[lambda i, s: torch.full_like(s, float("-inf"))]),
                   dict(temperature=1e-300)):
        with pytest.raises(ValueError, match="logits_processor/temperature/top_k/top_p: the processed scores"):
            pld.generate(model, ids, max_new_tokens=3, do_sample=True, **kwargs)


@torch_test
def test_numpy_bools_are_flags_and_bool_tensors_are_not_counts():
    import numpy as np
    import torch

    import pld

    model = mf.tiny_model("llama")
    ids = torch.tensor([[1, 2, 3, 1, 2]])
    assert pld.DecodeConfig(do_sample=np.True_).do_sample is True
    for name in ("max_new_tokens", "prompt_lookup_num_tokens"):
        with pytest.raises(TypeError, match=f"{name} must be an int, got Tensor"):
            pld.generate(model, ids, **{name: torch.tensor(True)})
    with pytest.raises(TypeError, match="eos_token_id"):
        pld.generate(model, ids, max_new_tokens=2, eos_token_id=[torch.tensor(True)])
    for name in ("temperature", "top_p"):
        with pytest.raises(ValueError, match=f"{name} must be a finite number"):
            pld.DecodeConfig(do_sample=True, **{name: 10 ** 400})


@torch_test
def test_a_module_that_is_no_language_model_is_a_value_error_naming_model():
    import torch

    import pld

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x)

    with pytest.raises(ValueError, match="model: Plain cannot be used by pld.generate: it names no vocabulary"):
        pld.generate(Plain().eval(), torch.tensor([[1, 2, 3]]), max_new_tokens=2)


@torch_test
def test_a_model_whose_embedding_transformers_cannot_find_still_generates():
    """get_input_embeddings() raises NotImplementedError where transformers
    cannot find the layer (remote code with its own names): the id check
    reads config.vocab_size, and the call runs."""
    import torch

    import pld

    model = mf.tiny_model("llama")

    class NoEmbedding(type(model)):
        def get_input_embeddings(self):
            raise NotImplementedError("not found")

    ids = torch.tensor([[5, 9, 13, 7, 22, 5, 9, 13]])
    plain = mf.greedy(model, ids, 6)
    twin = copy.copy(model)
    twin.__class__ = NoEmbedding
    assert pld.generate(twin, ids, max_new_tokens=6, eos_token_id=None).new_tokens == plain
    with pytest.raises(ValueError, match=r"input_ids: token ids must be in \[0, "):
        pld.generate(twin, torch.tensor([[5, model.config.vocab_size]]), max_new_tokens=2)
