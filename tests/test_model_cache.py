"""pld.models keeps the dequantized embedded model as a Hugging Face folder
(pld.models.embedded_cache_folder): a later load reads the folder, with the
same weights, tokenizer and generation config; a broken or unwritable cache
costs only time and a warning, never the model."""
from __future__ import annotations

import logging
import os

import pytest

from models_fixtures import one_thread  # noqa: F401 - a fixture

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_thread")]

TEXTS = ["Summarize: the quick brown fox jumps over 12 lazy dogs.",
         "def f(x):\n\treturn x ** 2  # über, 東京, emoji \U0001F600"]


@pytest.fixture(scope="module")
def loads(tmp_path_factory, one_thread):  # noqa: F811
    """A broken cache folder, then two loads: the first finds the folder
    broken, reads the GGUF and mends it; the second reads the mended
    folder. (first, second, the sources transformers was asked to read in
    order, the folder, the warnings logged)."""
    import transformers

    from pld import models

    mp = pytest.MonkeyPatch()
    mp.setenv("PLD_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.delenv("PLD_MODEL_CACHE", raising=False)
    folder = models.embedded_cache_folder("float32")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{ not json")
    sources, warnings = [], []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(source, *args, **kwargs):
        sources.append((str(source), kwargs.get("gguf_file")))
        return real(source, *args, **kwargs)

    class Catch(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    handler = Catch(logging.WARNING)
    logging.getLogger("pld").addHandler(handler)
    mp.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    import torch

    try:
        rng = torch.random.get_rng_state()
        first = models.load()
        second = models.load()
        # (the cold load builds a model to save; nothing may move torch's RNG)
        assert torch.equal(rng, torch.random.get_rng_state()), "loading the model changed torch's RNG"
        yield first, second, list(sources), folder, warnings
    finally:
        logging.getLogger("pld").removeHandler(handler)
        mp.undo()


def _same_model(a, b):
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name
    assert a.generation_config.to_dict() == b.generation_config.to_dict()


def _same_tokenizer(a, b):
    from pld import models

    for text in TEXTS:
        assert a(text)["input_ids"] == b(text)["input_ids"]
        messages = [{"role": "user", "content": text}]
        assert models.chat_template_ids(a, messages).tolist() == models.chat_template_ids(b, messages).tolist()
    for name in ("eos_token", "eos_token_id", "pad_token_id", "bos_token_id"):
        assert getattr(a, name) == getattr(b, name), name


def test_a_broken_cache_is_read_again_from_the_gguf_and_mended(loads):
    _, _, sources, folder, warnings = loads
    assert sources[0] == (str(folder), None)  # the broken folder first
    assert sources[1][1] is not None  # then the GGUF
    assert any("does not load" in w for w in warnings), warnings
    assert (folder / "model.safetensors").is_file()


def test_the_second_load_reads_the_cached_folder_and_gets_the_same_model(loads):
    (m1, t1), (m2, t2), sources, folder, _ = loads
    assert sources[2:] == [(str(folder), None)]  # the mended folder, no GGUF
    assert not m2.training
    _same_model(m1, m2)
    _same_tokenizer(t1, t2)
    assert t2.eos_token == "<|im_end|>"


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mappings (Linux)")
def test_a_cached_model_holds_its_weights_in_its_own_memory(loads):
    """Not in the mapping of the cached file: decoding from mapped weights
    was measured slower (pld.models._in_own_memory)."""
    (_, _), (model, _), _, folder, _ = loads
    mapped = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5].startswith(str(folder)):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                mapped.append((start, end))
    inside = [n for n, p in model.named_parameters() if any(a <= p.data_ptr() < b for a, b in mapped)]
    assert not inside, f"{len(inside)} weights read from the mapped cache file, e.g. {inside[:3]}"


def test_the_key_changes_with_the_dtype_and_the_cache_can_be_turned_off(loads, monkeypatch):
    from pld import models

    folder = loads[3]
    assert models.embedded_cache_folder("bfloat16") not in (None, folder)
    monkeypatch.setenv("PLD_MODEL_CACHE", "0")
    assert models.embedded_cache_folder("float32") is None


def test_a_cache_that_cannot_be_written_keeps_the_model(loads, tmp_path, caplog):
    from pld import models

    (m1, t1), _, _, _, _ = loads
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="pld"):
        kept = models._keep(m1, t1, blocker / "embedded")
    assert "could not cache" in caplog.text and not blocker.with_name("embedded").exists()
    _same_model(m1, kept)
