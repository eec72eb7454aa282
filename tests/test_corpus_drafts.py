"""Corpus drafts in a generation (pld.drafts.corpus_source): a pld.Corpus
kept across calls.

- greedy with a corpus (its sequences related, unrelated and misleading)
  equals greedy alone, linear drafts and trees, with corpus nodes verified;
- a call repeated with the corpus drafts the earlier output and accepts it;
- each finished output is added unless ``corpus_add=False``;
- ``pld.enable(corpus=...)`` serves model.generate(prompt_lookup_num_tokens=k);
- a corpus holding ids beyond the model's vocabulary, or first used with
  another model's vocabulary or special ids, is refused with a ValueError;
- two threads generating with one corpus at once each get greedy's tokens;
- sampling through corpus drafts keeps the joint law of the first two
  tokens (chi-square, seeded, with power).
"""
from __future__ import annotations

import random
from collections import Counter

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture
from test_hf_sampling import TEMPERATURE, V, _next_probs, _stat_model, check_joint_law, joint_law

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


def _corpus(**kw):
    import pld

    return pld.Corpus(max_tokens=kw.pop("max_tokens", 1 << 16), **kw)


@pytest.mark.parametrize("arch", mf.ARCHS)
@pytest.mark.parametrize("tree", [False, True])
def test_greedy_with_a_corpus_equals_greedy_alone(arch, tree):
    import torch

    from pld import loop
    from pld.token_tree import CORPUS

    model = mf.tiny_model(arch)
    rng = random.Random(f"corpus-{arch}-{tree}")
    corpus = _corpus()
    used = 0
    for trial in range(4):
        prompt = mf.repeated_prompt(rng, min_len=10)
        alone = mf.greedy(model, mf.as_ids(prompt), 30)
        # the output itself with edits, text around the prompt's tail, noise
        corpus.add([t if rng.random() < 0.8 else rng.randrange(mf.PROMPT_VOCAB) for t in alone])
        corpus.add(prompt[-3:] + [rng.randrange(mf.PROMPT_VOCAB) for _ in range(20)])
        corpus.add([rng.randrange(mf.PROMPT_VOCAB) for _ in range(50)])
        steps = []
        with torch.no_grad():
            result = loop.run(model, mf.as_ids(prompt), max_new_tokens=30, eos_token_id=None,
                              prompt_lookup_num_tokens=6, cost_aware=False, draft_tree=tree, corpus=corpus,
                              corpus_add=trial % 2 == 0, on_step=steps.append)
        assert result.sequences[0, len(prompt):].tolist() == alone, dict(trial=trial)
        used += sum(rec.tree.origins[j] == CORPUS for rec in steps if rec.tree is not None
                    and rec.tree.origins is not None for j in rec.chosen)
    assert used > 0  # corpus nodes were verified


def test_a_repeated_call_drafts_the_earlier_output_and_outputs_are_added():
    import torch

    import pld

    model = mf.tiny_model("llama")
    prompt = list(range(5, 25))  # no repeats: prompt lookup alone finds little
    ids = mf.as_ids(prompt)
    corpus = _corpus()
    kw = dict(max_new_tokens=40, eos_token_id=None, prompt_lookup_num_tokens=8, cost_aware=False)
    first = pld.generate(model, ids, corpus=corpus, **kw)
    assert corpus.sequences() == [first.new_tokens] and corpus.num_sequences == 1
    again = pld.generate(model, ids, corpus=corpus, corpus_add=False, draft_tree=True, **kw)
    alone = pld.generate(model, ids, draft_tree=True, **kw)
    assert again.new_tokens == first.new_tokens == alone.new_tokens
    assert corpus.num_sequences == 1  # corpus_add=False
    assert again.stats.steps < alone.stats.steps  # the earlier output, copied
    with pld.enabled(corpus=corpus, cost_aware=False), torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=40, prompt_lookup_num_tokens=8)
    assert out[0, len(prompt):].tolist() == alone.new_tokens and corpus.num_sequences == 2


def test_a_corpus_of_another_vocabulary_or_model_is_refused():
    import pld

    small = mf.tiny_model("llama", vocab=40)
    ids = mf.as_ids([1, 2, 3, 4])
    foreign = _corpus()
    foreign.add([1, 2, 3, 60])
    with pytest.raises(ValueError, match="vocabular"):
        pld.generate(small, ids, corpus=foreign, max_new_tokens=2)
    mine = _corpus()
    pld.generate(small, ids, corpus=mine, max_new_tokens=2, eos_token_id=None)
    other = mf.tiny_model("llama")  # another vocabulary size: another tokenizer
    with pytest.raises(ValueError, match="corpus"):
        pld.generate(other, ids, corpus=mine, max_new_tokens=2)
    with pytest.raises(TypeError, match="corpus"):
        pld.generate(small, ids, corpus=[1, 2, 3], max_new_tokens=2)


def test_threads_share_one_corpus():
    import torch

    import pld

    model = mf.tiny_model("llama")
    rng = random.Random("corpus-threads")
    prompts = [mf.repeated_prompt(rng, min_len=12) for _ in range(4)]
    expected = [mf.greedy(model, mf.as_ids(p), 24) for p in prompts]
    corpus = _corpus()
    got = {}

    def work(k):
        def go():
            for j in range(k, len(prompts), 2):
                with torch.no_grad():
                    gen = pld.generate(model, mf.as_ids(prompts[j]), corpus=corpus, max_new_tokens=24,
                                       eos_token_id=None, draft_tree=j % 2 == 1, cost_aware=False)
                got[j] = gen.new_tokens
        return go

    mf.in_threads(work(0), work(1))
    assert [got[j] for j in range(len(prompts))] == expected
    assert corpus.num_sequences == len(prompts)


