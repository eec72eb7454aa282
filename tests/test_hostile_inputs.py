"""Hostile and careless inputs to the C binding: no crash, no use-after-free,
no swallowed error, no wrong answer.

One section per class of fault:

1. caller memory read while Python code runs (``__index__``, ``__float__``,
   iteration, ``__dlpack__`` that mutate or free what the binding reads);
2. DLPack capsules with garbage fields (built with ctypes);
3. misaligned buffers (UBSan reports a misaligned load), and the buffers
   refused (byte-swapped, strided, multi-dimensional: np.matrix);
4. errors swallowed (KeyboardInterrupt, MemoryError must pass through);
5. inputs at the Python edge (NumPy and 0-d integers);
6. randomness (seed range, the default generator after ``os.fork()``);
7. hash flooding (the index's hash is keyed per index);
plus threads sharing one index.

Every case that could crash the interpreter runs in a child process, so a
crash is a failed test, not a dead suite. The module runs under the normal
build and, in CI, under the ASan/UBSan build (the children inherit the
sanitizer runtime through LD_PRELOAD).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pld
from pld import _core
from pld.bench.flood import crafted_ids

_PRELUDE = """
import ctypes, gc, os, sys, threading
import numpy as np
import pld
from pld import _core

def expect(exc_types, fn, *names):
    '''fn() raises one of exc_types whose message names every one of names.'''
    try:
        fn()
    except exc_types as e:
        for name in names:
            assert name in str(e), (name, repr(e))
        return e
    raise AssertionError("no exception from %r" % (fn,))
