"""Sibling drafts: rows of a batch with the same prompt draft from what the
others have written (pld.drafts.siblings).

- the source proposes a sibling's continuation of the row's suffix, and
  nothing for a row without siblings;
- greedy: every row still equals plain greedy decoding alone (float32,
  linear drafts and trees), with sibling nodes verified;
- sampling: a batch of two identical prompts keeps each row's joint law
  of its first two tokens, with the second token's draft taken from the
  sibling in many runs (chi-square, seeded, with power);
- ``model.generate(..., do_sample=True, num_return_sequences=n,
  prompt_lookup_num_tokens=k)`` runs under pld.enable(): n rows a prompt,
  seeded runs repeat, top_k=1 gives greedy's tokens; greedy with n > 1 is
  refused as transformers refuses it.
"""
from __future__ import annotations

import random
from collections import Counter

import pytest

import models_fixtures as mf
from models_fixtures import one_thread  # noqa: F401 - a fixture
from test_hf_sampling import TEMPERATURE, V, _next_probs, _stat_model, check_joint_law, joint_law

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]


class _Row:
    """What a source reads of a row (pld.drafts.base.RowView), over a list."""

    def __init__(self, batch_index, prompt, new=()):
        import torch

        self.batch_index = batch_index
        self.seq = list(prompt) + list(new)
        self.prompt_len = len(prompt)
        self.cur = len(self.seq)
        self.memory = {}
        self.siblings = []
        self._ids = torch.tensor([self.seq])

    def ids(self, extra=0):
        return self._ids[:, :self.cur + extra]

    def tail(self, n):
        return self.seq[max(self.cur - n, 0):]

    def new_tokens(self, start=0):
        return self.seq[self.prompt_len + start:]


def _ask(depth=4):
    from pld.drafts.base import Proposal

    return Proposal(depth=depth, max_nodes=64, eos=(), per_ngram=4)


def test_a_row_drafts_its_siblings_continuation_of_its_suffix():
    from pld.config import DecodeConfig
    from pld.drafts import build
    from pld.drafts.base import empty_tree
    from pld.token_tree import SIBLING

    prompt = [1, 2, 3]
    row = _Row(0, prompt, [7, 8])
    ahead = _Row(1, prompt, [7, 8, 9, 10, 11])
    lone = _Row(2, [4, 5, 6], [7, 8])
    row.siblings, ahead.siblings = [ahead], [row]
    for tree_mode in (False, True):
        source, = build(("siblings",), DecodeConfig(draft_tree=tree_mode, draft_sources=("siblings",)))
        for r in (row, ahead, lone):
            r.memory.clear()
        tree = source.propose(row, empty_tree(), _ask())
        assert tree.tokens[:3] == [9, 10, 11] and tree.parents[:3] == [-1, 0, 1]
        assert set(tree.origins) == {SIBLING} and tree.ngrams[0] == 3  # (3 7 8): the prompt's last token and two new
        assert source.propose(lone, empty_tree(), _ask()).tokens == []  # no siblings, no drafts
        # the sibling's opening is found from the prompt's last tokens
        start = _Row(0, prompt)
        start.siblings = [ahead]
        assert source.propose(start, empty_tree(), _ask(3)).tokens[:3] == [7, 8, 9]
        # what the sibling writes later is seen at the next propose
        ahead.seq += [12]
        ahead.cur += 1
        ahead._ids = __import__("torch").tensor([ahead.seq])
        row.memory.clear()
        assert source.propose(row, empty_tree(), _ask(5)).tokens[:4] == [9, 10, 11, 12]
        ahead.seq, ahead.cur = ahead.seq[:-1], ahead.cur - 1
        ahead._ids = __import__("torch").tensor([ahead.seq])
        ahead.memory.clear()


