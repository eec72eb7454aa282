"""The names users already know (issue 36).

* DecodeConfig, pld.generate, pld.loop.run, pld.enable/enabled take
  transformers' ``prompt_lookup_num_tokens`` and ``max_matching_ngram_size``;
  the old ``num_pred_tokens`` / ``max_ngram_size`` still work for one
  release: each warns (DeprecationWarning, naming the new name, attributed
  to the caller's line) and gives the same config; an old name with its
  new name is a TypeError naming both.
* pld.Corpus takes pld.NgramIndex's ``min_ngram_size``, ``max_ngram_size``
  and ``seed`` (old: ``min_ngram``, ``max_ngram``, ``hash_seed``); its
  files keep their keys, and a file written with them loads.

The DecodeConfig and Corpus tests need no torch; the others carry the
``torch`` marker.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import struct
import sys
import warnings

import pytest

import pld
from pld import DecodeConfig
from pld.corpus import MAGIC, VERSION, Corpus

DECODE_RENAMES = [("num_pred_tokens", "prompt_lookup_num_tokens", 7),
                  ("max_ngram_size", "max_matching_ngram_size", 5)]
CORPUS_RENAMES = [("min_ngram", "min_ngram_size", 3), ("max_ngram", "max_ngram_size", 5),
                  ("hash_seed", "seed", 12345)]


def torch_test(fn):
    """The ``torch`` marker and one intra-op thread, as the other modules."""
    return pytest.mark.torch(pytest.mark.usefixtures("one_thread")(fn))


@pytest.fixture(scope="module")
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _pld_disabled_around():
    """Every test that touches the switch ends with pld disabled."""
    yield
    if "pld.from_generate" in sys.modules:
        sys.modules["pld.from_generate"].disable()


def _one_deprecation(record, old: str, new: str) -> None:
    """``record`` (from pytest.warns) holds exactly one DeprecationWarning,
    naming ``old`` and ``new``, attributed to this file (the caller's line)."""
    ours = [w for w in record if issubclass(w.category, DeprecationWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    message = str(ours[0].message)
    assert old in message and new in message, message
    assert ours[0].filename == __file__, (ours[0].filename, message)


# ------------------------------------------------------------ DecodeConfig

def test_new_names_work_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = DecodeConfig(prompt_lookup_num_tokens=7, max_matching_ngram_size=5, min_ngram_size=2)
        assert (c.prompt_lookup_num_tokens, c.max_matching_ngram_size, c.min_ngram_size) == (7, 5, 2)
        assert c.replace(prompt_lookup_num_tokens=4).prompt_lookup_num_tokens == 4
        d = DecodeConfig()
    assert (d.prompt_lookup_num_tokens, d.max_matching_ngram_size, d.min_ngram_size) == (10, 3, 1)


def test_option_names_and_signature_list_the_new_names_only():
    names = DecodeConfig.option_names()
    assert {"prompt_lookup_num_tokens", "max_matching_ngram_size", "min_ngram_size"} <= set(names)
    assert not {"num_pred_tokens", "max_ngram_size"} & set(names)
    params = inspect.signature(DecodeConfig).parameters
    assert list(params) == list(names)
    assert [f.name for f in dataclasses.fields(DecodeConfig)] == list(names)


@pytest.mark.parametrize("old,new,value", DECODE_RENAMES)
def test_old_name_in_constructor_warns_and_gives_the_same_config(old, new, value):
    with pytest.warns(DeprecationWarning) as record:
        c = DecodeConfig(**{old: value})
    _one_deprecation(record, old, new)
    assert c == DecodeConfig(**{new: value})
    assert getattr(c, new) == value


@pytest.mark.parametrize("old,new,value", DECODE_RENAMES)
def test_old_name_in_replace_warns_and_gives_the_same_config(old, new, value):
    base = DecodeConfig(max_new_tokens=9, policy="recent")
    with pytest.warns(DeprecationWarning) as record:
        c = base.replace(**{old: value})
    _one_deprecation(record, old, new)
    assert c == base.replace(**{new: value})
    assert (c.max_new_tokens, c.policy, getattr(c, new)) == (9, "recent", value)


@pytest.mark.parametrize("old,new,value", DECODE_RENAMES)
def test_old_name_read_warns_and_gives_the_value(old, new, value):
    c = DecodeConfig(**{new: value})
    with pytest.warns(DeprecationWarning) as record:
        got = getattr(c, old)
    _one_deprecation(record, old, new)
    assert got == value


def test_both_old_names_at_once():
    with pytest.warns(DeprecationWarning) as record:
        c = DecodeConfig(num_pred_tokens=4, max_ngram_size=2)
    assert len([w for w in record if issubclass(w.category, DeprecationWarning)]) == 2
    assert c == DecodeConfig(prompt_lookup_num_tokens=4, max_matching_ngram_size=2)


@pytest.mark.parametrize("old,new,value", DECODE_RENAMES)
def test_old_and_new_name_together_is_a_type_error(old, new, value):
    with pytest.raises(TypeError, match=f"{old}.*{new}"):
        DecodeConfig(**{old: value, new: value})
    with pytest.raises(TypeError, match=f"{old}.*{new}"):
        DecodeConfig().replace(**{old: value, new: value})


def test_validation_names_the_new_names():
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens must be >= 1"):
        DecodeConfig(prompt_lookup_num_tokens=0)
    with pytest.raises(TypeError, match="prompt_lookup_num_tokens must be an int"):
        DecodeConfig(prompt_lookup_num_tokens=2.0)
    with pytest.raises(ValueError, match="max_matching_ngram_size must be <= 64"):
        DecodeConfig(max_matching_ngram_size=65)
    with pytest.raises(ValueError, match=r"min_ngram_size \(3\) must not exceed max_matching_ngram_size \(2\)"):
        DecodeConfig(min_ngram_size=3, max_matching_ngram_size=2)
    # an old name's bad value is reported under the new name
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        DecodeConfig(num_pred_tokens=0)


def test_unknown_names_are_still_refused():
    with pytest.raises(TypeError):
        DecodeConfig(num_pred_token=3)


def test_an_old_name_used_in_pld_itself_would_fail_here():
    """The shims' warnings are errors under ``-W error::DeprecationWarning``;
    so is nothing else in a plain construction (the check the release
    notes promise: the new names run clean)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        DecodeConfig(prompt_lookup_num_tokens=5)
        with pytest.raises(DeprecationWarning, match="prompt_lookup_num_tokens"):
            DecodeConfig(num_pred_tokens=5)


# ------------------------------------------------------------ Corpus

def test_corpus_new_keywords_and_properties():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = Corpus(100, min_ngram_size=1, max_ngram_size=3, segments=2, seed=7)
        assert (c.min_ngram_size, c.max_ngram_size, c.segments, c.seed) == (1, 3, 2, 7)
        assert "min_ngram_size=1" in repr(c) and "max_ngram_size=3" in repr(c)
    params = inspect.signature(Corpus).parameters
    assert {"min_ngram_size", "max_ngram_size", "seed"} <= set(params)
    assert not {"min_ngram", "max_ngram", "hash_seed"} & set(params)
    # the names pld.NgramIndex takes
    index_params = ("max_ngram_size", "min_ngram_size", "seed")
    ix = pld.NgramIndex(max_ngram_size=3, min_ngram_size=1, seed=7)
    assert (ix.max_ngram_size, ix.min_ngram_size, ix.hash_seed) == (3, 1, 7)
    assert set(index_params) <= set(params)


@pytest.mark.parametrize("old,new,value", CORPUS_RENAMES)
def test_corpus_old_keyword_warns_and_gives_the_same_corpus(old, new, value):
    with pytest.warns(DeprecationWarning) as record:
        c = Corpus(100, **{old: value})
    _one_deprecation(record, old, new)
    d = Corpus(100, **{new: value})
    settings = ("max_tokens", "min_ngram_size", "max_ngram_size", "segments", "seed")
    if new != "seed":  # (the seed is random unless given)
        settings = settings[:-1]
    assert [getattr(c, s) for s in settings] == [getattr(d, s) for s in settings]
    assert getattr(c, new) == value
    for corpus in (c, d):
        corpus.add([1, 2, 3, 4, 5, 1, 2, 3, 9])
    assert c.propose_tree([1, 2, 3], 4) == d.propose_tree([1, 2, 3], 4)


@pytest.mark.parametrize("old,new,value", CORPUS_RENAMES)
def test_corpus_old_property_warns(old, new, value):
    c = Corpus(100, **{new: value})
    with pytest.warns(DeprecationWarning) as record:
        got = getattr(c, old)
    _one_deprecation(record, old, new)
    assert got == value


@pytest.mark.parametrize("old,new,value", CORPUS_RENAMES)
def test_corpus_old_and_new_keyword_together_is_a_type_error(old, new, value):
    with pytest.raises(TypeError, match=f"{old}.*{new}"):
        Corpus(100, **{old: value, new: value})


def test_corpus_validation_names_the_new_names():
    with pytest.raises(ValueError, match="min_ngram_size"):
        Corpus(100, min_ngram_size=0)
    with pytest.raises(ValueError, match=r"min_ngram_size \(3\) must not exceed max_ngram_size \(2\)"):
        Corpus(100, min_ngram_size=3, max_ngram_size=2)
    with pytest.raises(ValueError, match="seed"):
        Corpus(100, seed=-1)


def test_corpus_load_takes_seed_and_the_old_hash_seed(tmp_path):
    c = Corpus(100, min_ngram_size=1, max_ngram_size=3)
    c.add([1, 2, 3, 4])
    c.save(tmp_path / "c.pld")
    assert Corpus.load(tmp_path / "c.pld", seed=5).seed == 5
    with pytest.warns(DeprecationWarning) as record:
        d = Corpus.load(tmp_path / "c.pld", hash_seed=6)
    _one_deprecation(record, "hash_seed", "seed")
    assert d.seed == 6 and d.sequences() == [[1, 2, 3, 4]]
    with pytest.raises(TypeError, match="hash_seed.*seed"):
        Corpus.load(tmp_path / "c.pld", hash_seed=6, seed=6)


def _header_of(path) -> dict:
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 12)
    return json.loads(data[16:16 + length])


def test_corpus_file_keeps_its_keys(tmp_path):
    """Files are unchanged by the rename: "min_ngram"/"max_ngram" in the
    header, so older pld releases read them and this one reads theirs."""
    c = Corpus(100, min_ngram_size=1, max_ngram_size=3, segments=2)
    c.add([5, 6, 7])
    c.save(tmp_path / "c.pld")
    header = _header_of(tmp_path / "c.pld")
    assert (header["min_ngram"], header["max_ngram"], header["segments"]) == (1, 3, 2)
    assert "min_ngram_size" not in header and "max_ngram_size" not in header


def _old_file(path, sequences, min_ngram: int, max_ngram: int, max_tokens: int = 1000, segments: int = 4) -> None:
    """A corpus file as the releases before the rename wrote it, built by
    hand from the format (pld.corpus's docstring), not by Corpus.save."""
    tokens = [t for s in sequences for t in s]
    header = {"max_tokens": max_tokens, "min_ngram": min_ngram, "max_ngram": max_ngram,
              "segments": segments, "n_sequences": len(sequences), "n_tokens": len(tokens),
              "segments_used": 1 if tokens else 0, "evicted": 0, "vocab_size": None, "signature": None,
              "fingerprint": None, "token_bytes": 4}
    head = json.dumps(header).encode("utf-8")
    body = (struct.pack("<8sII", MAGIC, VERSION, len(head)) + head
            + struct.pack(f"<{len(sequences)}I", *map(len, sequences))
            + struct.pack(f"<{len(tokens)}i", *tokens))
    path.write_bytes(body + hashlib.sha256(body).digest())


def test_a_corpus_file_with_the_old_keys_loads(tmp_path):
    seqs = [[1, 2, 3, 4, 5], [7, 1, 2, 3, 9]]
    _old_file(tmp_path / "old.pld", seqs, min_ngram=2, max_ngram=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = Corpus.load(tmp_path / "old.pld")
    assert (c.min_ngram_size, c.max_ngram_size, c.max_tokens, c.segments) == (2, 3, 1000, 4)
    assert c.sequences() == seqs
    fresh = Corpus(1000, min_ngram_size=2, max_ngram_size=3, segments=4)
    for s in seqs:
        fresh.add(s)
    assert c.propose_tree([1, 2, 3], 3) == fresh.propose_tree([1, 2, 3], 3)
    # and it saves again with the same keys
    c.save(tmp_path / "again.pld")
    assert (_header_of(tmp_path / "again.pld")["min_ngram"], _header_of(tmp_path / "again.pld")["max_ngram"]) == (2, 3)


# ------------------------------------------------------------ pld.generate, loop.run

def _ids():
    import torch

    return torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]])


@pytest.fixture(scope="module")
def model():
    import models_fixtures as mf

    return mf.tiny_model("gpt2")


@torch_test
@pytest.mark.parametrize("old,new,value", DECODE_RENAMES)
def test_generate_old_name_warns_and_gives_the_same_output(model, old, new, value):
    kw = dict(max_new_tokens=12, eos_token_id=None, cost_aware=False)  # (every draft verified)
    steps_old, steps_new = [], []
    with pytest.warns(DeprecationWarning) as record:
        old_gen = pld.generate(model, _ids(), on_step=steps_old.append, **kw, **{old: value})
    _one_deprecation(record, old, new)
    new_gen = pld.generate(model, _ids(), on_step=steps_new.append, **kw, **{new: value})
    assert old_gen.new_tokens == new_gen.new_tokens
    assert [(s.proposed, s.accepted) for s in steps_old] == [(s.proposed, s.accepted) for s in steps_new]


@torch_test
def test_generate_old_name_changes_the_draft():
    """The old name is not ignored: a draft length of 1 proposes one token
    at a time where the default would propose more."""
    import models_fixtures as mf

    model = mf.tiny_model("gpt2")
    steps = []
    with pytest.warns(DeprecationWarning):
        pld.generate(model, _ids(), max_new_tokens=12, eos_token_id=None, num_pred_tokens=1,
                     cost_aware=False, on_step=steps.append)
    assert steps and max(s.proposed for s in steps) == 1


@torch_test
@pytest.mark.parametrize("old,new,value", DECODE_RENAMES)
def test_generate_old_and_new_name_together_is_a_type_error(model, old, new, value):
    with pytest.raises(TypeError, match=f"{old}.*{new}"):
        pld.generate(model, _ids(), max_new_tokens=4, **{old: value, new: value})


@torch_test
def test_generate_signature_lists_the_new_names():
    params = inspect.signature(pld.generate).parameters
    assert "prompt_lookup_num_tokens" in params and "max_matching_ngram_size" in params
    assert "num_pred_tokens" not in params and "max_ngram_size" not in params


@torch_test
@pytest.mark.parametrize("old,new,value", DECODE_RENAMES)
def test_loop_run_old_name_warns_at_the_caller(model, old, new, value):
    from pld import loop

    with pytest.warns(DeprecationWarning) as record:
        old_run = loop.run(model, _ids(), max_new_tokens=8, eos_token_id=None, **{old: value})
    _one_deprecation(record, old, new)
    assert old_run.sequences.tolist() == loop.run(model, _ids(), max_new_tokens=8, eos_token_id=None,
                                                  **{new: value}).sequences.tolist()


# ------------------------------------------------------------ enable()

@torch_test
@pytest.mark.parametrize("old,new,value", DECODE_RENAMES)
def test_enable_old_name_warns_then_is_refused_under_the_new_name(old, new, value):
    """enable() never took the draft length or the largest n-gram (a
    generate() call gives them): an old name is translated, with the
    warning, and refused as its new name is, naming it."""
    with pytest.warns(DeprecationWarning) as record, pytest.raises(TypeError, match=new):
        pld.enable(**{old: value})
    _one_deprecation(record, old, new)
    assert not pld.is_enabled()
    with pytest.raises(TypeError, match=f"{old}.*{new}"):
        pld.enable(**{old: value, new: value})


@torch_test
def test_enabled_old_name_warns_at_the_with_line():
    with pytest.warns(DeprecationWarning) as record, pytest.raises(TypeError, match="prompt_lookup_num_tokens"):
        with pld.enabled(num_pred_tokens=3):
            pass
    _one_deprecation(record, "num_pred_tokens", "prompt_lookup_num_tokens")
    assert not pld.is_enabled()


@torch_test
def test_enabled_and_is_enabled_say_which_is_which():
    from pld import from_generate as hf

    assert "context manager" in hf.enabled.__doc__ and "is_enabled" in hf.enabled.__doc__
    assert "bool" in hf.is_enabled.__doc__ and "context manager" in hf.is_enabled.__doc__