"""


def run_child(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` (after _PRELUDE) in a fresh interpreter; it prints OK last."""
    src = _PRELUDE + textwrap.dedent(code) + "\nprint('OK')\n"
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def assert_child_ok(code: str, timeout: float = 120) -> str:
    proc = run_child(code, timeout)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), (
        f"child exited with {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc.stdout


# ===================================================== 1. Python code mid-read

SHRINKING_LIST = """
class Clearer:
    '''An id whose __index__ empties (or grows) the list that holds it.'''
    def __init__(self, target, grow=False):
        self.target, self.grow = target, grow
    def __index__(self):
        if self.grow:
            self.target.extend([7] * 100000)
        else:
            self.target.clear()
            gc.collect()
        return 3

def evil_list(grow=False, n=64):
    lst = [None] + [int(i % 5) for i in range(n)] * 4
    lst[0] = Clearer(lst, grow)
    return lst
"""


@pytest.mark.parametrize("grow", [False, True], ids=["shrink", "grow"])
@pytest.mark.parametrize("call", [
    "pld.find_candidate_pred_tokens(evil_list(grow), 2, 3)",
    "pld.NgramIndex(3).extend(evil_list(grow))",
    "pld.accept_greedy(evil_list(grow, 2), [1] * 2000)",
    "pld.accept_greedy([1, 2], evil_list(grow))",
    "pld.accept_greedy([1] * 65, [1] * 66, [-1] + evil_list(grow, 16))",
    "pld.accept_sample(evil_list(grow, 2), np.full((2000, 4), 0.25, dtype=np.float32), [0.5] * 2000)",
    "_core._ngram_tag(evil_list(grow, 1)[:3])",
    "pld.find_candidate_pred_tokens([1, 2, 3, 1, 2], 2, 2, semantics='transformers',"
    " eos_token_id=evil_list(grow))",
    "_core.Corpus(10**6).add(evil_list(grow))",
    "pld.Corpus(10**6).add(evil_list(grow))",
    "_core.Corpus(10**6).propose_tree(evil_list(grow), 3)",
    "_core.Corpus(10**6).propose_tree([1, 2], 3, eos_token_id=evil_list(grow))",
    "pld.NgramIndex(3, 1, 'recent').propose_tree_after(evil_list(grow), 3)",
])
def test_list_mutated_by_index_during_conversion(call, grow):
    # the binding reads a snapshot of the list: an answer from the ids it
    # held when called, or a clean error -- never freed memory
    assert_child_ok(SHRINKING_LIST + f"""
grow = {grow}
try:
    {call}
except (TypeError, ValueError):
    pass
""")


def test_list_mutated_during_conversion_answers_from_the_snapshot():
    assert_child_ok(SHRINKING_LIST + """
ids = evil_list()
snapshot = [3] + ids[1:]
ix = pld.NgramIndex(3)
ix.extend(ids)
assert ix.tokens() == snapshot, ix.tokens()
""")


def test_propose_tree_arguments_that_change_the_index():
    # every argument of propose_tree can run Python code (__index__, an eos
    # list's items) that truncates, grows or refills the index it reads: the
    # answer is the index as it is after the conversions, never a stale read
    assert_child_ok(f"""
import random
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from reference import propose_tree_reference
rng = random.Random(5)
class Hit:
    def __init__(self, ix, action, value): self.ix, self.action, self.value = ix, action, value
    def __index__(self):
        a = self.action
        if a == "empty": self.ix.truncate(0)
        elif a == "shrink": self.ix.truncate(len(self.ix) // 2)
        elif a == "grow": self.ix.extend([rng.randrange(4) for _ in range(5000)])
        gc.collect()
        return self.value
for trial in range(60):
    ix = pld.NgramIndex(3, 1, "recent", seed=trial)
    ix.extend([rng.randrange(4) for _ in range(rng.randint(1, 300))])
    action = rng.choice(["empty", "shrink", "grow"])
    where = rng.choice(["depth", "per_ngram", "max_nodes", "eos"])
    depth, per, nodes, eos = 5, 4, 64, None
    if where == "depth": depth = Hit(ix, action, 5)
    elif where == "per_ngram": per = Hit(ix, action, 4)
    elif where == "max_nodes": nodes = Hit(ix, action, 64)
    else: eos = [Hit(ix, action, 3)]
    try:
        got = ix.propose_tree(depth, per_ngram=per, max_nodes=nodes, eos_token_id=eos)
    except ValueError as e:
        assert "index" in str(e) or "empty" in str(e), e
        continue
    want = propose_tree_reference(ix.tokens(), 3, 1, "recent", 5, 4, 64, [3] if eos else [])
    assert tuple(map(list, got)) == tuple(map(list, want)), (trial, action, where)
""")


def test_corpus_arguments_that_change_the_corpus():
    # an argument's __index__ (or an eos list's item) may add to, clear or
    # evict from the very corpus being asked: the conversions run before the
    # corpus's lock is taken (so no deadlock), and the answer is the corpus
    # as it is after them, equal to the reference's
    assert_child_ok(f"""
import random
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from reference import ReferenceCorpus
rng = random.Random(11)
class Hit:
    def __init__(self, corpus, ref, action, value):
        self.corpus, self.ref, self.action, self.value = corpus, ref, action, value
    def __index__(self):
        if self.action == "clear":
            self.corpus.clear(); self.ref.clear()
        else:  # add enough to evict the oldest segments
            for _ in range(6):
                seq = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
                self.corpus.add(seq); self.ref.add(seq)
        gc.collect()
        return self.value
for trial in range(60):
    corpus = _core.Corpus(100, 2, 3, 3, trial)
    ref = ReferenceCorpus(100, 2, 3, 3)
    for _ in range(rng.randint(0, 6)):
        seq = [rng.randrange(4) for _ in range(rng.randint(1, 40))]
        corpus.add(seq); ref.add(seq)
    action = rng.choice(["clear", "add"])
    where = rng.choice(["context", "depth", "per_ngram", "max_nodes", "eos"])
    context, depth, per, nodes, eos = [1, 2, 3], 5, 4, 64, None
    hit = lambda v: Hit(corpus, ref, action, v)
    if where == "context": context = [1, 2, hit(3)]
    elif where == "depth": depth = hit(5)
    elif where == "per_ngram": per = hit(4)
    elif where == "max_nodes": nodes = hit(64)
    else: eos = [hit(3)]
    got = corpus.propose_tree(context, depth, per_ngram=per, max_nodes=nodes, eos_token_id=eos)
    want = ref.propose_tree([1, 2, 3], 5, 4, 64, [3] if eos else None)
    assert tuple(map(list, got)) == tuple(map(list, want)), (trial, action, where, got, want)
    assert corpus.num_sequences == ref.num_sequences
print("OK")
""")


def test_uniforms_mutated_by_float():
    assert_child_ok("""
class Shrinker:
    def __init__(self, target): self.target = target
    def __float__(self):
        self.target.clear(); gc.collect(); return 0.5
probs = np.full((3, 8), 0.125, dtype=np.float32)
u = [0.1, None, 0.2]
u[1] = Shrinker(u)
try:
    path, toks = pld.accept_sample([1, 2], probs, u)
    assert 0 <= len(path) <= 2 and len(toks) == len(path) + 1
except (TypeError, ValueError):
    pass
""")


@pytest.mark.torch
@pytest.mark.parametrize("victim", ["tokens", "probs", "parents"])
def test_tensor_resized_by_another_arguments_conversion(victim):
    # a tensor argument freed (resize_ reallocates its storage) while the
    # binding converts a later argument: the binding must not read it after
    assert_child_ok(f"""
import torch
victim = {victim!r}
draft = torch.tensor([1, 2, 3], dtype=torch.int64)
probs = torch.full((4, 1000), 1e-3, dtype=torch.float32)
class Resizer:
    def __init__(self, t): self.t = t
    def _hit(self):
        self.t.resize_(1 << 22); self.t.zero_(); gc.collect()
    def __index__(self):
        self._hit(); return 1
    def __float__(self):
        self._hit(); return 0.25
for _ in range(20):
    draft = torch.tensor([1, 2, 3], dtype=torch.int64)
    probs = torch.full((4, 1000), 1e-3, dtype=torch.float32)
    try:
        if victim == "tokens":
            pld.accept_greedy(draft, [Resizer(draft), 2, 3, 4])
        elif victim == "probs":
            pld.accept_sample([1, 2, 3], probs, [0.1, Resizer(probs), 0.2, 0.3])
        else:
            pld.accept_sample([1, 2, 3], probs, [0.1] * 4, [-1, Resizer(probs), 1])
    except (TypeError, ValueError, RuntimeError):
        pass
""")


def test_dlpack_method_that_mutates_another_argument():
    # __dlpack__ runs Python code too: it may clear a list given as another
    # argument, which the binding has already converted (or not yet read)
    assert_child_ok("""
class Producer:
    def __init__(self, victim, arr): self.victim, self.arr = victim, arr
    def __dlpack__(self, *a, **k):
        self.victim.clear(); gc.collect()
        return self.arr.__dlpack__()
    def __dlpack_device__(self): return (1, 0)
eos = [9] * 1000
src = np.array([1, 2, 3, 1, 2, 3, 9], dtype=np.int64)
print(pld.find_candidate_pred_tokens(Producer(eos, src), 2, 3, semantics='transformers',
                                     eos_token_id=eos))
probs = np.full((2, 4), 0.25, dtype=np.float32)
u = [0.5, 0.5]
pld.accept_sample([1], Producer(u, probs), u)
""")


def test_lying_len_and_raising_iterators():
    assert_child_ok("""
class Liar:
    def __init__(self, n, items): self.n, self.items = n, items
    def __len__(self): return self.n
    def __getitem__(self, i):
        if i >= len(self.items): raise IndexError(i)
        return self.items[i]
for n in (0, 1, 10**6):
    ix = pld.NgramIndex(2)
    ix.extend(Liar(n, [1, 2, 3, 1, 2]))
    assert ix.tokens() == [1, 2, 3, 1, 2], (n, ix.tokens())
class BadLen(Liar):
    def __len__(self): return -1
try:
    pld.NgramIndex(2).extend(BadLen(0, [1, 2]))
except (TypeError, ValueError):
    pass
""")


# ========================================================= 2. garbage DLPack

DLPACK_CTYPES = """
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
class DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]
class DLManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]
PyCapsule_New = ctypes.pythonapi.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

class Garbage:
    '''__dlpack__ returns a capsule over a hand-made DLTensor.'''
    def __init__(self, data=None, ndim=1, shape=(4,), strides=None, code=0, bits=64,
                 lanes=1, device=1, byte_offset=0, versioned=False, major=1, name=None,
                 null_shape=False):
        self.buf = (ctypes.c_int64 * 64)(*range(64))
        self.shape = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        t = DLTensor()
        t.data = ctypes.addressof(self.buf) if data is None else data
        t.device = DLDevice(device, 0)
        t.ndim = ndim
        t.dtype = DLDataType(code, bits, lanes)
        t.shape = ctypes.cast(None, ctypes.POINTER(ctypes.c_int64)) if null_shape else \\
            ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = byte_offset
        if versioned:
            self.m = DLManagedVersioned(major, 0, None, None, 0, t)
        else:
            self.m = DLManaged(t, None, None)
        self.name = name or (b"dltensor_versioned" if versioned else b"dltensor")
    def __dlpack__(self, *a, **k):
        return PyCapsule_New(ctypes.addressof(self.m), self.name, None)
    def __dlpack_device__(self):
        return (1, 0)

ENTRY_POINTS = {
    "input_ids": lambda g: pld.find_candidate_pred_tokens(g, 2, 2),
    "tokens": lambda g: pld.NgramIndex(2).extend(g),
    "tokens (accept_greedy)": lambda g: pld.accept_greedy(g, [1] * 80),
    "choices": lambda g: pld.accept_greedy([], g),
    "parents": lambda g: pld.accept_greedy([1], [1, 2], g),
    "probs": lambda g: pld.accept_sample([], g, [0.5]),
    "tokens (corpus)": lambda g: _core.Corpus(1000).add(g),
    "context": lambda g: _core.Corpus(1000).propose_tree(g, 3),
    "context (index)": lambda g: pld.NgramIndex(2, 1, "recent").propose_tree_after(g, 3),
}
"""

GARBAGE = [
    ("null-shape", "dict(null_shape=True)"),
    ("negative-dim", "dict(shape=(-5,))"),
    ("huge-dim", "dict(shape=(2**62,))"),
    ("huge-2d", "dict(ndim=2, shape=(2**40, 2**40))"),
    ("null-data", "dict(data=0)"),
    ("negative-ndim", "dict(ndim=-1)"),
    ("ndim-100", "dict(ndim=100)"),
    ("bits-0", "dict(bits=0)"),
    ("bits-3", "dict(bits=3)"),
    ("bits-128", "dict(bits=128)"),
    ("lanes-4", "dict(lanes=4)"),
    ("lanes-0", "dict(lanes=0)"),
    ("unknown-code", "dict(code=77)"),
    ("complex", "dict(code=5, bits=64)"),
    ("huge-stride", "dict(strides=(2**61,))"),
    ("negative-huge-stride", "dict(strides=(-(2**61),))"),
    ("huge-byte-offset", "dict(byte_offset=2**63 + 5)"),
    ("offset-wraps-pointer", "dict(byte_offset=2**64 - 8)"),
    ("device-cuda", "dict(device=2)"),
    ("device-bogus", "dict(device=-3)"),
    ("version-2", "dict(versioned=True, major=2)"),
    ("version-0", "dict(versioned=True, major=0)"),
    ("wrong-name", "dict(name=b'not_a_dltensor')"),
]


@pytest.mark.parametrize("fields", [g[1] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_garbage_dlpack_capsule_is_refused(fields):
    assert_child_ok(DLPACK_CTYPES + f"""
for arg, fn in ENTRY_POINTS.items():
    g = Garbage(**{fields})
    if arg in ("logits", "probs"):
        g = Garbage(**dict(dict(code=2, bits=32, ndim=2, shape=(1, 4)), **{fields}))
    expect((TypeError, ValueError), lambda: fn(g), arg.split()[0])
""")


def test_valid_handmade_capsules_are_read():
    # the same machinery with sane fields is read correctly, so the refusals
    # above are about the fields, not about hand-made capsules
    assert_child_ok(DLPACK_CTYPES + """
g = Garbage(shape=(6,))
ix = pld.NgramIndex(2); ix.extend(g)
assert ix.tokens() == [0, 1, 2, 3, 4, 5]
g = Garbage(shape=(3,), strides=(2,))
ix = pld.NgramIndex(2); ix.extend(g)
assert ix.tokens() == [0, 2, 4]
g = Garbage(shape=(3,), versioned=True)
ix = pld.NgramIndex(2); ix.extend(g)
assert ix.tokens() == [0, 1, 2]
g = Garbage(shape=(0,), data=0)   # empty: NULL data is fine
ix = pld.NgramIndex(2); ix.extend(g)
assert ix.tokens() == []
c = _core.Corpus(100)
c.add(Garbage(shape=(6,)))
c.add(Garbage(shape=(3,), strides=(2,)))
assert [c.sequence(0), c.sequence(1)] == [[0, 1, 2, 3, 4, 5], [0, 2, 4]]
assert c.propose_tree(Garbage(shape=(2,)), 3) == c.propose_tree([0, 1], 3) != ([],) * 5
ix = pld.NgramIndex(2, 1, "recent"); ix.extend([0, 1, 2, 0, 1, 3])
assert ix.propose_tree_after(Garbage(shape=(2,)), 2) == ix.propose_tree_after([0, 1], 2) != ([],) * 5
""")


def test_float8_is_not_called_float64():
    assert_child_ok(DLPACK_CTYPES + """
e = expect(TypeError, lambda: pld.accept_sample([], Garbage(code=2, bits=8, ndim=2, shape=(1, 4)), [0.5]), "probs")
assert "float64" not in str(e) and "float8" in str(e), str(e)
e = expect(TypeError, lambda: pld.NgramIndex(2).extend(Garbage(code=2, bits=8)), "tokens")
assert "float64" not in str(e), str(e)
""")


# ====================================== 3. misaligned buffers, refused buffers

MISALIGNED = """
def misaligned(values, dtype):
    # an array of `values` one byte past an aligned address
    dtype = np.dtype(dtype)
    raw = bytearray(len(values) * dtype.itemsize + 1)
    arr = np.ndarray((len(values),), dtype=dtype, buffer=raw, offset=1)
    arr[:] = values
    assert arr.ctypes.data % dtype.itemsize != 0
    return arr
"""

# (UBSan reports reading these in place as a misaligned load; they run in
# children, so that the sanitizer's halt fails one test, not the suite)


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "uint32"])
def test_misaligned_token_buffers(dtype):
    assert_child_ok(MISALIGNED + f"""
dtype = {dtype!r}
seq = [1, 2, 3, 1, 2, 3, 1, 2]
arr = misaligned(seq, dtype)
expected = pld.find_candidate_pred_tokens(seq, 2, 3)
assert list(pld.find_candidate_pred_tokens(arr, 2, 3)) == expected
ix = pld.NgramIndex(2)
ix.extend(arr)
assert ix.tokens() == seq
got = pld.accept_greedy(misaligned([1, 2], dtype), misaligned([1, 2, 9], dtype))
assert got == pld.accept_greedy([1, 2], [1, 2, 9]) == ([0, 1], [1, 2, 9])
if dtype.startswith("int"):  # parents hold -1
    got = pld.accept_greedy([1, 2], [1, 5, 2], misaligned([-1, -1], dtype))
    assert got == pld.accept_greedy([1, 2], [1, 5, 2], [-1, -1]) == ([0], [1, 5])
""")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_misaligned_float_buffers(dtype):
    assert_child_ok(MISALIGNED + f"""
dtype = {dtype!r}
rng = np.random.default_rng(0)
logits = rng.standard_normal((3, 50)).astype(dtype)
probs = np.abs(logits).astype(dtype) + np.asarray(0.01, dtype)
u = [0.3, 0.6, 0.9]
draft = [pld.accept_sample([], probs, u)[1][0], 5]
assert pld.accept_sample(draft, misaligned(probs.ravel(), dtype).reshape(3, 50),
                         u) == pld.accept_sample(draft, probs, u)
assert len(pld.accept_sample(draft, probs, u)[0]) >= 1
""")


# Every entry point that takes token ids, called with `bad` in one argument.
TOKEN_ENTRY_POINTS = {
    "input_ids": lambda bad: pld.find_candidate_pred_tokens(bad, 2, 2),
    "tokens": lambda bad: pld.NgramIndex(2).extend(bad),
    "choices": lambda bad: pld.accept_greedy([], bad),
    "parents": lambda bad: pld.accept_greedy([1], [1, 2], bad),
    "context": lambda bad: pld._core.Corpus(1000).propose_tree(bad, 3),
    "eos_token_id": lambda bad: pld.NgramIndex(2).propose(2, "transformers", None, bad),
}
NATIVE_ONLY = "expected a 1-D C-contiguous integer buffer in native byte order"


def _byte_swapped(dtype):
    return np.array([1, 2, 3, 1], dtype=np.dtype(dtype).newbyteorder())


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint16"])
@pytest.mark.parametrize("arg", list(TOKEN_ENTRY_POINTS))
def test_byte_swapped_token_buffers_are_refused(dtype, arg):
    # (once converted: read as the ids they hold; now a TypeError that says why)
    with pytest.raises(TypeError, match=arg) as info:
        TOKEN_ENTRY_POINTS[arg](_byte_swapped(dtype))
    assert NATIVE_ONLY in str(info.value)


def test_byte_swapped_float_buffers_are_refused():
    with pytest.raises(TypeError, match="probs"):
        pld.accept_sample([1, 2], np.zeros((3, 4), dtype=">f4"), [0.5] * 3)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself
@pytest.mark.parametrize("shape", ["strided", "reversed", "broadcast", "2d", "2d-one-row",
                                   "np.matrix", "memoryview-2d"])
@pytest.mark.parametrize("arg", list(TOKEN_ENTRY_POINTS))
def test_strided_and_multidimensional_token_buffers_are_refused(shape, arg):
    # (once converted -- copied, or [1, L] read as its row -- now a
    # ValueError naming the argument; find_candidate_pred_tokens still takes
    # a NumPy [1, L] array whose row is C-contiguous, but not these)
    seq = np.array([1, 2, 3, 1, 2, 3], dtype=np.int64)
    bad = {"strided": np.repeat(seq, 2)[::2], "reversed": seq[::-1],
           "broadcast": np.broadcast_to(np.int64(3), (4,)),
           "2d": np.stack([seq, seq]), "2d-one-row": np.repeat(seq, 2)[None, ::2],
           "np.matrix": np.matrix([seq]),
           "memoryview-2d": memoryview(seq.tobytes()).cast("q", (2, 3))}[shape]
    with pytest.raises(ValueError, match=arg) as info:
        TOKEN_ENTRY_POINTS[arg](bad)
    assert NATIVE_ONLY in str(info.value)


def test_accepted_token_buffers_answer_as_lists_do():
    # the kinds that stay: 1-D C-contiguous integer buffers of any width,
    # NumPy's [1, L] with a contiguous row at the Python edge, and 0-d
    # integers where one id is
    seq = [1, 2, 3, 4, 1, 2]
    want = pld.find_candidate_pred_tokens(seq, 2, 2)
    for dtype in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64):
        arr = np.array(seq, dtype=dtype)
        assert pld.find_candidate_pred_tokens(arr, 2, 2).tolist() == want
        assert pld.find_candidate_pred_tokens(arr[None], 2, 2).tolist() == want
        ix = pld.NgramIndex(2)
        ix.extend(arr)
        ix.extend(np.array(7, dtype=dtype))
        assert ix.tokens() == seq + [7]
    assert pld.find_candidate_pred_tokens(np.arange(10)[2:8], 2, 2).tolist() == []
    assert pld.find_candidate_pred_tokens(memoryview(np.array(seq)), 2, 2) == want
    read_only = np.array(seq)
    read_only.flags.writeable = False
    assert pld.find_candidate_pred_tokens(read_only, 2, 2).tolist() == want


