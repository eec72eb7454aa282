"""pld.Corpus and NgramIndex.propose_tree_after (csrc/pld.h, "Corpus").

* NgramIndex.propose_tree_after and Corpus.propose_tree equal the plain
  references of tests/reference.py (propose_tree_after_reference,
  ReferenceCorpus) on every input, through adds that evict;
* eviction and bounds: never more than max_tokens held, oldest first;
* memory: nbytes within pld.h's bound on ~1M tokens;
* bad input: errors naming the argument; corrupt or forged files: a
  ValueError naming the file; save/load round trips;
* threads sharing one corpus (in a child process: a crash fails the test,
  not the suite).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pld
from pld import _core
from pld.corpus import MAGIC, Corpus, tokenizer_fingerprint
from reference import ReferenceCorpus, propose_tree_after_reference

EX = settings().max_examples
BYTES_PER_TOKEN = 160  # pld.h, PLD_CORPUS_BYTES_PER_TOKEN (sizes 2..4)


def memory_bound(c) -> int:
    """pld.h's bound on nbytes (sizes 2..4)."""
    return (BYTES_PER_TOKEN * (len(c) + c.num_sequences) + 24576 * c._core.segments_used
            + 8 * c.num_sequences + 4096)


def check_trie(lists) -> None:
    """A well-formed trie: parents first, depth = parent's + 1, siblings
    distinct, support >= 1."""
    tokens, parents, depths, ngrams, supports = lists
    assert len({len(x) for x in lists}) == 1
    seen = set()
    for v, (t, p, d, s) in enumerate(zip(tokens, parents, depths, supports)):
        assert -1 <= p < v and s >= 1 and ngrams[v] >= 1
        assert d == (1 if p < 0 else depths[p] + 1)
        assert (p, t) not in seen
        seen.add((p, t))


# ============================================================ properties

@st.composite
def after_cases(draw):
    vocab = draw(st.integers(1, 6))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    low = -2 if draw(st.booleans()) else 0  # negative ids are ids like any other
    n = draw(st.one_of(st.integers(0, 30), st.integers(0, 200)))
    seq = [rng.randint(low, vocab - 1) for _ in range(n)]
    max_n = draw(st.integers(1, 4))
    min_n = draw(st.integers(1, max_n))
    policy = draw(st.sampled_from(["first", "recent", "frequent"]))
    clen = draw(st.integers(0, 8))
    if seq and draw(st.booleans()):
        at = rng.randint(0, len(seq))
        context = seq[max(0, at - clen):at]
    else:
        context = [rng.randint(low, vocab - 1) for _ in range(clen)]
    depth = draw(st.integers(1, 10))
    per_ngram = draw(st.integers(1, 6))
    max_nodes = draw(st.one_of(st.integers(0, 8), st.integers(0, 100)))
    eos = draw(st.lists(st.integers(0, 6), max_size=2))
    cut = draw(st.integers(0, 250))
    return seq, max_n, min_n, policy, context, depth, per_ngram, max_nodes, eos, cut


