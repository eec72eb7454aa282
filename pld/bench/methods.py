"""The decoding methods the benchmark compares, in a registry.

A method is a factory: given a :class:`Setup` (the model and the shared
settings) it returns a function ``input_ids -> sequences``. Register a new
one with :func:`register`; every pld match policy gets a variant on its own,
so a policy added to the C core shows up here without editing this file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence

Generate = Callable[[Any], Any]


@dataclass(frozen=True)
class Setup:
    model: Any
    max_new_tokens: int
    prompt_lookup_num_tokens: int
    max_matching_ngram_size: int

    def eos_ids(self) -> List[int]:
        eos = self.model.generation_config.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos or [])

    def decode_config(self, **options: Any) -> Any:
        """The native loop's DecodeConfig for this setup: DecodeConfig's
        defaults, the shared budget and draft settings, the model's eos,
        and a method's ``options``."""
        from pld.config import DecodeConfig

        return DecodeConfig(**{"max_new_tokens": self.max_new_tokens,
                               "prompt_lookup_num_tokens": self.prompt_lookup_num_tokens,
                               "max_matching_ngram_size": self.max_matching_ngram_size,
                               "eos_token_id": self.eos_ids(), **options})

    def greedy_kwargs(self) -> Dict[str, Any]:
        # explicit None sampling knobs: no warnings from a sampling-ready generation_config
        return dict(max_new_tokens=self.max_new_tokens, do_sample=False, temperature=None,
                    top_p=None, top_k=None)


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    build: Callable[[Setup], Generate]
    default: bool = False


REGISTRY: Dict[str, Method] = {}


def register(name: str, description: str, default: bool = False):
    """Decorator: add a factory ``Setup -> (input_ids -> sequences)``."""
    def wrap(build: Callable[[Setup], Generate]) -> Callable[[Setup], Generate]:
        if name in REGISTRY:
            raise ValueError(f"method {name!r} is registered twice")
        REGISTRY[name] = Method(name, description, build, default)
        return build
    return wrap


def select(spec: str) -> List[Method]:
    """``"default"``, ``"all"`` or a comma-separated list of names. Greedy,
    the reference of every comparison, is always included and first."""
    if spec in ("default", "all"):
        names = [m.name for m in REGISTRY.values() if spec == "all" or m.default]
    else:
        names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or not names:
        raise ValueError(f"methods: unknown {unknown or spec!r}; 'default', 'all' or some of {list(REGISTRY)}")
    names = ["greedy"] + [n for n in dict.fromkeys(names) if n != "greedy"]
    return [REGISTRY[n] for n in names]


def build(methods: Sequence[Method], setup: Setup) -> Dict[str, Generate]:
    return {m.name: m.build(setup) for m in methods}


@register("greedy", "plain greedy model.generate (the reference)", default=True)
def _greedy(s: Setup) -> Generate:
    import torch

    def run(ids):
        with torch.no_grad():
            return s.model.generate(ids, **s.greedy_kwargs())
    return run


@register("greedy_again", "plain greedy once more: the A/A pair whose ratio to greedy sizes the noise")
def _greedy_again(s: Setup) -> Generate:
    return _greedy(s)


@register("greedy_onednn", "plain greedy model.generate with its linear layers on oneDNN, the kernel "
          "pld's loop uses (what the kernel alone gives)")
def _greedy_onednn(s: Setup) -> Generate:
    import torch

    from pld.cpu_kernels import LinearKernel

    kernel = LinearKernel(s.model, "onednn")

    def run(ids):
        with torch.no_grad(), kernel.routing():
            return s.model.generate(ids, **s.greedy_kwargs())
    return run


@register("greedy_owncache", "plain greedy model.generate with pld.kv_cache's preallocated cache "
          "instead of DynamicCache (what the cache alone gives)")
def _greedy_owncache(s: Setup) -> Generate:
    import torch

    from pld.hf_adapter import model_traits

    def run(ids):
        with torch.no_grad():
            cache_argument = model_traits(s.model).cache_argument  # past_key_values; cache from 5.24
            return s.model.generate(ids, **{cache_argument: _owned_cache(s, ids)}, **s.greedy_kwargs())
    return run