# ======================================================= 4. swallowed errors

@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "MemoryError"])
@pytest.mark.parametrize("where", ["iter", "index", "float", "dlpack", "getattr"])
def test_errors_from_callbacks_pass_through(exc, where):
    assert_child_ok(f"""
EXC = {exc}
class Items:
    def __len__(self): return 3
    def __getitem__(self, i): raise EXC()
class Id:
    def __index__(self): raise EXC()
class Flt:
    def __float__(self): raise EXC()
class Producer:
    def __dlpack__(self, *a, **k): raise EXC()
    def __dlpack_device__(self): return (1, 0)
class Attr:
    def __getattr__(self, name): raise EXC()
probs = np.full((2, 4), 0.25, dtype=np.float32)
where = {where!r}
calls = {{
    "iter": [lambda: pld.NgramIndex(2).extend(Items()),
             lambda: pld.find_candidate_pred_tokens(Items(), 2, 2),
             lambda: pld.accept_sample([1], probs, Items()),
             lambda: pld.accept_greedy([1], [1, 2], Items())],
    "index": [lambda: pld.NgramIndex(2).extend([1, Id()]),
              lambda: pld.accept_greedy([Id()], [1, 2]),
              lambda: pld.NgramIndex(2).propose(Id()),
              lambda: pld.NgramIndex(Id()),
              lambda: pld.accept_sample([1], probs, [0.5, 0.5], [Id()])],
    "float": [lambda: pld.accept_sample([1], probs, [0.5, Flt()])],
    "dlpack": [lambda: pld.NgramIndex(2).extend(Producer()),
               lambda: pld.accept_sample([1], Producer(), [0.5, 0.5]),
               lambda: pld.find_candidate_pred_tokens([1, 2], 2, 2, semantics="transformers",
                                                      eos_token_id=Producer())],
    "getattr": [lambda: pld.NgramIndex(2).extend(Attr()),
                lambda: pld.accept_sample([1], Attr(), [0.5, 0.5])],
}}[where]
for fn in calls:
    try:
        fn()
    except EXC:
        continue
    except BaseException as e:
        raise AssertionError("got %r instead of {exc}" % (e,))
    raise AssertionError("no exception")
""")