@settings(max_examples=EX)
@given(case=after_cases())
def test_propose_tree_after_matches_reference(case):
    seq, max_n, min_n, policy, context, depth, per_ngram, max_nodes, eos, cut = case
    ix = pld.NgramIndex(max_n, min_n, policy)
    # in two pieces with a truncation between: the chains must survive it
    cut = min(cut, len(seq))
    ix.extend(seq[:cut])
    ix.truncate(cut // 2)
    ix.extend(seq[cut // 2:])
    got = ix.propose_tree_after(context, depth, per_ngram=per_ngram, max_nodes=max_nodes,
                                eos_token_id=eos or None)
    want = propose_tree_after_reference(seq, max_n, min_n, policy, context, depth, per_ngram,
                                        max_nodes, eos)
    assert tuple(got) == tuple(want), (seq, context, got, want)
    check_trie(got)
    # the context may be any token input; only its last max_n ids count
    arr = np.array([7] * 5 + context, dtype=np.int64)
    assert tuple(ix.propose_tree_after(arr, depth, per_ngram, max_nodes, eos or None)) == tuple(got) \
        or len(context) < max_n


@st.composite
def corpus_cases(draw):
    max_tokens = draw(st.integers(1, 60))
    segments = draw(st.integers(1, 5))
    max_n = draw(st.integers(1, 4))
    min_n = draw(st.integers(1, max_n))
    vocab = draw(st.integers(1, 6))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["add", "add", "add", "propose", "propose", "clear"]))
        if kind == "add":
            n = draw(st.one_of(st.integers(0, 12), st.integers(0, max_tokens)))
            ops.append(("add", [rng.randint(0, vocab - 1) for _ in range(n)]))
        elif kind == "propose":
            ops.append(("propose", rng.random(), draw(st.integers(0, 8)), draw(st.integers(1, 8)),
                        draw(st.integers(1, 5)), draw(st.integers(0, 40)),
                        draw(st.one_of(st.none(), st.integers(0, 5)))))
        elif draw(st.integers(0, 3)) == 0:
            ops.append(("clear",))
    return max_tokens, segments, min_n, max_n, vocab, rng.random(), ops


@settings(max_examples=EX)
@given(case=corpus_cases())
def test_corpus_matches_reference(case):
    max_tokens, segments, min_n, max_n, vocab, seed, ops = case
    c = Corpus(max_tokens, min_ngram_size=min_n, max_ngram_size=max_n, segments=segments)
    ref = ReferenceCorpus(max_tokens, min_n, max_n, segments)
    rng = random.Random(seed)
    added = []
    for op in ops:
        if op[0] == "add":
            if len(op[1]) > max_tokens:  # refused by both, nothing changes
                with pytest.raises(ValueError, match="tokens"):
                    c.add(op[1])
                with pytest.raises(ValueError):
                    ref.add(op[1])
            else:
                c.add(op[1])
                ref.add(op[1])
                if op[1]:
                    added.append(op[1])
        elif op[0] == "clear":
            c.clear()
            ref.clear()
        else:
            _, r, clen, depth, per_ngram, max_nodes, eos = op
            held = ref.sequences()
            if held and r < 0.7:
                s = held[int(r / 0.7 * len(held))]
                at = rng.randint(1, len(s))
                context = s[max(0, at - clen):at]
            else:
                context = [rng.randint(-1, vocab) for _ in range(clen)]
            got = c.propose_tree(context, depth, per_ngram=per_ngram, max_nodes=max_nodes,
                                 eos_token_id=eos)
            want = ref.propose_tree(context, depth, per_ngram, max_nodes, eos)
            assert tuple(got) == tuple(want), (ref.segs, context, got, want)
            check_trie(got)
        assert len(c) == len(ref) <= max_tokens
        assert c.num_sequences == ref.num_sequences
        assert c.evicted == ref.evicted
        assert c.max_id == ref.max_id
        assert c._core.segments_used == len(ref.segs) <= segments
        assert c.sequences() == ref.sequences()
        # what is held is what was added last, in order
        held = c.sequences()
        assert held == added[len(added) - len(held):] if held else True


# ====================================================== eviction, bounds

def test_eviction_oldest_first_and_bounded():
    rng = random.Random(5)
    c = Corpus(1000, segments=4, seed=3)
    added = []
    for i in range(400):
        s = [rng.randint(0, 50) for _ in range(rng.randint(1, 120))]
        c.add(s)
        added.append(s)
        assert len(c) <= 1000 and c._core.segments_used <= 4
        assert c.num_sequences + c.evicted == len(added)
        held = c.sequences()
        assert held == added[len(added) - len(held):]
        assert [c._core.sequence(i) for i in range(len(held))] == held
    assert c.evicted > 300
    # a sequence of max_tokens: everything else goes
    c.add(list(range(1000)))
    assert c.sequences() == [list(range(1000))] and c.max_id == 999
    c.clear()
    assert len(c) == 0 and c.num_sequences == 0 and c.max_id == -1 and c.sequences() == []
    assert c.evicted == len(added)  # clear() evicts nothing
    assert c.propose_tree([1, 2, 3], 4) == ([], [], [], [], [])
    c.add([])  # an empty sequence: nothing
    assert c.num_sequences == 0


def test_one_segment_and_tiny_corpus():
    c = Corpus(5, segments=1, min_ngram_size=1, max_ngram_size=2)
    c.add([1, 2, 3])
    c.add([1, 2])  # 3 >= ceil(5 / 1)? no: joins the segment
    assert c._core.segments_used == 1 and c.num_sequences == 2
    c.add([4])  # 5 >= 5: a new segment, the ring is full: the old one goes
    assert c.sequences() == [[4]] and c.evicted == 2


def test_memory_per_token_within_bound():
    from pld.bench.lookup import corpus_stream

    seqs = corpus_stream(1 << 20, seed=11)
    c = Corpus(1 << 20, seed=1)
    worst = 0.0
    for i, s in enumerate(seqs):
        c.add(s)
        if i % 97 == 0 or i == len(seqs) - 1:
            assert c.nbytes <= memory_bound(c)
            if len(c) > 1 << 18:
                worst = max(worst, c.bytes_per_token)
    assert len(c) == sum(s.size for s in seqs) <= 1 << 20
    assert 16 < worst <= BYTES_PER_TOKEN, worst
    # turned over twice more: the bound still holds, the oldest went
    for s in corpus_stream(1 << 21, seed=12):
        c.add(s)
    assert len(c) <= 1 << 20 and c.evicted > 0 and c.nbytes <= memory_bound(c)
    assert c.bytes_per_token <= BYTES_PER_TOKEN
    # the lookup's work is bounded: the root's supports count candidates,
    # at most segments x sizes x per_ngram of them
    rng = random.Random(0)
    held = c.sequences()
    for _ in range(200):
        s = held[rng.randrange(len(held))]
        at = rng.randint(1, len(s))
        tree = c.propose_tree(s[max(0, at - 8):at], 8, per_ngram=4, max_nodes=64)
        roots = [sup for p, sup in zip(tree[1], tree[4]) if p == -1]
        assert sum(roots) <= c.segments * 3 * 4
        check_trie(tree)


def test_inputs_without_copies_and_of_every_kind():
    import array

    c = Corpus(100, seed=0)
    for s in ([1, 2, 3], (1, 2, 3), np.array([1, 2, 3]), np.array([1, 2, 3], dtype=np.int32),
              np.array([[1, 2, 3]])[0], array.array("q", [1, 2, 3]), np.arange(6)[::2] // 2 + 1,
              np.array([1, 2, 3], dtype=np.uint8)):
        c.add(s)
    assert c.sequences() == [[1, 2, 3]] * 8 or c.sequences()[-1] == [1, 2, 3]
    # a [1, L], strided or byte-swapped buffer is refused (it was once read
    # as its ids), and nothing is added
    held = c.sequences()
    for bad in (np.array([[1, 2, 3]]), np.arange(6)[::2], np.array([1, 2, 3], dtype=">i8")):
        with pytest.raises((TypeError, ValueError), match="tokens: expected a 1-D C-contiguous"):
            c.add(bad)
    assert c.sequences() == held
    ctx = np.array([9, 1, 2], dtype=np.int32)
    assert c.propose_tree(ctx, 2)[0] == [3]
    assert c.propose_tree((9, 1, 2), 2) == c.propose_tree([1, 2], 2)


@pytest.mark.torch
def test_torch_tensors():
    torch = pytest.importorskip("torch")
    c = Corpus(100, seed=0)
    c.add(torch.tensor([5, 6, 7, 8]))
    c.add(torch.tensor([[5, 6, 9]], dtype=torch.int32))
    assert c.sequences() == [[5, 6, 7, 8], [5, 6, 9]]
    assert c.propose_tree(torch.tensor([1, 5, 6]), 3)[0] == [9, 7, 8]
    ix = pld.NgramIndex(2, 1, "recent")
    ix.extend([5, 6, 7])
    assert ix.propose_tree_after(torch.tensor([5, 6]), 1)[0] == [7]
    with pytest.raises(ValueError, match="tokens"):
        c.add(torch.tensor([1, -1]))
    with pytest.raises(TypeError, match="tokens"):
        c.add(torch.tensor([1.0, 2.0]))


# ============================================================= bad input

BAD_CORPUS_ARGS = [
    (dict(max_tokens=0), ValueError, "max_tokens"),
    (dict(max_tokens=-5), ValueError, "max_tokens"),
    (dict(max_tokens=_core.CORPUS_MAX_TOKENS + 1), ValueError, "max_tokens"),
    (dict(max_tokens=True), TypeError, "max_tokens"),
    (dict(max_tokens=1.5), TypeError, "max_tokens"),
    (dict(max_tokens="10"), TypeError, "max_tokens"),
    (dict(max_tokens=None), TypeError, "max_tokens"),
    (dict(min_ngram_size=0), ValueError, "min_ngram_size"),
    (dict(min_ngram_size=False), TypeError, "min_ngram_size"),
    (dict(max_ngram_size=_core.MAX_NGRAM + 1), ValueError, "max_ngram_size"),
    (dict(min_ngram_size=3, max_ngram_size=2), ValueError, "min_ngram_size"),
    (dict(segments=0), ValueError, "segments"),
    (dict(segments=65), ValueError, "segments"),
    (dict(segments=2.0), TypeError, "segments"),
    (dict(fingerprint=5), TypeError, "fingerprint"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(seed=1 << 64), ValueError, "seed"),
]


@pytest.mark.parametrize("kw,exc,name", BAD_CORPUS_ARGS)
def test_bad_constructor_args(kw, exc, name):
    kw = {"max_tokens": 100, **kw}
    max_tokens = kw.pop("max_tokens")
    with pytest.raises(exc, match=name):
        Corpus(max_tokens, **kw)


@pytest.mark.parametrize("kw,exc,name", [
    (dict(max_tokens=0), ValueError, "max_tokens"),
    (dict(max_tokens=True), TypeError, "max_tokens"),
    (dict(min_ngram=0), ValueError, "min_ngram"),
    (dict(min_ngram=3, max_ngram=2), ValueError, "min_ngram"),
    (dict(segments=65), ValueError, "segments"),
    (dict(hash_seed="x"), TypeError, "hash_seed"),
])
def test_bad_core_constructor_args(kw, exc, name):
    kw = {"max_tokens": 100, **kw}
    with pytest.raises(exc, match=name):
        _core.Corpus(**kw)
    c = _core.Corpus(10)
    with pytest.raises(RuntimeError):
        c.__init__(10)
    with pytest.raises(ValueError, match="not initialised"):
        _core.Corpus.__new__(_core.Corpus).add([1])


class Weird:
    def __index__(self):
        raise KeyError("boom")


def _filled():
    c = Corpus(50, seed=0)
    c.add([1, 2, 3, 1, 2, 4])
    return c


BAD_CALLS = [
    ("add-negative", lambda c: c.add([1, -1, 2]), ValueError, "tokens"),
    ("add-negative-np", lambda c: c.add(np.array([3, -7])), ValueError, "tokens"),
    ("add-float", lambda c: c.add([1, 2.5]), TypeError, "tokens"),
    ("add-float-np", lambda c: c.add(np.array([1.0, 2.0])), TypeError, "tokens"),
    ("add-str", lambda c: c.add("abc"), TypeError, "tokens"),
    ("add-bytes", lambda c: c.add(b"abc"), TypeError, "tokens"),
    ("add-none", lambda c: c.add(None), TypeError, "tokens"),
    ("add-int", lambda c: c.add(5), TypeError, "tokens"),
    ("add-too-long", lambda c: c.add(list(range(51))), ValueError, "tokens"),
    ("add-batch", lambda c: c.add(np.zeros((2, 3), dtype=np.int64)), ValueError, "tokens"),
    ("add-huge-id", lambda c: c.add([1 << 64]), ValueError, "tokens"),
    ("add-uint64-huge", lambda c: c.add(np.array([1 << 63], dtype=np.uint64)), ValueError, "tokens"),
    ("propose-depth-0", lambda c: c.propose_tree([1, 2], 0), ValueError, "depth"),
    ("propose-depth-str", lambda c: c.propose_tree([1, 2], "3"), TypeError, "depth"),
    ("propose-depth-bool", lambda c: c.propose_tree([1, 2], True), TypeError, "depth"),
    ("propose-per-ngram-0", lambda c: c.propose_tree([1, 2], 3, per_ngram=0), ValueError, "per_ngram"),
    ("propose-per-ngram-17", lambda c: c.propose_tree([1, 2], 3, per_ngram=17), ValueError, "per_ngram"),
    ("propose-max-nodes", lambda c: c.propose_tree([1, 2], 3, max_nodes=-1), ValueError, "max_nodes"),
    ("propose-max-nodes-big", lambda c: c.propose_tree([1, 2], 3, max_nodes=4097), ValueError, "max_nodes"),
    ("propose-context-none", lambda c: c.propose_tree(None, 3), TypeError, "context"),
    ("propose-context-float", lambda c: c.propose_tree([1.5], 3), TypeError, "context"),
    ("propose-context-str", lambda c: c.propose_tree("ab", 3), TypeError, "context"),
    ("propose-eos-float", lambda c: c.propose_tree([1, 2], 3, eos_token_id=1.5), TypeError, "eos_token_id"),
    ("propose-index-raises", lambda c: c.propose_tree([1, Weird()], 3), KeyError, "boom"),  # not replaced
    ("core-propose-missing", lambda c: c._core.propose_tree([1, 2]), TypeError, "depth"),
    ("core-propose-kw", lambda c: c._core.propose_tree([1, 2], 3, bogus=1), TypeError, "bogus"),
    ("sequence-out-of-range", lambda c: c._core.sequence(1), IndexError, "out of range"),
    ("sequence-negative", lambda c: c._core.sequence(-1), ValueError, "i"),
    ("bind-bool", lambda c: c.bind(True, (1,)), TypeError, "vocab_size"),
    ("bind-zero", lambda c: c.bind(0, (0,)), ValueError, "vocab_size"),
    ("bind-sig-int", lambda c: c.bind(10, 10), TypeError, "signature"),
    ("bind-sig-item", lambda c: c.bind(10, (10, object())), TypeError, "signature"),
    ("bind-beyond-vocab", lambda c: c.bind(4, (4,)), ValueError, "token id 4"),
    ("fingerprint-type", lambda c: c.check_fingerprint(5), TypeError, "fingerprint"),
]


@pytest.mark.parametrize("case", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_name_the_argument(case):
    _, call, exc, name = case
    c = _filled()
    before = (c.sequences(), len(c), c.evicted)
    with pytest.raises(exc, match=name):
        call(c)
    assert (c.sequences(), len(c), c.evicted) == before  # nothing changed


def test_index_propose_tree_after_bad_args():
    ix = pld.NgramIndex(3, 1, "recent")
    ix.extend([1, 2, 3])
    for call, exc, name in [
        (lambda: ix.propose_tree_after([1, 2]), TypeError, "depth"),
        (lambda: ix.propose_tree_after(depth=2), TypeError, "context"),
        (lambda: ix.propose_tree_after([1], 0), ValueError, "depth"),
        (lambda: ix.propose_tree_after([1], 2, 0), ValueError, "per_ngram"),
        (lambda: ix.propose_tree_after([1], 2, 4, 5000), ValueError, "max_nodes"),
        (lambda: ix.propose_tree_after([1.0], 2), TypeError, "context"),
        (lambda: ix.propose_tree_after(None, 2), TypeError, "context"),
        (lambda: ix.propose_tree_after([1], 2, eos_token_id="x"), TypeError, "eos_token_id"),
        (lambda: ix.propose_tree_after([1], 2, 1, 1, None, 9), TypeError, "positional"),
    ]:
        with pytest.raises(exc, match=name):
            call()
    assert ix.propose_tree_after([], 3) == ([], [], [], [], [])
    assert ix.propose_tree_after([1, 2], 3, max_nodes=0) == ([], [], [], [], [])
    assert ix.propose_tree_after(context=[1, 2], depth=1) == ([3], [-1], [1], [2], [1])


def test_interrupts_pass_through():
    class Interrupting:
        def __index__(self):
            raise KeyboardInterrupt

    c = _filled()
    with pytest.raises(KeyboardInterrupt):
        c.add([1, Interrupting()])
    with pytest.raises(KeyboardInterrupt):
        c.propose_tree([1, Interrupting()], 2)
    with pytest.raises(KeyboardInterrupt):
        c.propose_tree([1, 2], Interrupting())


# =============================================================== binding

def test_bind_records_then_checks():
    c = Corpus(100)
    c.add([1, 2, 3])
    c.bind(10, (10, 1, 2, None))
    c.bind(10, [10, 1, 2, None])  # a list is the same signature
    assert c.signature == (10, 1, 2, None) and c.vocab_size == 10
    with pytest.raises(ValueError, match="another tokenizer"):
        c.bind(10, (10, 1, 3, None))
    with pytest.raises(ValueError, match="another tokenizer"):
        c.bind(12, (12, 1, 2, None))
    with pytest.raises(ValueError, match=r"tokens: token id 11 .*vocabulary of 10"):
        c.add([11])  # a bound corpus refuses what the model lacks
    c.bind(10, (10, 1, 2, None))
    assert c.sequences() == [[1, 2, 3]]
    fresh = Corpus(100)
    fresh.add([50])
    with pytest.raises(ValueError, match="token id 50"):
        fresh.bind(10, (10,))
    assert fresh.signature is None  # a refused first bind records nothing
    fresh.bind(51, (51, (1, 2), None))
    assert fresh.signature == (51, (1, 2), None)


def test_fingerprints():
    vocab = {"a": 0, "b": 1, "<s>": 2}
    fp = tokenizer_fingerprint(vocab)

    class Tok:
        def get_vocab(self):
            return dict(reversed(list(vocab.items())))

    assert tokenizer_fingerprint(Tok()) == fp and len(fp) == 64
    assert tokenizer_fingerprint({"a": 1, "b": 0, "<s>": 2}) != fp
    c = Corpus(10, fingerprint=fp)
    c.check_fingerprint(fp)
    with pytest.raises(ValueError, match="another tokenizer"):
        c.check_fingerprint(tokenizer_fingerprint({"a": 0}))
    d = Corpus(10)
    d.check_fingerprint(fp)  # a corpus without one takes it
    assert d.fingerprint == fp
    with pytest.raises(TypeError, match="tokenizer"):
        tokenizer_fingerprint(5)


# ============================================================= save/load

def _random_corpus(seed=0, big_ids=False, **kw):
    rng = random.Random(seed)
    c = Corpus(kw.pop("max_tokens", 400), segments=kw.pop("segments", 3), **kw)
    for _ in range(60):
        c.add([rng.randint(0, 7) + ((1 << 40) if big_ids and rng.random() < 0.1 else 0)
               for _ in range(rng.randint(0, 30))])
    return c


def _proposals(c, seed=1):
    rng = random.Random(seed)
    held = c.sequences()
    out = []
    for _ in range(100):
        s = held[rng.randrange(len(held))]
        at = rng.randint(1, len(s))
        out.append(c.propose_tree(s[max(0, at - 6):at], 6, per_ngram=3, max_nodes=40))
    return out


@pytest.mark.parametrize("big_ids", [False, True])
def test_save_load_round_trip(tmp_path, big_ids):
    c = _random_corpus(3, big_ids, fingerprint="f" * 64)
    if not big_ids:
        c.bind(8, (8, 0, (1, 2), None))
    path = tmp_path / "corpus.pld"
    c.save(path)
    header = json.loads(path.read_bytes()[16:16 + struct.unpack_from("<I", path.read_bytes(), 12)[0]])
    assert header["token_bytes"] == (8 if big_ids else 4)
    d = Corpus.load(path)
    assert d.sequences() == c.sequences() and len(d) == len(c) and d.max_id == c.max_id
    assert d.evicted == c.evicted > 0
    assert d._core.segments_used == c._core.segments_used
    assert (d.max_tokens, d.min_ngram_size, d.max_ngram_size, d.segments) == (
        c.max_tokens, c.min_ngram_size, c.max_ngram_size, c.segments)
    assert d.fingerprint == c.fingerprint and d.signature == c.signature
    assert _proposals(d) == _proposals(c)
    assert [p for p in os.listdir(tmp_path) if p != "corpus.pld"] == []  # no temporary left
    # overwritten in place, atomically; an empty corpus too
    Corpus(10).save(path)
    e = Corpus.load(str(path))
    assert len(e) == 0 and e.sequences() == [] and e.evicted == 0


def _saved(tmp_path, name="c.pld"):
    c = _random_corpus(4)
    c.bind(8, (8, 0, 1, None))
    path = tmp_path / name
    c.save(path)
    return path, path.read_bytes()


def _resigned(body: bytes) -> bytes:
    """A forged file: the body changed, its checksum recomputed."""
    return body + hashlib.sha256(body).digest()


def _forge_header(data: bytes, **changes) -> bytes:
    hlen = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[16:16 + hlen])
    header.update(changes)
    new = json.dumps(header).encode()
    return _resigned(data[:12] + struct.pack("<I", len(new)) + new + data[16 + hlen:-32])


CORRUPTIONS = [
    ("empty", lambda d: b"", "truncated"),
    ("prefix-only", lambda d: d[:20], "truncated|runs past"),
    ("truncated-half", lambda d: d[:len(d) // 2], "do not add up|runs past"),
    ("truncated-last-byte", lambda d: d[:-1], "do not add up"),
    ("extra-byte", lambda d: d + b"\0", "do not add up"),
    ("flip-header", lambda d: d[:20] + bytes([d[20] ^ 1]) + d[21:], "max_tokens"),
    ("flip-body", lambda d: d[:-40] + bytes([d[-40] ^ 0x10]) + d[-39:], "checksum"),
    ("flip-digest", lambda d: d[:-1] + bytes([d[-1] ^ 0xff]), "checksum"),
    ("wrong-magic", lambda d: b"NOTPLD!!" + d[8:], "magic"),
    ("wrong-version", lambda d: d[:8] + struct.pack("<I", 2) + d[12:], "version"),
    ("huge-header-length", lambda d: d[:12] + struct.pack("<I", 0xFFFFFFF0) + d[16:], "header length"),
    ("forged-huge-n-tokens", lambda d: _forge_header(d, n_tokens=10**9, max_tokens=10**9), "do not add up"),
    ("forged-huge-n-sequences", lambda d: _forge_header(d, n_sequences=2**40), "n_sequences"),
    ("forged-max-tokens", lambda d: _forge_header(d, max_tokens=2**62), "max_tokens"),
    ("forged-segments", lambda d: _forge_header(d, segments=1000), "segments"),
    ("forged-token-bytes", lambda d: _forge_header(d, token_bytes=5), "token_bytes"),
    ("forged-missing-field", lambda d: _forge_header(d, max_ngram=None), "max_ngram"),
    ("forged-bool-field", lambda d: _forge_header(d, min_ngram=True), "min_ngram"),
    ("forged-vocab", lambda d: _forge_header(d, vocab_size=3, signature=[3]), "vocabulary"),
    ("forged-segments-used", lambda d: _forge_header(d, segments_used=1), "segments"),
    ("forged-signature", lambda d: _forge_header(d, signature={"a": 1}), "signature"),
    ("forged-trust-not-object", lambda d: _forge_header(d, trust=[1, 2]), "trust"),
    ("forged-trust-no-bucket", lambda d: _forge_header(d, trust={"layout": [4, 3, 5, 4],
                                                                  "buckets": [[9, 0, 0, 0, 1, 2]]}), "trust bucket"),
    ("forged-trust-twice", lambda d: _forge_header(d, trust={"layout": [4, 3, 5, 4], "buckets": [
        [1, 0, 0, 3, 1, 2], [1, 0, 0, 3, 1, 2]]}), "twice"),
    ("forged-trust-hits", lambda d: _forge_header(d, trust={"layout": [4, 3, 5, 4],
                                                             "buckets": [[1, 0, 0, 3, 3, 2]]}), "hits"),
    ("forged-trust-window", lambda d: _forge_header(d, trust={"layout": [4, 3, 5, 4],
                                                               "buckets": [[1, 0, 0, 3, 1, 1e9]]}), "trials"),
    ("forged-trust-nan", lambda d: _forge_header(d, trust={"layout": [4, 3, 5, 4],
                                                            "buckets": [[1, 0, 0, 3, float("nan"), 2]]}), "hits"),
    ("forged-trust-short", lambda d: _forge_header(d, trust={"layout": [4, 3, 5, 4],
                                                              "buckets": [[1, 0, 3, 1, 2]]}), "trust bucket"),
    ("header-not-json", lambda d: _resigned(d[:16] + b"{" * (struct.unpack_from("<I", d, 12)[0])
                                             + d[16 + struct.unpack_from("<I", d, 12)[0]:-32]), "header"),
]


@pytest.mark.parametrize("case", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupt_files_are_refused(tmp_path, case):
    _, corrupt, what = case
    path, data = _saved(tmp_path)
    bad = tmp_path / "bad.pld"
    bad.write_bytes(corrupt(data))
    with pytest.raises(ValueError, match="bad.pld") as e:
        Corpus.load(bad)
    assert __import__("re").search(what, str(e.value)), str(e.value)


def _forge_body(data: bytes, lengths=None, tokens=None, n_tokens=None) -> bytes:
    """Replace the lengths and/or tokens of a saved (int32) file, header
    counts adjusted as given, the checksum recomputed."""
    hlen = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[16:16 + hlen])
    body = data[16 + hlen:-32]
    n_seq = header["n_sequences"]
    old_lengths = np.frombuffer(body[:4 * n_seq], dtype="<u4")
    old_tokens = np.frombuffer(body[4 * n_seq:], dtype="<i4")
    lengths = old_lengths if lengths is None else np.asarray(lengths, dtype="<u4")
    tokens = old_tokens if tokens is None else np.asarray(tokens, dtype="<i4")
    header["n_sequences"] = int(lengths.size)
    header["n_tokens"] = int(tokens.size) if n_tokens is None else n_tokens
    new = json.dumps(header).encode()
    return _resigned(data[:12] + struct.pack("<I", len(new)) + new + lengths.tobytes() + tokens.tobytes())


def test_forged_bodies_are_refused(tmp_path):
    path, data = _saved(tmp_path)
    good = Corpus.load(path)
    toks = np.array([t for s in good.sequences() for t in s])
    lens = [len(s) for s in good.sequences()]
    cases = [
        (_forge_body(data, tokens=np.where(np.arange(toks.size) == 3, -5, toks)), "negative"),
        (_forge_body(data, lengths=[0] + lens), "length"),
        (_forge_body(data, lengths=[2**31] + lens[1:]), "length"),
        (_forge_body(data, lengths=lens[:-1] + [lens[-1] + 5]), "add up"),
        (_forge_body(data, lengths=[10**9], n_tokens=toks.size), "length|add up"),
    ]
    for i, (blob, what) in enumerate(cases):
        bad = tmp_path / f"forged{i}.pld"
        bad.write_bytes(blob)
        with pytest.raises(ValueError, match=f"forged{i}") as e:
            Corpus.load(bad)
        assert __import__("re").search(what, str(e.value)), (i, str(e.value))


def test_learned_trust_is_saved_and_loaded(tmp_path):
    from pld.acceptance_buckets import LAYOUT

    c = _random_corpus(4)
    c.learn({(1, 0, 0, 3): 3.0, (3, 2, 4, 0): 0.0}, {(1, 0, 0, 3): 7.0, (3, 2, 4, 0): 2.5})
    c.learn({(1, 0, 0, 3): 900.0}, {(1, 0, 0, 3): 1200.0})  # past the window: scaled
    c.save(tmp_path / "c.pld")
    d = Corpus.load(tmp_path / "c.pld")
    assert d.acceptance() == c.acceptance() and len(c.acceptance()[1]) == 2
    # a file from a pld whose buckets are laid out otherwise loads without its trust
    data = (tmp_path / "c.pld").read_bytes()
    other = _forge_header(data, trust={"layout": [*LAYOUT[:3], LAYOUT[3] + 1],
                                       "buckets": [[1, 0, 0, 3, 1.0, 2.0]]})
    (tmp_path / "other.pld").write_bytes(other)
    with pytest.warns(RuntimeWarning, match="another bucket layout"):
        e = Corpus.load(tmp_path / "other.pld")
    assert e.acceptance() == ({}, {}) and e.sequences() == c.sequences()
    # a file written before trust was saved has none
    (tmp_path / "old.pld").write_bytes(_forge_header(data, trust=None))
    assert Corpus.load(tmp_path / "old.pld").acceptance() == ({}, {})


def test_load_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        Corpus.load(tmp_path / "missing.pld")
    assert MAGIC.startswith(b"PLDCORP")


# =============================================================== threads

_CHILD = r"""
import os, random, sys, threading, tempfile
sys.path.insert(0, {tests!r})
import pld
from pld.corpus import Corpus

def check_trie(lists):
    tokens, parents, depths, ngrams, supports = lists
    for v, (p, d, s) in enumerate(zip(parents, depths, supports)):
        assert -1 <= p < v and s >= 1 and d == (1 if p < 0 else depths[p] + 1)

def seqs_of(t, n):
    rng = random.Random(t)
    return [[rng.randint(0, 20) for _ in range(rng.randint(1, 40))] for _ in range(n)]

# 1. no eviction: the corpus ends holding every thread's sequences
c = Corpus(10**6, segments=8)
errors = []
def worker(t):
    try:
        mine = seqs_of(t, 800)
        rng = random.Random(100 + t)
        for i, s in enumerate(mine):
            c.add(s)
            ctx = mine[rng.randrange(i + 1)]
            tree = c.propose_tree(ctx[-4:], 6, per_ngram=3, max_nodes=32)
            check_trie(tree)
            if len(ctx) >= 3 and ctx[-3] >= 0:
                # the continuation of ctx's own end is the separator: a trie
                # from it may be empty, never malformed; and len() is sane
                assert len(c) <= 10**6
    except BaseException as e:
        errors.append(e)
threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
for th in threads: th.start()
for th in threads: th.join()
assert not errors, errors
want = sorted(s for t in range(6) for s in seqs_of(t, 800))
assert sorted(c.sequences()) == want, "the corpus lost or changed a sequence"
assert c.num_sequences == len(want) and c.evicted == 0

# 2. with eviction, clear, save and bind racing: invariants only
c = Corpus(2000, segments=4)
tmp = tempfile.mkdtemp()
def adder(t):
    try:
        for s in seqs_of(t, 400):
            c.add(s)
            assert len(c) <= 2000
    except BaseException as e:
        errors.append(e)
def reader(t):
    try:
        rng = random.Random(t)
        for i in range(400):
            held = c.sequences()
            assert sum(map(len, held)) <= 2000
            if held:
                s = held[rng.randrange(len(held))]
                check_trie(c.propose_tree(s[-5:], 5))
            if i % 50 == 0:
                path = os.path.join(tmp, "c%d.pld" % t)
                c.save(path)
                d = Corpus.load(path)
                assert len(d) <= 2000
            if i % 97 == 0:
                c.clear()
            c.bind(21, (21, None))
            _ = (c.nbytes, c.max_id, c.num_sequences, c.evicted, repr(c))
    except BaseException as e:
        errors.append(e)
threads = ([threading.Thread(target=adder, args=(t,)) for t in range(3)]
           + [threading.Thread(target=reader, args=(t,)) for t in range(3)])
for th in threads: th.start()
for th in threads: th.join()
assert not errors, errors
assert len(c) <= 2000 and c.num_sequences <= 3 * 400
print("OK")
"""


def test_threads_share_one_corpus():
    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD.format(tests=tests))],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), (
        f"child exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}")


