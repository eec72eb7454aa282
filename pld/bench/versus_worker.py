"""One build's side of ``python -m pld bench versus``: a standalone script.

The driver (:mod:`pld.bench.versus`) runs this file by path, as
``python versus_worker.py`` with ``PYTHONPATH=<build root>`` and
``PYTHONSAFEPATH=1``, once per build, so ``import pld`` here is that
build's pld. The file is never imported from a build: it must run against
older builds, so it uses only long-standing APIs (``pld.models.load``,
``pld.models.chat_template_ids``, ``pld.bench.methods.REGISTRY`` and
``Setup`` (positional), ``pld.generate`` with ``attention_mask`` and
``rows``, and ``pld.forward_cost.calibrating`` when the build has it);
the draft options go to pld.generate by the names the build takes
(:func:`_draft_names`: transformers' since issue 36, the old ones before).

Protocol: one JSON object a line on stdin, one reply a line on stdout;
``{"ok": true, ...}`` or ``{"ok": false, "error": traceback}``. Everything
else printed here (also by C code) goes to stderr. Commands:

  hello     -> pld_file (real path), pld_version, python, torch,
            transformers: which pld this is, before any model loads
  init      threads, max_new_tokens, num_pred_tokens, max_ngram, methods,
            batch_size -> torch_threads, pad_token_id (loads the model)
  encode    turns (user messages), answers (token ids of the assistant's
            earlier answers) -> ids: the chat's prompt ids
  warmup    ids, mask -> each method run once, not measured
  generate  method, ids, mask -> new_tokens, seconds (wall), forward_calls
            (calibrations' left out), calibration_forwards,
            calibration_seconds (time inside those), tokens (each row's
            new tokens)
  quit      exits
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

#: batched (B > 1) methods: name -> options of pld.generate
BATCH_OPTIONS = {"pld": {}, "pld_tree": {"draft_tree": True}}


def _protocol_stream() -> Any:
    """A text stream on the original stdout for replies; fd 1 (and
    sys.stdout) then go to stderr, so no stray print breaks the protocol."""
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def _drop_own_folder() -> None:
    """This file's folder off sys.path (Python < 3.11 puts it first, and its
    modules would shadow top-level names)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


def _draft_names() -> tuple:
    """The names this build's pld.generate takes for the draft length and
    the largest n-gram: transformers' (prompt_lookup_num_tokens,
    max_matching_ngram_size) where its DecodeConfig has them, else the
    names older builds took (num_pred_tokens, max_ngram_size)."""
    try:
        from pld.config import DecodeConfig
        names = DecodeConfig.option_names()
    except (ImportError, AttributeError):
        names = ()
    if "prompt_lookup_num_tokens" in names:
        return "prompt_lookup_num_tokens", "max_matching_ngram_size"
    return "num_pred_tokens", "max_ngram_size"


class ForwardCounter:
    """Counts the model's forward passes with hooks. Those of a forward-cost
    calibration (``pld.forward_cost.calibrating()``, when the build has it;
    one-time per model and context size) count apart, with their time."""

    def __init__(self, model: Any) -> None:
        try:
            from pld import forward_cost
            self._calibrating: Optional[Callable[[], bool]] = getattr(forward_cost, "calibrating", None)
        except ImportError:
            self._calibrating = None
        self._t0: Optional[float] = None
        self.reset()
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after)

    def reset(self) -> None:
        self.calls, self.calibration_calls, self.calibration_seconds = 0, 0, 0.0

    def _before(self, module: Any, inputs: Any) -> None:
        if self._calibrating is not None and self._calibrating():
            self._t0 = time.perf_counter()
        else:
            self.calls += 1

    def _after(self, module: Any, inputs: Any, output: Any) -> None:
        if self._t0 is not None:
            self.calibration_seconds += time.perf_counter() - self._t0
            self.calibration_calls += 1
            self._t0 = None


