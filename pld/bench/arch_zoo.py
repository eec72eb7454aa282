"""Tiny random models of every decoder-only architecture in transformers'
causal-LM mapping that builds from a small config (the architecture
matrix's models).

:func:`tiny_arch_model` shrinks the architecture's default config
(2 layers, hidden 64, 4 heads, small experts, a 64-token sliding window
where the architecture has one, vocabulary VOCAB) and builds the model
in float32 with a fixed seed. :func:`census` tries every causal-LM model
type of the installed transformers and says, for each that is left out,
why: an encoder or encoder-decoder model, a stateful (recurrent) model,
a config the shrinking cannot make consistent, a forward or a plain
greedy ``generate`` that fails on a tiny model. Nothing is read from the
Hub.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Tuple

VOCAB = 96
WINDOW = 64
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
LAYERS = 2
#: A shrunk config with more parameters than this is left out (it did not shrink).
MAX_PARAMETERS = 3_000_000

# config attribute -> the tiny value (set where the config has the attribute)
_SIZES: Dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN, "n_embd": HIDDEN, "d_model": HIDDEN, "embed_dim": HIDDEN, "dim": HIDDEN,
    "num_hidden_layers": LAYERS, "n_layer": LAYERS, "n_layers": LAYERS, "num_layers": LAYERS,
    "num_attention_heads": HEADS, "n_head": HEADS, "n_heads": HEADS, "num_heads": HEADS,
    "num_key_value_heads": KV_HEADS, "multi_query_group_num": KV_HEADS, "num_kv_heads": KV_HEADS,
    "head_dim": HEAD_DIM, "kv_channels": HEAD_DIM,
    "intermediate_size": 2 * HIDDEN, "n_inner": 2 * HIDDEN, "ffn_dim": 2 * HIDDEN, "ffn_hidden_size": 2 * HIDDEN,
    "moe_intermediate_size": HIDDEN, "shared_expert_intermediate_size": HIDDEN,
    "expert_intermediate_size": HIDDEN, "moe_ffn_hidden_size": HIDDEN,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_k": 2, "top_k": 2, "moe_topk": 2, "num_experts_per_token": 2,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "max_position_embeddings": 512, "n_positions": 512, "n_ctx": 512, "max_seq_len": 512,
    "max_sequence_length": 512, "seq_length": 512,
    "sliding_window": WINDOW, "attention_window_size": WINDOW,
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": HEAD_DIM, "qk_head_dim": 16,
    "rotary_dim": HEAD_DIM // 2, "partial_rotary_factor": 0.5,
    "tie_word_embeddings": True,
}
# token ids a config names, kept inside the tiny vocabulary
_TOKEN_IDS = {"pad_token_id": VOCAB - 1, "bos_token_id": 1, "eos_token_id": 2}
# encoders (bidirectional) that transformers also maps to a causal LM head
# (with is_decoder=True), and decoders of encoder-decoder or multimodal
# models: not the decoder-only language models pld serves
_NOT_DECODER_ONLY = frozenset({
    "bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
    "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "xlm",
    "xlm-roberta", "xlm-roberta-xl", "xlnet", "xmod", "reformer", "trocr", "moshi", "fuyu", "git",
    "gemma4_unified",  # (its text model, gemma4_unified_text, is in the matrix)
})


def _is_decoder_only(model_type: str, config: Any) -> Optional[str]:
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder model"
    if model_type in _NOT_DECODER_ONLY:
        return "an encoder, or the decoder of a multimodal or encoder-decoder model, not a decoder-only LM"
    return None


#: Variants of an architecture that real checkpoints use: "type+variant"
#: names the architecture's config with these settings.
VARIANTS = {"falcon+alibi": {"alibi": True}, "qwen2+sliding": {"use_sliding_window": True, "max_window_layers": 1}}


def tiny_config(model_type: str) -> Any:
    """The architecture's default config, shrunk (see the module's
    docstring); a sliding window of WINDOW tokens wherever the config has
    one to set (real checkpoints of mistral, phi3, starcoder2... use one)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type.split("+")[0], **VARIANTS.get(model_type, {}))
    text = getattr(config, "get_text_config", lambda: config)()
    for target in {id(config): config, id(text): text}.values():
        for name, value in _SIZES.items():
            if name in vars(target) or name in getattr(type(target), "attribute_map", {}):
                try:
                    setattr(target, name, value)
                except (AttributeError, TypeError, ValueError):
                    pass
        if "kv_lora_rank" in vars(target):  # multi-head latent attention: a head a query head
            if "num_key_value_heads" in vars(target):
                target.num_key_value_heads = HEADS
            if "qk_rope_head_dim" in vars(target) and "head_dim" in vars(target):
                target.head_dim = target.qk_rope_head_dim  # the rotated part
        for name, value in _TOKEN_IDS.items():
            if isinstance(getattr(target, name, None), int):
                setattr(target, name, value)
        _fit_layer_lists(target)
    config.use_cache = True
    return config