@pytest.mark.parametrize("arch", mf.ARCHS)
@pytest.mark.parametrize("tree", [False, True])
def test_greedy_rows_with_siblings_equal_greedy_alone(arch, tree):
    """Rows sharing prompts (two groups, interleaved, with a lone row), each
    equal to greedy decoding of its prompt alone, with the source on.
    (Greedy siblings write the same tokens in step, so their drafts add
    nothing new here; the source's use is checked by the unit test above
    and the sampling test below.)"""
    import torch

    from pld import loop

    model = mf.tiny_model(arch)
    rng = random.Random(f"siblings-{arch}-{tree}")
    for trial in range(3):
        a, b, c = (mf.repeated_prompt(rng) for _ in range(3))
        prompts = [a, b, a, b, a, c]
        L = max(map(len, prompts))
        ids = torch.tensor([[mf.PAD] * (L - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        alone = [mf.greedy(model, mf.as_ids(p), 24) for p in prompts]
        with torch.no_grad():
            result = loop.run(model, ids, attention_mask=mask, max_new_tokens=24, eos_token_id=None,
                              prompt_lookup_num_tokens=4, cost_aware=False, draft_tree=tree)
        assert result.rows == alone, dict(trial=trial)


def _sibling_prompt(model):
    """[c, d, a, b] with the first token likely to be b or a, so that the
    second token's draft is the sibling's first token (its continuation
    of b in [a, b, s1])."""
    best = None
    for a in range(V - 1):
        for b in range(V - 1):
            prompt = [3, 4, a, b]
            p = _next_probs(model, prompt)
            score = p[b] + p[a]
            if best is None or score > best[0]:
                best = (score, prompt)
    assert best[0] > 0.3
    return best[1]


def test_joint_law_of_a_row_whose_drafts_come_from_its_sibling():
    import torch

    from pld import loop
    from pld.token_tree import SIBLING

    model = _stat_model()
    prompt = _sibling_prompt(model)
    ids = torch.tensor([prompt, prompt], device=model.device)
    p1, joint = joint_law(model, prompt)
    N = 2000
    torch.manual_seed(2026)
    counts = Counter()
    from_sibling = accepted = 0
    for _ in range(N):
        steps = []
        with torch.no_grad():
            result = loop.run(model, ids, max_new_tokens=3, prompt_lookup_num_tokens=2, max_matching_ngram_size=2,
                                  do_sample=True, temperature=TEMPERATURE, eos_token_id=None,
                                  draft_sources=("siblings",), cost_aware=False, on_step=steps.append)
        t = result.rows[0]
        counts[t[0] * V + t[1]] += 1
        for rec in steps:
            if rec.row == 0 and rec.tree is not None and rec.proposed:
                from_sibling += all(o == SIBLING for o in rec.tree.origins)
                accepted += rec.accepted > 0
                break
    assert from_sibling > 300 and accepted > 50, (from_sibling, accepted)
    check_joint_law(counts, p1, joint, N)


def test_num_return_sequences_samples_through_the_native_loop(monkeypatch):
    import torch

    import pld

    model = mf.tiny_model("llama")
    counter = mf.install_counter(monkeypatch)
    ids = mf.as_ids(mf.repeated_prompt(random.Random("nrs"), min_len=20))

    def sample(seed, **kw):
        torch.manual_seed(seed)
        with pld.enabled(), torch.no_grad():
            return model.generate(ids, do_sample=True, num_return_sequences=4, prompt_lookup_num_tokens=5,
                                  max_new_tokens=16, pad_token_id=mf.PAD, **kw)

    out = sample(7, temperature=0.7, top_p=0.9)
    assert out.shape[0] == 4 and counter.calls == 1
    assert torch.equal(out[:, :ids.shape[1]], ids.repeat(4, 1))
    assert torch.equal(sample(7, temperature=0.7, top_p=0.9), out)  # seeded runs repeat
    top1 = sample(3, top_k=1)
    greedy = mf.greedy(model, ids, 16, pad_token_id=mf.PAD)
    assert all(row[ids.shape[1]:].tolist() == greedy for row in top1)
    with pld.enabled(), pytest.raises(ValueError, match="num_return_sequences"):
        model.generate(ids, do_sample=False, num_return_sequences=2, prompt_lookup_num_tokens=5,
                       max_new_tokens=4)
