"""Benchmarks for pld, run as ``python -m pld bench [subcommand] [options]``
(or ``python -m pld.bench``). Without a subcommand it runs ``generation``.

Subcommands (see ``python -m pld bench --help``):

  lookup   time per generation step of the draft lookup against context
           length: plain-torch and transformers baselines, a pure-Python
           dict index, pld's one-shot C scan and pld.NgramIndex.
  flood    extend of ids crafted to collide in one hash slot against random
           ids (the index's hash is keyed per index).
  kv-forward
           a one-token forward on DynamicCache against pld.kv_cache's
           OwnedCache at a few context lengths.
  tree-prior
           fits pld.token_tree.PRIOR (acceptance of tree nodes by n-gram
           size, support, depth and agreement with the model's
           successors) on held-out prompts.
  generation
           the speedup tables: tokens/s of greedy, transformers' prompt
           lookup and pld per task (summarization, RAG, two-turn chat,
           code editing, translation, long documents of 1k-4k tokens),
           methods alternating per prompt;
           built-in offline prompts, Spec-Bench, or the Hub datasets.
  versus   this build against another (--baseline DIR, e.g. a worktree of
           the previous commit built in place): pld methods on both, each
           build in its own worker process, alternating per prompt;
           tokens/s, tokens per forward and identical outputs.
  siblings n samples a prompt (num_return_sequences) at T = 0.7, top-p
           0.9, with and without drafts from the sibling samples.
  corpus-stream
           Spec-Bench's six categories in order with one pld.Corpus kept
           across the calls, against none; a plot along the stream.
  forward-cost
           c(w) for w = 1..64 at several contexts (the device synchronised
           around every forward), beside what pld's calibration measures.
  exactness
           on a device (a GPU): the share of outputs identical to plain
           greedy for every pld path and transformers' prompt lookup, on
           the architecture matrix and a hidden-2048 llama in each dtype.
  host-time
           time outside the model's forwards, per forward, of pld against
           transformers' prompt lookup and greedy, at long contexts.
  replay   the steps of a real model's pld runs (verified and accepted
           tokens) replayed on a bigger model's forwards, against greedy.
  vllm     vLLM with pld's drafter against vLLM plain and vLLM's ngram:
           tokens/s one request at a time and several at once, the
           drafter's time per step at 1k-32k tokens of context, and vLLM
           plain's outputs replayed through the drafters on step-cost
           curves (--parts replay).

The modules here need the optional ``bench`` extras (numpy, matplotlib,
tqdm); torch and transformers are used when importable.
"""

#: subcommand name -> (module under pld.bench, one-line help)
SUBCOMMANDS = {
    "generation": ("generation", "speedup tables: greedy vs transformers' prompt lookup vs pld, per task"),
    "lookup": ("lookup", "time per step of the draft lookup vs context length"),
    "flood": ("flood", "extend of ids crafted to collide in the index's hash vs random ids"),
    "kv-forward": ("kv_forward", "one-token forward on transformers' DynamicCache vs pld.kv_cache's"),
    "tree-prior": ("tree_prior", "fit the token tree's acceptance prior on prompts the reports do not use"),
    "versus": ("versus", "this build against another (a previous commit): two workers alternating per prompt"),
    "siblings": ("siblings", "n samples a prompt with and without sibling drafts"),
    "corpus-stream": ("corpus_stream", "a stream of calls over Spec-Bench's six categories with one corpus vs none"),
    "forward-cost": ("forward_curve", "c(w), a forward over w tokens against one, at several contexts; pld's "
                     "calibration beside it"),
    "exactness": ("exactness", "outputs identical to plain greedy on a device: every path, the architecture "
                  "matrix and a hidden-2048 llama in each dtype"),
    "host-time": ("host_time", "time outside the model's forwards per forward: pld vs transformers' prompt lookup"),
    "replay": ("replay", "a real model's drafts and acceptance replayed on a bigger model's forwards (7B-shaped)"),
    "vllm": ("vllm_serving", "vLLM with pld's drafter vs vLLM plain and its ngram: tokens/s at 1 and 8 requests, "
             "and the drafter's time per step at 1k-32k tokens"),
}
DEFAULT_SUBCOMMAND = "generation"


def speedup_tables(**options):
    """The speedup-table benchmark from Python; see
    :func:`pld.bench.generation.speedup_tables`."""
    from .generation import speedup_tables as run

    return run(**options)


__all__ = ["SUBCOMMANDS", "DEFAULT_SUBCOMMAND", "speedup_tables"]