def test_joint_law_through_corpus_drafts():
    """The corpus holds [a, b, x, y] for the prompt's tail (a, b), so the
    first step drafts x, y from it (the prompt itself has no match)."""
    import torch

    import pld

    model = _stat_model()
    a, b = 1, 2
    best = None
    for x in range(V - 1):
        for y in range(V - 1):
            prompt = [3, 4, 5, a, b]
            p = _next_probs(model, prompt)[x] * _next_probs(model, prompt + [x])[y]
            if best is None or p > best[0]:
                best = (p, prompt, x, y)
    _, prompt, x, y = best
    corpus = pld.Corpus(max_tokens=64, min_ngram_size=1, max_ngram_size=2)
    corpus.add([6, a, b, x, y])
    ids = torch.tensor([prompt], device=model.device)
    p1, joint = joint_law(model, prompt)
    N = 2000
    torch.manual_seed(2027)
    counts = Counter()
    accepted = Counter()
    for _ in range(N):
        gen = pld.generate(model, ids, max_new_tokens=3, prompt_lookup_num_tokens=2, max_matching_ngram_size=2,
                           do_sample=True, temperature=TEMPERATURE, eos_token_id=None, draft_sources=("corpus",),
                           corpus=corpus, corpus_add=False, cost_aware=False)
        t = gen.new_tokens
        counts[t[0] * V + t[1]] += 1
        first = gen.stats.records[0]
        assert first.proposed == 2  # the corpus's x, y
        accepted[first.accepted] += 1
    assert all(accepted[k] > 20 for k in (0, 1, 2)), accepted
    check_joint_law(counts, p1, joint, N)


def test_the_corpus_keeps_what_generations_learn_of_its_drafts(monkeypatch):
    import torch

    from pld import decoder, loop
    from pld.token_tree import CORPUS, AcceptanceModel

    model = mf.tiny_model("llama")
    prompt = list(range(5, 25))
    ids = mf.as_ids(prompt)
    corpus = _corpus()
    kw = dict(max_new_tokens=40, eos_token_id=None, prompt_lookup_num_tokens=8, cost_aware=False, draft_tree=True)
    with torch.no_grad():
        loop.run(model, ids, corpus=corpus, **kw)
        assert corpus.acceptance() == ({}, {})  # the corpus was empty: no corpus node was verified
        steps = []
        loop.run(model, ids, corpus=corpus, corpus_add=False, on_step=steps.append, **kw)
    hits, trials = corpus.acceptance()
    # every accepted corpus node is a hit; every verified one whose parent was reached a trial
    accepted = sum(rec.tree.origins[j] == CORPUS for rec in steps for j in rec.path)
    verified = sum(rec.tree.origins[j] == CORPUS for rec in steps for j in rec.chosen
                   if rec.tree.parents[j] in {-1, *rec.path})
    assert accepted > 0 and sum(hits.values()) == accepted and sum(trials.values()) == verified
    assert all(0 < hits.get(b, 0) <= t for b, t in trials.items() if hits.get(b))
    # the next generation starts from it: the prior plus what was learned, for corpus nodes only
    started = []

    class Recording(AcceptanceModel):
        def add_counts(self, origin, h, t):
            super().add_counts(origin, h, t)
            started.append((origin, self.counts(CORPUS)[1], self.counts(0)[1]))

    monkeypatch.setattr(decoder, "AcceptanceModel", Recording)
    with torch.no_grad():
        loop.run(model, ids, corpus=corpus, corpus_add=False, **kw)
    prior = AcceptanceModel().counts(CORPUS)[1]
    assert len(started) == 1 and started[0][0] == CORPUS
    assert started[0][1] == {k: prior[k] + trials.get(k, 0.0) for k in prior}
    assert started[0][2] == AcceptanceModel().counts(0)[1]  # the row's own buckets untouched
    assert corpus.acceptance()[1] != trials  # the third run taught it more


def test_learned_trust_keeps_a_window_and_refuses_nonsense():
    from pld.corpus import TRUST_WINDOW

    corpus = _corpus()
    b = (3, 0, 1, 3)
    corpus.learn({b: 600.0}, {b: 800.0})
    corpus.learn({b: 100.0}, {b: 400.0})
    hits, trials = corpus.acceptance()
    assert trials[b] == TRUST_WINDOW and hits[b] == pytest.approx(700.0 * TRUST_WINDOW / 1200.0)
    with pytest.raises(ValueError, match="hits"):
        corpus.learn({b: 5.0}, {b: 4.0})
    for hits, trials, what in [({}, {(4, 0, 1, 3): 1.0}, "not an acceptance bucket"),
                               ({}, {(3, 0, 1): 1.0}, "not an acceptance bucket"),
                               ({}, {(True, 0, 1, 3): 1.0}, "not an acceptance bucket"),
                               ({b: float("inf")}, {b: float("inf")}, "finite"),
                               ({b: float("nan")}, {b: 4.0}, "finite"),
                               ({b: 1.0}, {}, "hits"),
                               ({b: -1.0}, {b: 4.0}, "hits")]:
        with pytest.raises(ValueError, match=what):
            corpus.learn(hits, trials)
    with pytest.raises(TypeError, match="trials"):
        corpus.learn({}, [(b, 1.0)])
    assert corpus.acceptance()[1] == {b: TRUST_WINDOW}  # nothing refused was learned
    corpus.clear()
    assert corpus.acceptance()[1] == {b: TRUST_WINDOW}  # clear() keeps it