def _fit_layer_lists(config: Any) -> None:
    """Per-layer lists (layer_types, ...) cut to the tiny depth."""
    for name, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) > LAYERS and name in (
                "layer_types", "block_types", "attn_layer_indices", "mlp_only_layers", "layers_block_type",
                "no_rope_layers", "sliding_window_pattern_list", "moe_layers", "rope_layers"):
            if name == "layer_types" and len(set(value)) > 1:
                # keep both kinds in two layers: a sliding one and a full one
                kinds = list(dict.fromkeys(value))[:LAYERS]
                setattr(config, name, (kinds + kinds)[:LAYERS])
            else:
                setattr(config, name, value[:LAYERS])


@functools.lru_cache(maxsize=None)
def tiny_arch_model(model_type: str, seed: int = 0) -> Any:
    """A float32 random model of ``model_type`` from :func:`tiny_config`
    (cached: treat it as read-only), in eval mode, SDPA attention where the
    architecture has it."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    with torch.device("meta"):  # counted before anything is allocated
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"the shrunk config still has {size:,} parameters")
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    except ValueError:  # no SDPA path: the eager one
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    model.generation_config.pad_token_id = VOCAB - 1
    return model


def census_one(model_type: str) -> Tuple[Optional[Any], Optional[str]]:
    """(the model, None) when it builds and plain greedy generate runs on
    it; (None, why not) otherwise."""
    import torch

    try:
        config = tiny_config(model_type)
    except Exception as error:  # noqa: BLE001 - the census reports every failure
        return None, f"no config ({type(error).__name__})"
    reason = _is_decoder_only(model_type, config)
    if reason:
        return None, reason
    try:
        model = tiny_arch_model(model_type)
    except Exception as error:  # noqa: BLE001
        return None, f"does not build from a small config ({type(error).__name__}: {str(error)[:80]})"
    if getattr(model, "_is_stateful", False):
        return model, None  # kept: the matrix checks the clear error
    try:  # past the window, and a left-padded batch
        ids = torch.tensor([[(7 * i + 3) % (VOCAB - 1) for i in range(WINDOW + 30)]] * 2)
        mask = torch.ones_like(ids)
        mask[1, :5] = 0
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=3, pad_token_id=VOCAB - 1)
    except Exception as error:  # noqa: BLE001
        return None, f"plain greedy generate fails on a tiny model ({type(error).__name__}: {str(error)[:80]})"
    return model, None


@functools.lru_cache(maxsize=None)
def census() -> Tuple[Tuple[str, ...], Dict[str, str]]:
    """(model types the matrix runs, {model type left out: why})."""
    import warnings

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    runs: List[str] = []
    left_out: Dict[str, str] = {}
    for model_type in sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(VARIANTS)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, reason = census_one(model_type)
        if model is None:
            left_out[model_type] = reason
        else:
            runs.append(model_type)
    return tuple(runs), left_out


def model_types() -> List[str]:
    """Every causal-LM model type of the installed transformers and the variants."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(VARIANTS))


def periodic_prompt(seed: Any, n: int, vocab: int = VOCAB) -> List[int]:
    """n tokens that repeat stretches of a 30-token random base (drafts
    match), the same for the same seed."""
    import random

    rng = random.Random(seed)
    base = [rng.randrange(3, vocab - 1) for _ in range(30)]
    out: List[int] = []
    while len(out) < n:
        out += base[:rng.randrange(8, 30)]
    return out[:n]


def left_padded(prompts: List[List[int]], pad: int) -> Tuple[Any, Any]:
    """(ids, attention mask) of ``prompts`` left-padded with ``pad``."""
    import torch

    L = max(map(len, prompts))
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask
