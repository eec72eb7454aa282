"""How the vLLM tests build an engine: the embedded model in float32,
eager, seeded, a KV cache of a fixed size (on the CPU backend vLLM would
otherwise reserve most of the machine's memory; on a GPU several engines
share the device: pld.bench.vllm_serving.memory_options)."""
from __future__ import annotations

K = 8  # num_speculative_tokens
MAX_MODEL_LEN = 8192


def engine(model_dir: str, drafting: bool, kv_bytes: int = 1 << 30, max_model_len: int = MAX_MODEL_LEN,
           **pld_options):
    """A vLLM LLM, with pld's drafter (options: additional_config["pld"]) or plain."""
    from vllm import LLM

    from pld.bench.vllm_serving import memory_options

    spec = {"speculative_config": {"model": "pld.vllm.Drafter", "num_speculative_tokens": K},
            "additional_config": {"pld": pld_options}} if drafting else {}
    return LLM(model=model_dir, dtype="float32", max_model_len=max_model_len, enforce_eager=True, seed=0,
               kv_cache_memory_bytes=kv_bytes, disable_log_stats=False, **memory_options(), **spec)
