"""vLLM greedy with pld's drafter gives exactly vLLM greedy's tokens
without speculation: one request, 8 of different lengths at once, requests
arriving while others run, preemption under a small KV cache, an 8k-token
prompt, and a corpus the requests share; sampling with n = 4. The drafter runs inside vLLM's worker, loaded through its
custom_class plug point."""
from __future__ import annotations

import gc

import pytest

from engines import engine

pytestmark = pytest.mark.vllm

NEW = 64


def _prompts(model_dir, n, tasks=("summarization", "rag", "code")):
    from transformers import AutoTokenizer

    from pld.bench import builtin_tasks

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for p in builtin_tasks.prompts(list(tasks), n):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}], add_generation_prompt=True,
                                            return_dict=False)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def _greedy(llm, prompts, new=NEW):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                       SamplingParams(temperature=0.0, max_tokens=new), use_tqdm=False)
    return [list(r.outputs[0].token_ids) for r in res]


def _accepted(llm):
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:spec_decode_num_accepted_tokens")


def test_one_request(plain, drafting, model_dir):
    prompts = _prompts(model_dir, 1)[:2]
    for p in prompts:
        assert _greedy(drafting, [p]) == _greedy(plain, [p])
    assert _accepted(drafting) > 0  # the drafts were used, not just made


def test_eight_requests_of_different_lengths_at_once(plain, drafting, model_dir):
    prompts = _prompts(model_dir, 3)[:8]
    prompts = [p[:len(p) - 37 * i] if len(p) > 37 * i + 20 else p for i, p in enumerate(prompts)]
    assert len({len(p) for p in prompts}) == 8
    assert _greedy(drafting, prompts) == _greedy(plain, prompts)


def _staggered(llm, prompts, arrive_after):
    """Requests added while others run: prompt i joins after
    arrive_after[i] engine steps. Each request's tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    core = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=NEW)
    done, step, pending = {}, 0, sorted(range(len(prompts)), key=lambda i: arrive_after[i])
    while pending or core.has_unfinished_requests():
        while pending and arrive_after[pending[0]] <= step:
            i = pending.pop(0)
            core.add_request(f"staggered-{id(llm)}-{step}-{i}", TokensPrompt(prompt_token_ids=prompts[i]), params)
        for out in core.step():
            if out.finished:
                done[int(out.request_id.rsplit("-", 1)[1])] = list(out.outputs[0].token_ids)
        step += 1
    return [done[i] for i in range(len(prompts))]


def test_requests_arriving_while_others_run(plain, drafting, model_dir):
    prompts = _prompts(model_dir, 2)[:6]
    arrive = [0, 0, 3, 7, 12, 20]
    assert _staggered(drafting, prompts, arrive) == _staggered(plain, prompts, arrive)


def test_an_8k_token_prompt(plain, drafting, model_dir):
    docs = _prompts(model_dir, 8, tasks=("summarization",))
    body = [t for p in docs for t in p[:-5]]
    long = (body * (8000 // len(body) + 1))[:8000] + docs[0][-5:]  # documents joined, then the turn's end
    assert len(long) == 8005
    assert _greedy(drafting, [long], new=48) == _greedy(plain, [long], new=48)


def test_seeded_sampling_with_n_4(drafting, model_dir):
    """Sampling through pld's drafter: four different samples of a prompt.
    Whether a seeded run repeats is vLLM's to keep, and vLLM 0.32's CPU
    build does not keep it under speculation, with its own ngram drafter
    too (3 runs, 3 outputs: README "Serving with vLLM"); what pld owes --
    the same drafts for the same tokens, a request that repeats an earlier
    one included -- is tests/test_vllm_drafter.py's."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    p = _prompts(model_dir, 1, tasks=("summarization",))[0]
    params = SamplingParams(n=4, temperature=0.8, top_p=0.95, seed=1234, max_tokens=48)
    outs = [list(o.token_ids) for o in drafting.generate([TokensPrompt(prompt_token_ids=p)], params,
                                                          use_tqdm=False)[0].outputs]
    assert len(outs) == 4 and all(len(o) == 48 or o[-1] == 2 for o in outs)
    assert len({tuple(o) for o in outs}) > 1  # four samples, not one repeated


@pytest.fixture(scope="module")
def small(model_dir, tmp_path_factory):
    """(plain, drafting) engines with a KV cache too small for a batch of
    8 requests of 400 + 128 tokens; the drafting one learns a corpus that
    its requests share, saved as it learns."""
    corpus_file = str(tmp_path_factory.mktemp("corpus") / "outputs.pldc")
    engines = [engine(model_dir, False, kv_bytes=64 << 20, max_model_len=1024),
               engine(model_dir, True, kv_bytes=64 << 20, max_model_len=1024, learn=True, save_corpus=corpus_file,
                      save_every=0)]
    yield engines + [corpus_file]
    del engines
    gc.collect()


def test_preemption_under_a_small_kv_cache(model_dir, small):
    """vLLM preempts requests and resumes them (recomputed); the drafter
    must still draft each from its own tokens, and the outputs stay plain's."""
    plain, drafting, _ = small
    prompts = [p[:400] for p in _prompts(model_dir, 3)[:8]]
    preempted = lambda llm: sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")  # noqa: E731
    assert _greedy(drafting, prompts, new=128) == _greedy(plain, prompts, new=128)
    assert preempted(drafting) > 0, "the KV cache was large enough: nothing was preempted"


def test_a_corpus_the_requests_share(model_dir, small):
    """A stream of calls: each call's first step hands the requests that
    finished before it to the corpus, which the drafter saves as it learns;
    outputs stay plain's."""
    from pld.corpus import Corpus

    plain, drafting, corpus_file = small
    prompts = _prompts(model_dir, 2, tasks=("code",))
    expected = [_greedy(plain, [p])[0] for p in prompts]
    for p, want in zip(prompts + prompts[:1], expected + expected[:1]):
        assert _greedy(drafting, [p]) == [want]
    assert any(seq == expected[1] for seq in Corpus.load(corpus_file).sequences())