@register("transformers", "transformers' own prompt lookup (generate, prompt_lookup_num_tokens)", default=True)
def _transformers(s: Setup) -> Generate:
    import torch

    def run(ids):
        with torch.no_grad():
            out = s.model.generate(ids, prompt_lookup_num_tokens=s.prompt_lookup_num_tokens,
                                   max_matching_ngram_size=s.max_matching_ngram_size, **s.greedy_kwargs())
        # transformers 4.57 can accept a draft past max_new_tokens; the tokens
        # beyond the budget are not counted (greedy would not have made them)
        return out[:, :ids.shape[1] + s.max_new_tokens]
    return run


@register("pld", "the same generate() call under pld.enabled(): the C core and native loop", default=True)
def _pld_enabled(s: Setup) -> Generate:
    import torch

    import pld

    def run(ids):
        with torch.no_grad(), pld.enabled():
            return s.model.generate(ids, prompt_lookup_num_tokens=s.prompt_lookup_num_tokens,
                                    max_matching_ngram_size=s.max_matching_ngram_size, **s.greedy_kwargs())
    return run


def _dynamic_cache(s: Setup, ids: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache()


def _loop_default_cache(s: Setup, ids: Any) -> Any:
    return None  # loop.run picks (pld.kv_cache.cache_for)


def _owned_cache(s: Setup, ids: Any) -> Any:
    """pld.kv_cache's cache with room for the whole output (transformers'
    DynamicCache for a model it cannot serve)."""
    from pld.kv_cache import cache_for

    return cache_for(s.model, capacity=ids.shape[1] + s.max_new_tokens + s.prompt_lookup_num_tokens + 1)


def _loop(cache: Callable[[Setup, Any], Any] = _loop_default_cache,
          **options: Any) -> Callable[[Setup], Generate]:
    """The native loop with ``options``; ``cache(setup, input_ids)`` makes
    each run's empty cache."""
    def factory(s: Setup) -> Generate:
        import torch

        from pld import loop

        config = s.decode_config(**options)

        def run(ids):
            with torch.no_grad():
                return loop.run(s.model, ids, config, cache=cache(s, ids)).sequences
        return run
    return factory


register("pld_adaptive", "native loop, draft length adapts to acceptance (same output)")(_loop(adaptive=True))
register("pld_min2", "native loop, no draft from a 1-token match (same output)")(_loop(min_ngram_size=2))
register("pld_full", "native loop, every draft verified in full: no width budget (same output)")(
    _loop(cost_aware=False))
register("pld_torch_linear", "the pld default (native loop, width budget) with torch's own linear "
         "kernel instead of oneDNN (pld.cpu_kernels)")(_loop(linear_kernel="torch"))
register("pld_owncache", "the pld default (native loop, width budget) on pld.kv_cache's preallocated "
         "cache, sized for the output")(_loop(cache=_owned_cache))
register("pld_dynamic_cache", "the pld default (native loop, width budget) on transformers' DynamicCache "
         "instead of pld.kv_cache's (what the cache gives)")(_loop(cache=_dynamic_cache))
register("pld_tree", "native loop, token-tree drafts: several candidates a step under a width "
         "budget from the measured forward cost (same output)")(_loop(draft_tree=True))
register("pld_tree_input", "native loop, token-tree drafts from the input only (no model "
         "successors), under the width budget (same output)")(_loop(draft_tree=True, tree_successors=False))
register("pld_tree_w12", "native loop, token-tree drafts, no budget: the 12 likeliest nodes "
         "every step (same output)")(_loop(draft_tree=True, cost_aware=False, tree_width=12))
register("pld_linear", "native loop, one linear draft a step under the width budget "
         "(same output)")(_loop())
register("pld_clipped", "native loop, transformers' match rule: a match near the end proposes "
         "what follows it, even if shorter than k")(_loop(semantics="transformers"))


def _register_policies() -> None:
    from pld import POLICIES

    for policy in POLICIES:
        register(f"pld_{policy}", f"native loop, match policy '{policy}'")(_loop(policy=policy))


def _register_sources() -> None:
    """A method for each draft source alone (pld.drafts.REGISTRY): a new
    source shows up here without editing this file."""
    from pld.drafts import describe

    for name, text in describe().items():
        register(f"pld_drafts_{name}", f"native loop, drafts from the '{name}' source alone: {text}")(
            _loop(draft_sources=(name,)))


_register_policies()
_register_sources()
