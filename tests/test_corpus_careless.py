"""pld.Corpus under careless and hostile use: no output lost, no unchecked
id, no unbounded read, no exception but the documented ones, the file mode
a user expects, no caller code under the corpus's lock.

The tests that generate need torch (marked); the rest run under the
sanitizers too.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import struct
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pld
from pld import corpus as corpus_module
from pld.corpus import MAGIC, VERSION, Corpus

WAIT = 30  # seconds a call may take before it counts as hung


def _finishes(fn, *args):
    """Run fn(*args) in a thread; (finished within WAIT, its error or None)."""
    box = []

    def run():
        try:
            fn(*args)
            box.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            box.append(error)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(WAIT)
    return (not t.is_alive()), (box[0] if box else None)


def _file(tmp_path, header_patch=None, raw_header=None, tokens=(1, 2, 3)):
    """A saved corpus file, its header changed (and its checksum made
    valid again): a forged file."""
    c = Corpus(100)
    c.add(list(tokens))
    path = tmp_path / "c.pldc"
    c.save(path)
    data = path.read_bytes()
    _, _, hlen = struct.unpack_from("<8sII", data, 0)
    header = json.loads(data[16:16 + hlen])
    if header_patch:
        header.update(header_patch)
    head = raw_header if raw_header is not None else json.dumps(header).encode()
    body = struct.pack("<8sII", MAGIC, VERSION, len(head)) + head + data[16 + hlen:-32]
    path.write_bytes(body + hashlib.sha256(body).digest())
    return path


# -------------------------------------------------------------- vocabulary

def test_a_bound_corpus_refuses_ids_beyond_its_vocabulary():
    c = Corpus(100)
    c.add([5, 6])
    c.bind(100, (100, 1, 2, None))
    c.add([99, 0])  # the last id of the vocabulary is one
    with pytest.raises(ValueError, match=r"tokens: token id 100 \(at position 1\) is beyond the vocabulary of 100"):
        c.add([7, 100, 8])
    with pytest.raises(ValueError, match="tokens: token id 150"):
        c.add([150])
    assert c.sequences() == [[5, 6], [99, 0]]  # nothing of a refused add


def test_a_saved_bound_corpus_loads_and_stays_bound(tmp_path):
    c = Corpus(100)
    c.bind(50, (50, None))
    c.add([1, 49])
    c.save(tmp_path / "c")
    loaded = Corpus.load(tmp_path / "c")
    assert loaded.sequences() == [[1, 49]] and loaded.vocab_size == 50
    with pytest.raises(ValueError, match="tokens: token id 50"):
        loaded.add([50])


def test_binding_refuses_a_corpus_that_holds_a_larger_id():
    c = Corpus(100)
    c.add([3, 60])
    with pytest.raises(ValueError, match="holds token id 60, beyond the model's vocabulary of 60"):
        c.bind(60, (60,))
    c.bind(61, (61,))
    with pytest.raises(ValueError, match="token id 61"):
        c.add([61])


# ------------------------------------------------------------- the file

def test_a_device_or_a_pipe_is_refused_before_it_is_read(tmp_path):
    done, error = _finishes(Corpus.load, "/dev/zero")
    assert done and isinstance(error, ValueError) and "not a regular file" in str(error)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done, error = _finishes(Corpus.load, fifo)  # (opening a pipe for reading blocks without a writer)
    assert done and isinstance(error, ValueError) and "not a regular file" in str(error)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        done, error = _finishes(Corpus.load, tmp_path)  # a folder opens; it is refused as the others
        assert done and isinstance(error, ValueError) and "not a regular file" in str(error)
        assert str(tmp_path) in str(error)
    assert len(os.listdir("/proc/self/fd")) == fds  # (no descriptor left open)


def test_a_large_file_of_another_kind_is_refused_from_its_first_bytes(tmp_path):
    """Wrong magic or version is found before the rest is read: a 256 MiB
    file of another kind allocates nothing of its size."""
    import tracemalloc

    for start in (b"NOTPLDC\0" + bytes(8), MAGIC + struct.pack("<II", VERSION + 1, 0)):
        path = tmp_path / "big"
        with open(path, "wb") as f:
            f.write(start)
            f.truncate(256 << 20)  # (sparse: no disk)
        tracemalloc.start()
        try:
            with pytest.raises(ValueError, match="wrong magic|unsupported version"):
                Corpus.load(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20


def test_a_file_larger_than_the_format_allows_is_refused_unread(tmp_path, monkeypatch):
    path = _file(tmp_path)
    size = path.stat().st_size
    monkeypatch.setattr(corpus_module, "_MAX_FILE", size - 1)
    with pytest.raises(ValueError, match="more than any corpus file can hold"):
        Corpus.load(path)
    monkeypatch.setattr(corpus_module, "_MAX_FILE", size)
    assert Corpus.load(path).sequences() == [[1, 2, 3]]


def test_huge_numbers_and_deep_nesting_in_a_header_are_value_errors(tmp_path):
    bucket = [1, 1, 1, 1]
    cases = {
        "trust count": {"trust": {"layout": [4, 3, 5, 4], "buckets": [bucket + [1, 10 ** 400]]}},
        "float count": {"trust": {"layout": [4, 3, 5, 4], "buckets": [bucket + [1, 1e308 * 10]]}},
        "huge setting": {"max_tokens": 10 ** 400},
        "huge vocab": {"vocab_size": 10 ** 400, "signature": [1]},
        "deep signature": {"vocab_size": 10, "signature": json.loads("[" * 30 + "]" * 30)},
    }
    for name, patch in cases.items():
        path = _file(tmp_path, patch)
        with pytest.raises(ValueError, match="corpus file"):
            Corpus.load(path)
    for depth in (17, 5000, 100000):
        path = _file(tmp_path, raw_header=("[" * depth + "]" * depth).encode())
        with pytest.raises(ValueError, match="nests deeper than 16"):
            Corpus.load(path)


def test_a_header_of_one_unterminated_string_is_refused_at_once(tmp_path):
    """An unterminated string of escaped quotes (the worst case of a
    backtracking scan: hours at 1 MiB) is read once, and refused as JSON."""
    path = _file(tmp_path, raw_header=('"' + '\\"' * ((1 << 20) // 2 - 1)).encode())
    # (in a process of its own: a scan that holds the GIL would hold this one's threads too)
    script = ("import sys, pld\ntry:\n    pld.Corpus.load(sys.argv[1])\nexcept ValueError as e:\n"
              "    print(e)\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                          timeout=WAIT, check=True)
    assert "unreadable header" in done.stdout


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    path = _file(tmp_path, {"fingerprint": "[" * 40 + '"{' * 5})
    assert Corpus.load(path).fingerprint == "[" * 40 + '"{' * 5
    assert corpus_module._json_depth('{"a": [1, "[[[", {"b": "\\"["}]}') == 3
    assert corpus_module._json_depth('[["x\\\\"], ["\\\\\\"]"]]') == 2  # (escaped backslashes)
    assert corpus_module._json_depth('[[ "unterminated [[[') == 2


def test_learn_refuses_counts_no_float_holds():
    c = Corpus(10)
    for bad in (10 ** 400, -10 ** 400, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="is not a finite number"):
            c.learn({}, {(1, 1, 1, 1): bad})
        with pytest.raises(ValueError, match="is not a finite number"):
            c.learn({(1, 1, 1, 1): bad}, {(1, 1, 1, 1): 5})
    assert c.acceptance() == ({}, {})


@pytest.mark.skipif(not hasattr(os, "umask"), reason="POSIX file modes")
def test_save_keeps_the_mode_a_user_expects(tmp_path):
    c = Corpus(10)
    c.add([1, 2])
    old = os.umask(0o022)
    try:
        c.save(tmp_path / "new")
        assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o644
        os.chmod(tmp_path / "new", 0o640)
        c.save(tmp_path / "new")  # replaced: its mode stays
        assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o640
        os.umask(0o077)
        c.save(tmp_path / "private")
        assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600
    finally:
        os.umask(old)
    assert Corpus.load(tmp_path / "new").sequences() == [[1, 2]]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_a_large_file_with_a_small_header_is_refused_before_its_body_is_read(tmp_path):
    """A file far larger than its header says (a sparse 256 MiB one) is
    refused from its size, not read into memory first."""
    import tracemalloc

    path = _file(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(256 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"c\.pldc.*sizes do not add up"):
            Corpus.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_a_file_that_cannot_be_read_is_a_value_error_naming_it(tmp_path, monkeypatch):
    """A read that fails (EIO: a bad disk, a file system gone) names the file."""
    import errno
    import io

    path = _file(tmp_path)

    class Failing(io.BufferedReader):
        def read(self, n=-1):
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(corpus_module.os, "fdopen", lambda fd, mode: Failing(io.FileIO(fd, "r")))
    with pytest.raises(ValueError, match=r"c\.pldc.*cannot be read \(Input/output error\)"):
        Corpus.load(path)


@pytest.mark.parametrize("method", ["save", "load"])
def test_a_path_with_a_nul_is_a_value_error_naming_path(tmp_path, method):
    c = Corpus(10)
    call = c.save if method == "save" else Corpus.load
    for bad in (str(tmp_path / "a\0b"), os.fsencode(tmp_path / "a\0b")):
        with pytest.raises(ValueError, match="path: expected a file path"):
            call(bad)
    with pytest.raises(TypeError, match="path: expected a str, bytes or os.PathLike"):
        call(3)


def test_a_bytes_path_saves_and_loads(tmp_path):
    c = Corpus(10)
    c.add([1, 2, 3])
    c.save(os.fsencode(tmp_path / "c"))
    assert Corpus.load(os.fsencode(tmp_path / "c")).sequences() == [[1, 2, 3]]


def test_a_save_through_a_link_writes_the_file_it_names(tmp_path):
    old, new = Corpus(10), Corpus(10)
    old.add([1, 2])
    new.add([3, 4])
    old.save(tmp_path / "real")
    os.symlink("real", tmp_path / "link")
    new.save(tmp_path / "link")
    assert os.path.islink(tmp_path / "link")
    assert Corpus.load(tmp_path / "real").sequences() == [[3, 4]]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_a_file_name_near_the_file_systems_limit_saves(tmp_path):
    c = Corpus(10)
    c.add([1, 2])
    name = "c" * (os.pathconf(tmp_path, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255)
    c.save(tmp_path / name)
    assert Corpus.load(tmp_path / name).sequences() == [[1, 2]]


def test_the_evicted_count_stops_at_what_a_file_holds(tmp_path):
    """A file whose count is at the uint64 limit loads, evicts more and
    saves a file that loads again (the count stays at the limit)."""
    path = _file(tmp_path, {"evicted": 2 ** 64 - 1, "max_tokens": 4, "segments": 2})
    c = Corpus.load(path)
    for i in range(5):
        c.add([i, i])  # (each add past 4 tokens evicts the older segment)
    assert c.evicted == 2 ** 64 - 1
    c.save(path)
    assert Corpus.load(path).evicted == 2 ** 64 - 1


def test_a_bound_corpus_refuses_another_vocabulary_size_even_with_its_signature():
    c = Corpus(10)
    c.bind(10, ("sig",))
    with pytest.raises(ValueError, match="bound to a vocabulary of 10 ids, used with 50"):
        c.bind(50, ("sig",))
    c.bind(10, ("sig",))


# ------------------------------------------------------------ the locks

def test_caller_code_in_learns_counts_runs_before_the_lock():
    c = Corpus(10)

    class Count(float):
        def __float__(self):
            c.acceptance()  # takes the corpus's lock
            return float.__float__(self)

    done, error = _finishes(c.learn, {(1, 1, 1, 1): Count(2.0)}, {(1, 1, 1, 1): Count(4.0)})
    assert done and error is None
    assert c.acceptance() == ({(1, 1, 1, 1): 2.0}, {(1, 1, 1, 1): 4.0})


def test_caller_code_in_a_signature_or_fingerprint_runs_before_the_lock():
    c = Corpus(10)

    class Name(str):
        def __eq__(self, other):
            c.acceptance()
            return str.__eq__(self, other)

        def __ne__(self, other):
            c.acceptance()
            return str.__ne__(self, other)

        __hash__ = str.__hash__

    for call in (lambda: c.bind(10, (10, Name("llama"))), lambda: c.bind(10, (10, Name("llama"))),
                 lambda: c.check_fingerprint(Name("abc")), lambda: c.check_fingerprint(Name("abc"))):
        done, error = _finishes(call)
        assert done and error is None
    assert type(c.signature[1]) is str and type(c.fingerprint) is str
    done, error = _finishes(lambda: c.bind(10, (10, Name("other"))))
    assert done and isinstance(error, ValueError) and "another tokenizer" in str(error)
    fp = Corpus(10, fingerprint=Name("xyz"))
    assert type(fp.fingerprint) is str
    done, error = _finishes(fp.check_fingerprint, Name("xyz"))
    assert done and error is None


# ------------------------------------------------------- generations

@pytest.mark.torch
def test_an_output_longer_than_the_corpus_is_kept_and_its_tail_added(caplog):
    import torch

    from models_fixtures import greedy, tiny_model

    model = tiny_model()
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
    want = greedy(model, ids, 20)
    c = Corpus(8)
    caplog.set_level(logging.WARNING, logger="pld")
    got = pld.generate(model, ids, max_new_tokens=20, eos_token_id=None, corpus=c)
    assert got.new_tokens == want
    assert c.sequences() == [want[-8:]]
    assert any("keeps the last 8 of an output's 20 tokens" in r.getMessage() for r in caplog.records)
    c2 = Corpus(8)
    with pld.enabled(corpus=c2):
        out = model.generate(ids, prompt_lookup_num_tokens=10, max_new_tokens=20, do_sample=False)
    assert out[0, ids.shape[1]:].tolist() == want
    assert c2.sequences() == [want[-8:]]


@pytest.mark.torch
@pytest.mark.parametrize("tree", [False, True])
def test_no_draft_token_beyond_the_vocabulary_reaches_the_model(tree):
    """A draft source that proposes ids the model lacks (a corpus whose
    lookup is tampered with here) loses those nodes, not the generation."""
    import torch

    from models_fixtures import greedy, tiny_model

    model = tiny_model()
    V = model.config.vocab_size
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])  # no repeat: the row drafts nothing of its own
    want = greedy(model, ids, 16)
    c = Corpus(100)
    c.add([1, 2])
    proposed = []

    def hostile(context, depth, **kw):
        proposed.append(depth)
        return [V, want[0], V + 7, 0], [-1, -1, 1, 1], [1, 1, 2, 2], [2, 2, 2, 2], [1, 1, 1, 1]

    c.propose_tree = hostile
    got = pld.generate(model, ids, max_new_tokens=16, eos_token_id=None, corpus=c, draft_tree=tree,
                       cost_aware=False)
    assert proposed and got.new_tokens == want


@pytest.mark.torch
def test_within_vocabulary_drops_out_of_range_nodes_and_their_subtrees():
    from pld.token_tree import TokenTree, within_vocabulary

    tree = TokenTree([5, 99, 6, 7, 8], [-1, -1, 1, 0, 3], [1, 1, 2, 2, 3], [2, 3, 3, 2, 2], [1, 2, 2, 1, 1])
    tree.origins = [0, 2, 2, 0, 0]
    out = within_vocabulary(tree, 10)
    assert (out.tokens, out.parents, out.depths, out.origins) == ([5, 7, 8], [-1, 0, 1], [1, 2, 3], [0, 0, 0])
    assert within_vocabulary(tree, 100) is tree and within_vocabulary(tree, None) is tree
    assert within_vocabulary(TokenTree([-1], [-1], [1], [1], [1]), 10).tokens == []


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-10 ** 500, max_value=10 ** 500)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
_FIELDS = ("max_tokens", "min_ngram", "max_ngram", "segments", "n_sequences", "n_tokens", "token_bytes",
           "segments_used", "evicted", "vocab_size", "signature", "fingerprint", "trust")


@settings(max_examples=max(50, settings().max_examples // 2), deadline=None)
@given(patch=st.dictionaries(st.sampled_from(_FIELDS), _JSON, min_size=1, max_size=3))
def test_a_forged_header_with_a_valid_checksum_loads_or_is_a_value_error(tmp_path_factory, patch):
    """The loader's fuzz test: any JSON in any header field, the checksum
    made valid, gives a corpus or a ValueError naming the file, never
    another exception."""
    path = _file(tmp_path_factory.mktemp("forged"), patch)
    try:
        loaded = Corpus.load(path)
    except ValueError as error:
        assert "corpus file" in str(error)
    else:
        assert all(0 <= t for s in loaded.sequences() for t in s)


def test_bind_vocab_refuses_bad_arguments_and_converts_them_before_its_lock():
    c = Corpus(10)
    c.add([3, 4])
    core = c._core
    with pytest.raises(TypeError, match="2 arguments"):
        core._bind_vocab(5)
    with pytest.raises(TypeError, match="vocab_size"):
        core._bind_vocab("5", True)
    with pytest.raises(TypeError, match="vocab_size"):
        core._bind_vocab(5.0, True)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="vocab_size"):
            core._bind_vocab(bad, True)

    class Size:  # caller code while converting: it touches the corpus
        def __index__(self):
            core.add([1])
            return 50

    class Flag:
        def __bool__(self):
            core.add([2])
            return True

    done, error = _finishes(core._bind_vocab, Size(), Flag())
    assert done and error is None
    with pytest.raises(ValueError, match="token id 50"):
        c.add([50])  # the bound that call set
    assert core._bind_vocab(4, False) == 4  # the largest id held (4) is not below 4


# ---------------------------------------------------------- odd arguments

def test_a_saved_file_counts_the_evictions_of_the_sequences_it_holds(tmp_path):
    """The evicted count and the sequences a file holds come from one
    snapshot, whatever another thread adds meanwhile. Sequence i is
    [i] * 50, so in a consistent file the oldest held is number evicted."""
    c = Corpus(400, segments=4)
    path = tmp_path / "c.pldc"
    stop = threading.Event()

    def add():
        i = 0
        while not stop.is_set():
            c.add([i] * 50)  # (an eviction every other add)
            i += 1

    adder = threading.Thread(target=add, daemon=True)
    adder.start()
    try:
        wrong = []
        for _ in range(300):
            c.save(path)
            loaded = Corpus.load(path)
            if loaded.num_sequences and loaded.evicted != loaded.sequences()[0][0]:
                wrong.append((loaded.evicted, loaded.sequences()[0][0]))
    finally:
        stop.set()
        adder.join(WAIT)
    assert wrong == []


def test_a_tensor_on_the_meta_device_is_a_value_error_naming_it():
    torch = pytest.importorskip("torch")
    c = Corpus(100)
    meta = torch.empty(4, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match="tokens: a tensor on the meta device"):
        c.add(meta)
    with pytest.raises(ValueError, match="context: a tensor on the meta device"):
        c.propose_tree(meta, 3)
    assert c.offer(meta) is False and len(c) == 0  # (an optional corpus: a warning, not an error)


def test_a_signature_that_holds_itself_or_nests_too_deep_is_a_type_error():
    c = Corpus(100)
    holds_itself = []
    holds_itself.append(holds_itself)
    deep = (1,)
    for _ in range(5000):
        deep = (deep,)
    for signature in (holds_itself, deep):
        with pytest.raises(TypeError, match="signature: nests deeper than 15 levels"):
            c.bind(10, signature)
    ok = (1,)
    for _ in range(14):
        ok = (ok,)
    c.bind(10, ok)  # 15 levels: what a file's header keeps
    assert c.vocab_size == 10
