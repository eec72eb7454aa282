"""The embedded SmolLM2-135M-Instruct (GGUF, loaded offline by pld.models):
its end-of-turn token, and pld-enabled generate() against plain greedy on
20 real Spec-Bench prompts (10 summarization, 10 rag), token for token,
with linear drafts and with token trees (draft_tree=True).

Loading takes ~25 s and each prompt a few seconds on one thread; the
prompts are cut to their first 1500 characters to keep the file short.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
PER_CATEGORY = 10
MAX_CHARS = 1500
MAX_NEW = 32


def _prompts():
    if not QUESTIONS.is_file():
        return []
    chosen = {"summarization": [], "rag": []}
    with QUESTIONS.open(encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            bucket = chosen.get(q.get("category"))
            if bucket is not None and len(bucket) < PER_CATEGORY:
                bucket.append((f"{q['category']}-{q['question_id']}", q["turns"][0][:MAX_CHARS]))
    return chosen["summarization"] + chosen["rag"]


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def embedded(one_thread):  # noqa: F811 - load on one thread too
    from pld import models

    return models.load()


def test_spec_bench_file_is_there():
    assert QUESTIONS.is_file(), QUESTIONS
    assert len(PROMPTS) == 2 * PER_CATEGORY


def test_end_of_turn_token(embedded):
    model, tokenizer = embedded
    assert tokenizer.eos_token == "<|im_end|>"
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_id == end_id
    eos = model.generation_config.eos_token_id
    assert end_id == eos or (isinstance(eos, list) and end_id in eos)
    assert model.generation_config.pad_token_id is not None


@pytest.mark.parametrize("name,prompt", PROMPTS, ids=[n for n, _ in PROMPTS])
def test_pld_generate_equals_greedy(embedded, name, prompt, monkeypatch):
    import torch

    import pld
    from pld.bench import demo
    from pld import loop

    model, tokenizer = embedded
    counter_calls = []
    real_run = loop.run
    monkeypatch.setattr(loop, "run", lambda *a, **k: counter_calls.append(1) or real_run(*a, **k))
    ids = demo.build_input_ids(tokenizer, prompt)
    with torch.no_grad():
        plain = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW)
        for options in ({}, {"draft_tree": True}):  # linear drafts; token trees with successors
            with pld.enabled(**options):
                ours = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW,
                                      prompt_lookup_num_tokens=10)
            assert ours[0].tolist() == plain[0].tolist(), (
                options, tokenizer.decode(plain[0, ids.shape[1]:]),
                tokenizer.decode(ours[0, ids.shape[1]:]))
    assert len(counter_calls) == 2  # served natively, both times


def test_stop_strings(embedded):
    """stop_strings (they need the tokenizer) end the output where plain
    greedy's ends, inside an accepted block or not."""
    import torch

    import pld
    from pld.bench import demo

    model, tokenizer = embedded
    name, prompt = PROMPTS[0]
    ids = demo.build_input_ids(tokenizer, prompt)
    with torch.no_grad():
        free = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW)
    text = tokenizer.decode(free[0, ids.shape[1]:], skip_special_tokens=True)
    words = [w for w in text.split() if len(w) >= 4]
    assert len(words) >= 3, text
    checked = 0
    for stop in (words[1], words[len(words) // 2]):
        kw = dict(do_sample=False, max_new_tokens=MAX_NEW, stop_strings=[stop], tokenizer=tokenizer)
        with torch.no_grad():
            plain = model.generate(ids, **kw)
            with pld.enabled():
                ours = model.generate(ids, prompt_lookup_num_tokens=10, **kw)
        assert ours[0].tolist() == plain[0].tolist(), stop
        out_text = tokenizer.decode(plain[0, ids.shape[1]:], skip_special_tokens=True)
        assert out_text.rstrip().endswith(stop) or stop in out_text
        assert plain.shape[1] < free.shape[1]  # it did stop early
        checked += 1
    assert checked == 2
