"""Models for the benchmarks that time a device: the embedded model, a
local one, or a llama of a named shape with random weights (timing does
not depend on the weights), built directly on the device; and the line
that names the device.

    load_model("shape:7b", "bfloat16", "cuda")   # Llama-2-7B's shape, random
    load_model(None, "float32", "cuda")          # the embedded SmolLM2-135M
"""
from __future__ import annotations

import os
import platform
from typing import Any, Dict, Optional, Tuple

#: shape name -> LlamaConfig fields (sizes of published models)
SHAPES: Dict[str, Dict[str, int]] = {
    # Llama-2-7B (the method's own model is this size)
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
    # TinyLlama-1.1B: grouped-query attention, hidden 2048
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    # hidden 2048 in 4 layers: real width, quick to run (the exactness check)
    "wide": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000),
    # a few layers of width 64: the CPU tests of these benchmarks
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}
PREFIX = "shape:"


def resolve_device(name: str) -> str:
    """``auto`` -> cuda when available, else cpu; anything else as given."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def random_llama(shape: str, dtype: Any, device: str, seed: int = 0) -> Any:
    """A LlamaForCausalLM of ``shape`` (a key of SHAPES) with random weights,
    made on ``device`` in ``dtype`` (no float32 copy on the host), eval mode,
    the same for the same seed. torch's global RNG states (the CPU's and
    every GPU's, which manual_seed seeds) are restored afterwards."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"shape: expected one of {sorted(SHAPES)}, got {shape!r}")
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=32768, rope_theta=10000.0,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    where = torch.device(device)
    forked = list(range(torch.cuda.device_count())) if where.type == "cuda" else []  # (manual_seed seeds every GPU)
    with torch.random.fork_rng(devices=forked), where:
        torch.manual_seed(seed)  # inside the fork: the caller's states come back
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.generation_config.pad_token_id = 0
    return model.eval()


def load_model(model: Optional[str], dtype: str, device: str) -> Tuple[Any, Any, str]:
    """(model, tokenizer or None, name): ``shape:NAME`` gives a random llama
    (no tokenizer), anything else pld.models.load (None: the embedded model)."""
    import torch

    from pld import models

    if model and model.startswith(PREFIX):
        shape = model[len(PREFIX):]
        return random_llama(shape, getattr(torch, dtype), device), None, f"llama {shape} shape, random weights"
    lm, tokenizer = models.load(model, dtype=dtype, device=device)
    return lm, tokenizer, model or models.EMBEDDED_NAME


def describe_device(device: str) -> str:
    """The device in words: the GPU's name, memory and CUDA version, or the CPU's."""
    import torch

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs, "
                f"CUDA {torch.version.cuda}")
    from .report import _cpu_name

    return f"{_cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def versions_line() -> str:
    import torch
    import transformers

    import pld

    return (f"torch {torch.__version__}, transformers {transformers.__version__}, pld {pld.__version__}, "
            f"Python {platform.python_version()}")