def test_replaced_errors_keep_their_cause():
    class Id:
        def __index__(self):
            raise ValueError("bad id inside")
    with pytest.raises(ValueError, match="tokens") as info:
        pld.NgramIndex(2).extend([1, Id()])
    assert "bad id inside" in repr(info.value.__cause__)
    with pytest.raises(TypeError, match="input_ids") as info:
        pld.find_candidate_pred_tokens([np.array([1, 2]), np.array([3, 4])], 2, 2)


# ================================================= 5. the Python edge

@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself
def test_numpy_matrix_is_refused():
    # (it once answered like an array: its row is [1, L] again, not 1-D)
    seq = [1, 2, 3, 4, 1, 2]
    with pytest.raises(ValueError, match="input_ids") as info:
        pld.find_candidate_pred_tokens(np.matrix([seq]), 2, 2)
    assert NATIVE_ONLY in str(info.value) and "matrix" in str(info.value)
    assert pld.find_candidate_pred_tokens(np.asarray(np.matrix([seq]))[0], 2, 2).tolist() == [3, 4]


@pytest.mark.parametrize("make", [np.int64, np.int32, np.uint8, lambda v: np.array(v)],
                         ids=["int64", "int32", "uint8", "0d-array"])
def test_numpy_integers_wherever_an_int_is(make):
    seq = [1, 2, 3, 4, 1, 2, 5, 1, 2]
    want = pld.find_candidate_pred_tokens(seq, 2, 3)
    assert pld.find_candidate_pred_tokens(seq, make(2), make(3)) == want
    assert pld.find_candidate_pred_tokens(seq, 2, 3, min_ngram_size=make(1)) == want
    ix = pld.NgramIndex(make(2), make(1))
    ix.extend(seq)
    ix.extend(make(3))
    assert ix.propose(make(2)) == [4, 1]
    ix.reserve(make(10))
    ix.truncate(make(9))
    assert ix.propose(make(3)) == want
    eos = pld.find_candidate_pred_tokens(seq, 2, 3, semantics="transformers",
                                         eos_token_id=make(4), max_length=make(50))
    assert eos == [3]
    assert ix.propose(3, "transformers", None, make(4)) == [3]