_HOSTILE = r"""
import pld, threading
from pld.corpus import Corpus

# an id whose __index__ empties the list being added: the snapshot keeps it
c = Corpus(100)
class Clearer:
    def __init__(self, target): self.target = target
    def __index__(self):
        self.target.clear()
        return 3
lst = [1, 2]
lst.append(Clearer(lst))
lst.extend([4, 5] * 50)
try:
    c.add(lst)
except ValueError:
    pass  # longer than max_tokens: refused, whatever __index__ did
lst = [1, 2]
lst.append(Clearer(lst))
c.add(lst)
assert c.sequences() == [[1, 2, 3]], c.sequences()

# __index__ that uses the corpus from inside a conversion (the lock is not
# held while Python runs, so this cannot deadlock)
class Reentrant:
    def __index__(self):
        c.add([7, 7])
        c.propose_tree([7], 2)
        return 8
c.add([Reentrant(), 9])
assert c.sequences()[-1] == [8, 9] and [7, 7] in c.sequences()
tree = c.propose_tree([1, Reentrant()], 2)
# __index__ of a depth argument that clears the corpus meanwhile
class Clears:
    def __index__(self):
        c.clear()
        return 2
assert c.propose_tree([1, 2], Clears()) == ([], [], [], [], [])
print("OK")
"""