class Worker:
    """The loaded model, its methods and the command handlers."""

    def __init__(self, msg: Dict[str, Any]) -> None:
        import torch

        import pld
        from pld import models

        if msg.get("threads"):
            torch.set_num_threads(int(msg["threads"]))
        self.torch, self.pld = torch, pld
        self.model, self.tokenizer = models.load(None)
        self.counter = ForwardCounter(self.model)
        self.methods = self._build(msg)

    def _build(self, msg: Dict[str, Any]) -> Dict[str, Callable[[Any, Any], List[List[int]]]]:
        """name -> fn(ids [B, L], mask or None) -> each row's new tokens."""
        names, B = list(msg["methods"]), int(msg.get("batch_size", 1))
        k, max_n = int(msg["num_pred_tokens"]), int(msg["max_ngram"])  # (the protocol's names)
        if B > 1:
            unknown = [n for n in names if n not in BATCH_OPTIONS]
            if unknown:
                raise ValueError(f"methods {unknown}: batches take only {list(BATCH_OPTIONS)}")
            k_name, n_name = _draft_names()
            common = {"max_new_tokens": int(msg["max_new_tokens"]), k_name: k, n_name: max_n}
            return {n: self._batched(dict(common, **BATCH_OPTIONS[n])) for n in names}
        from pld.bench.methods import REGISTRY, Setup

        unknown = [n for n in names if n not in REGISTRY]
        if unknown:
            raise ValueError(f"methods {unknown}: not in this build's registry {list(REGISTRY)}")
        setup = Setup(self.model, int(msg["max_new_tokens"]), k, max_n)
        return {n: self._single(REGISTRY[n].build(setup)) for n in names}

    @staticmethod
    def _single(generate: Callable[[Any], Any]) -> Callable[[Any, Any], List[List[int]]]:
        """A registry method (ids [1, L] -> sequences) as fn(ids, mask) -> [new tokens]."""
        def run(ids: Any, mask: Any) -> List[List[int]]:
            return [generate(ids)[0, ids.shape[1]:].tolist()]
        return run

    def _batched(self, options: Dict[str, Any]) -> Callable[[Any, Any], List[List[int]]]:
        """pld.generate on a batch with ``options``: fn(ids, mask) -> each row's new tokens."""
        def run(ids: Any, mask: Any) -> List[List[int]]:
            return [list(r) for r in self.pld.generate(self.model, ids, attention_mask=mask, **options).rows]
        return run

    def info(self) -> Dict[str, Any]:
        """init's reply: torch threads, and the pad id for left padding
        (the tokenizer's pad, else its eos)."""
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return {"torch_threads": self.torch.get_num_threads(), "pad_token_id": pad}

    def _tensors(self, msg: Dict[str, Any]) -> Any:
        """(ids, mask or None) of a command as long tensors."""
        ids = self.torch.tensor(msg["ids"], dtype=self.torch.long)
        mask = msg.get("mask")
        return ids, (None if mask is None else self.torch.tensor(mask, dtype=self.torch.long))

    def encode(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """The chat's prompt ids, as pld.bench.generation.chat_input_ids
        builds them (the chat template, else plain "Role: text" lines)."""
        from pld.models import chat_template_ids

        turns, answers = list(msg["turns"]), [self.tokenizer.decode(a, skip_special_tokens=True)
                                              for a in msg.get("answers", [])]
        messages: List[Dict[str, str]] = []
        for j, user in enumerate(turns):
            messages.append({"role": "user", "content": user})
            if j < len(turns) - 1:
                messages.append({"role": "assistant", "content": answers[j]})
        ids = chat_template_ids(self.tokenizer, messages)
        if ids is None:
            text = "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages) + "\n\nAssistant:"
            ids = self.tokenizer(text, return_tensors="pt").input_ids
        return {"ids": ids[0].tolist()}

    def warmup(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """Every method once on the command's ids (not measured)."""
        ids, mask = self._tensors(msg)
        for fn in self.methods.values():
            fn(ids, mask)
        return {}

    def generate(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        """One measured run: wall seconds, forwards, each row's new tokens."""
        ids, mask = self._tensors(msg)
        fn = self.methods[msg["method"]]
        self.counter.reset()
        start = time.perf_counter()
        rows = fn(ids, mask)
        seconds = time.perf_counter() - start
        return {"new_tokens": sum(map(len, rows)), "seconds": seconds,
                "forward_calls": self.counter.calls, "calibration_forwards": self.counter.calibration_calls,
                "calibration_seconds": self.counter.calibration_seconds, "tokens": rows}


def hello() -> Dict[str, Any]:
    """Which pld (and Python, torch, transformers) this process imports."""
    import platform

    import torch
    import transformers

    import pld

    return {"pld_file": os.path.realpath(pld.__file__), "pld_version": getattr(pld, "__version__", "?"),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def serve(proto: Any) -> int:
    """Answer commands from stdin until quit or end of input."""
    worker: Optional[Worker] = None
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        cmd = msg.get("cmd")
        if cmd == "quit":
            break
        try:
            if cmd == "hello":
                reply = hello()
            elif cmd == "init":
                worker = Worker(msg)
                reply = worker.info()
            elif worker is None or cmd not in ("encode", "warmup", "generate"):
                raise ValueError(f"command {cmd!r}: unknown, or before init")
            else:
                reply = getattr(worker, cmd)(msg)
            reply["ok"] = True
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        proto.write(json.dumps(reply) + "\n")
        proto.flush()
    return 0


if __name__ == "__main__":
    _drop_own_folder()
    sys.exit(serve(_protocol_stream()))