@pytest.mark.torch
def test_zero_d_tensor_as_eos_and_sizes():
    torch = pytest.importorskip("torch")
    seq = [1, 2, 3, 4, 1, 2]
    assert pld.find_candidate_pred_tokens(seq, 2, 3, semantics="transformers",
                                          eos_token_id=torch.tensor(4)) == [3]
    assert pld.find_candidate_pred_tokens(seq, torch.tensor(2), torch.tensor(3)) == [3, 4, 1]


@pytest.mark.parametrize("value", [True, 2.0, "3", None, [2]])
def test_non_integers_are_still_refused_for_sizes(value):
    with pytest.raises(TypeError, match="num_pred_tokens"):
        pld.find_candidate_pred_tokens([1, 2, 3], 2, value)


@pytest.mark.parametrize("k", [-1, 0, 2**20 + 1, 2**63, 10**30, -(10**30)])
def test_out_of_range_sizes(k):
    with pytest.raises(ValueError, match="num_pred_tokens"):
        pld.find_candidate_pred_tokens([1, 2, 3], 2, k)
    with pytest.raises(ValueError, match="num_pred_tokens"):
        pld.NgramIndex(2).propose(k)


def test_huge_reserve_and_truncate():
    ix = pld.NgramIndex(2)
    ix.extend([1, 2, 3])
    for n in (2**40, 2**62, 10**30):
        with pytest.raises(ValueError):
            ix.reserve(n)
    for n in (-1, -(10**30)):
        with pytest.raises(ValueError, match="n"):
            ix.truncate(n)
    ix.truncate(2**62)  # beyond the length: nothing to drop
    assert ix.tokens() == [1, 2, 3]