def test_hostile_conversions():
    proc = subprocess.run([sys.executable, "-c", _HOSTILE], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), (
        f"child exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}")


# ============================================================= benchmark

def test_corpus_stream_is_fixed_and_text_like():
    from pld.bench.lookup import corpus_stream

    a, b = corpus_stream(20_000, seed=3), corpus_stream(20_000, seed=3)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert sum(x.size for x in a) == 20_000 and all(1 <= x.size < 1024 for x in a)
    flat = np.concatenate(a)
    assert flat.min() >= 0 and flat.max() < 49152
    # repeated phrases: many 4-grams recur
    grams = {tuple(flat[i:i + 4]) for i in range(flat.size - 3)}
    assert len(grams) < 0.9 * (flat.size - 3)


def test_corpus_bench_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pld.bench", "lookup", "--corpus", "--corpus-sizes",
                           "1000,5000", "--corpus-calls", "50", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "corpus.md").read_text()
    assert "| 1,000 |" in table and "| 5,000 |" in table
    rows = json.loads((tmp_path / "corpus.json").read_text())["rows"]
    assert [r["size"] for r in rows] == [1000, 5000]
    assert all(r["us_median"] > 0 and r["bytes_per_token"] > 0 for r in rows)
    # a call's time over its nodes, call by call, is at most its time: so is the median
    assert all(0 < r["us_per_node_median"] <= r["us_median"] for r in rows)
    assert "us per node" in table and "no match (us)" in table
    assert all(r["us_no_match_median"] > 0 for r in rows)
    bad = subprocess.run([sys.executable, "-m", "pld.bench", "lookup", "--corpus", "--corpus-sizes", "5",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--corpus-sizes" in bad.stderr


def test_save_load_without_numpy(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["numpy"] = None  # pld needs no numpy: save/load use array and struct
        from pld.corpus import Corpus
        c = Corpus(100, segments=2)
        for s in ([1, 2, 3], [4, 5], [6] * 30, [7] * 60, [8] * 20, [6, 6, 9], [2**40, 1]):
            c.add(s)
        c.save({str(tmp_path / 'c.pld')!r})
        d = Corpus.load({str(tmp_path / 'c.pld')!r})
        assert d.sequences() == c.sequences() and d.evicted == c.evicted > 0
        assert d.propose_tree([6, 6], 3) == c.propose_tree([6, 6], 3)
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