@pytest.mark.parametrize("call", [
    lambda: pld.NgramIndex(2).extend(True),
    lambda: pld.NgramIndex(2).extend([1, True]),
    lambda: pld.Corpus(100).add([True, False]),
    lambda: pld.find_candidate_pred_tokens([1, 2, 1], 1, 2, semantics="transformers", eos_token_id=[True]),
    lambda: _core.accept_greedy([True], [1, 2]),
    lambda: _core.accept_greedy([1, 2], [1, 2, 3], [-1, False]),
], ids=["extend-one", "extend-list", "corpus-add", "eos", "accept-tokens", "accept-parents"])
def test_a_bool_is_no_token_id(call):
    # (bool is an int subclass: it passed the integer fast paths once)
    with pytest.raises(TypeError, match="got bool"):
        call()


def test_corpus_offer_takes_an_array_as_add_does():
    corpus = pld.Corpus(100)
    assert corpus.offer(np.array([1, 2, 3])) is True
    assert corpus.offer(np.array([], dtype=np.int64)) is False
    assert corpus.sequences() == [[1, 2, 3]]


def test_corpus_add_checks_and_adds_one_copy_of_the_ids():
    """Another thread writes refused ids into the array while add runs
    (with the GIL released for the add): whatever add takes, it is what it
    checked, so the corpus never holds a negative id or one beyond its
    bound (it read the caller's memory several times once)."""
    import threading

    corpus = pld.Corpus(1 << 22, segments=1)
    corpus._core._bind_vocab(100, True)
    n = 1 << 20
    ids = np.zeros(n, dtype=np.int64)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            ids[n - 10] = 10**12
            ids[n - 10] = 0
            ids[n - 20] = -5
            ids[n - 20] = 0

    thread = threading.Thread(target=writer)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread.start()
    try:
        for _ in range(20):
            try:
                corpus.add(ids)
            except ValueError as error:
                assert "-5" in str(error) or str(10**12) in str(error)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old)
    held = np.concatenate([np.asarray(s) for s in corpus.sequences()] or [np.zeros(0, np.int64)])
    assert held.size == 0 or (held.min() >= 0 and held.max() < 100 and corpus.max_id < 100)


@pytest.mark.torch
def test_a_tensor_with_torch_s_negative_bit_is_refused():
    # its DLPack export carries its memory, not its values
    torch = pytest.importorskip("torch")
    ids = torch._neg_view(torch.tensor([-5, -6, -7, -5, -6]))
    with pytest.raises(TypeError, match="tokens.*is_neg.*resolve_neg"):
        pld.NgramIndex(2).extend(ids)
    probs = torch._neg_view(torch.full((2, 2), -0.5))
    with pytest.raises(TypeError, match="probs.*is_neg"):
        _core.accept_sample([1], probs, [0.5, 0.5])
    ix = pld.NgramIndex(2)
    ix.extend(ids.resolve_neg())
    assert ix.tokens() == [5, 6, 7, 5, 6]


# ======================================================= 6. randomness

def test_accept_sample_draws_nothing_of_its_own():
    # the uniforms are the caller's: the same ones give the same tokens,
    # in a forked child too (there is no generator inside pld to reseed)
    probs = np.full((3, 1 << 12), 1.0, dtype=np.float32)
    u = [0.25, 0.5, 0.75]
    first = pld.accept_sample([7, 9], probs, u)
    assert all(pld.accept_sample([7, 9], probs, u) == first for _ in range(5))
    assert not hasattr(pld, "Generator") and not hasattr(pld._core, "_reseed_after_fork")


# ======================================================= 7. hash flooding

def test_index_hash_is_keyed_per_index():
    ids = crafted_ids(2000)
    assert len({pld._core._ngram_tag([x], 0) & 0xFFFF for x in ids}) == 1
    for seed in (1, 2**63 + 12345, 987654321):
        homes = {pld._core._ngram_tag([x], seed) & 0xFFFF for x in ids}
        assert len(homes) > 1500, (seed, len(homes))
    # bigram tags are keyed too
    assert pld._core._ngram_tag([5, 6], 0) != pld._core._ngram_tag([5, 6], 1)
    # two indexes made without a seed get different keys
    seeds = {pld.NgramIndex(2).hash_seed for _ in range(8)}
    assert len(seeds) == 8
    assert pld.NgramIndex(2, seed=42).hash_seed == 42


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, "x"])
def test_index_seed_is_checked(seed):
    with pytest.raises((TypeError, ValueError), match="seed"):
        pld.NgramIndex(2, seed=seed)


@pytest.mark.parametrize("policy", ["first", "recent", "frequent"])
def test_keyed_indexes_answer_alike(policy):
    rng = np.random.default_rng(3)
    seq = rng.integers(0, 12, 600).tolist() + crafted_ids(50)
    a = pld.NgramIndex(3, 1, policy, seed=0)
    b = pld.NgramIndex(3, 1, policy, seed=2**64 - 1)
    for t in seq:
        a.extend(t)
        b.extend(t)
        assert a.propose(4) == b.propose(4)


# ============================================= threads sharing one index

def test_threads_sharing_one_index():
    assert_child_ok("""
rng = np.random.default_rng(0)
chunks = [rng.integers(0, 50, 40000).astype(np.int64) for _ in range(8)]
shared = pld.NgramIndex(3)
lock = threading.Lock()
done, refused = [], []
def worker(i):
    for r in range(6):
        try:
            shared.extend(chunks[i][r * 5000:(r + 1) * 5000] if r else chunks[i])
            with lock: done.append((i, r))
        except RuntimeError as e:
            assert "in use" in str(e)
            with lock: refused.append((i, r))
        try:
            shared.propose(5)
            len(shared)
        except RuntimeError as e:
            assert "in use" in str(e)
threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in threads: t.start()
for t in threads: t.join()
assert len(done) + len(refused) == 48
# whatever the interleaving, the index equals one built from its tokens alone
alone = pld.NgramIndex(3)
alone.extend(shared.tokens())
assert len(shared) == len(alone)
for k in (1, 5, 10):
    assert shared.propose(k) == alone.propose(k)
# and eight threads with an index each answer as one thread does
def build(i, out):
    ix = pld.NgramIndex(3); ix.extend(chunks[i]); out[i] = ix.propose(10)
par = {}
ts = [threading.Thread(target=build, args=(i, par)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
seq = {}
for i in range(8): build(i, seq)
assert par == seq
""", timeout=300)


# ------------------------------------------- errors that name their argument
@pytest.mark.parametrize("name, call, message", [
    ("draft_rows width", lambda C, ix, st, r: C.draft_rows([st], r, 2 ** 70, np.array([41]), [[40]], 5, 100, None,
                                                           False, ()), "draft_rows: width is out of range"),
    ("follow at", lambda C, ix, st, r: ix.follow(r, 2 ** 64, 50, 1), "follow: at is out of range"),
    ("seems limit", lambda C, ix, st, r: st.seems(r, 0, 2 ** 64), "seems: limit is out of range"),
    ("first_unequal stop", lambda C, ix, st, r: ix.first_unequal(r, 0, 0, 2 ** 64),
     "first_unequal: stop is out of range"),
    ("send_drafts length", lambda C, ix, st, r: C.send_drafts([st], [[1, 2]], [(0, 1, 1, 2)], [(2 ** 70, 1.0)]),
     "send_drafts: a chosen length is out of range"),
    ("send_drafts predicted", lambda C, ix, st, r: C.send_drafts([st], [[1, 2]], [(0, 1, 1, 2)], [(2, 10 ** 400)]),
     "send_drafts: chosen\\[0\\]'s predicted is out of range"),
])
def test_an_int_out_of_range_is_a_value_error_naming_it(name, call, message):
    """Not PyLong_AsSsize_t's bare OverflowError."""
    ix = _core.NgramIndex()
    ix.extend(list(range(40)))
    st = _core.DraftState(ix)
    with pytest.raises(ValueError, match=message):
        call(_core, ix, st, np.arange(100))
    assert len(ix) == 40 and st.proposed == 0


class _LazyBits:
    """A DLPack producer whose is_neg() fails (or returns what has no truth)."""

    def __init__(self, neg):
        self.neg = neg

    def __dlpack__(self, *args, **kwargs):
        return np.arange(3).__dlpack__()

    def is_neg(self):
        return self.neg()


class _NoTruth:
    def __bool__(self):
        raise ValueError("no truth")


def _fails():
    raise TypeError("is_neg failed")


@pytest.mark.parametrize("neg", [_fails, _NoTruth], ids=["raises", "no truth"])
def test_an_error_from_a_tensors_is_neg_names_the_argument_and_keeps_its_cause(neg):
    for call in (lambda o: _core.NgramIndex().extend(o), lambda o: _core.Corpus(100).add(o)):
        with pytest.raises(ValueError, match="tokens: the _LazyBits's is_neg\\(\\) failed") as caught:
            call(_LazyBits(neg))
        assert caught.value.__cause__ is not None


@pytest.mark.parametrize("rows", [b"abcabc", bytearray(b"abcabc")], ids=["bytes", "bytearray"])
def test_rows_of_bytes_are_refused_as_token_input_is(rows):
    """Their bytes would pass for uint8 ids (97, 98, ...)."""
    index = _core.NgramIndex()
    with pytest.raises(TypeError, match="rows: expected a C-contiguous array of integer ids, got byte"):
        index.follow(rows, 0, 6, 2)
    with pytest.raises(TypeError, match="rows"):
        index.first_unequal(rows, 0, 0, 6)
    with pytest.raises(TypeError, match="rows"):
        _core.DraftState(index).seems(rows, 0, 6)
    assert len(index) == 0


def test_a_context_read_after_its_index_grew_its_ngrams_keeps_enough_ids():
    """A conversion re-initialises the index with larger n-grams: the tree is
    the one the same call gives afterwards, not one looked up on fewer ids."""
    seq = [4, 9, 9, 1, 2, 3, 7, 4, 5, 5]  # the 1-gram (4,) first gives 9; the 2-gram (7, 4) gives 5
    index = _core.NgramIndex(1, 1, "first", seed=0)
    index.extend(seq)

    class Context(list):
        def __iter__(self):
            index.__init__(2, 1, "first", seed=0)
            index.extend(seq)
            return super().__iter__()

    assert index.propose_tree_after(Context([7, 4]), 2) == index.propose_tree_after([7, 4], 2)
