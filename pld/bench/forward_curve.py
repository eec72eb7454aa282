"""c(w): what a forward over w new tokens costs against a one-token
forward, for the --widths w (1 to 64), at each context length, on this device;
and what pld's own learned cost (pld.forward_cost, as the loop runs it)
gives there, with and without waiting for the device.

    python -m pld bench forward-cost --device cuda \\
        --models shape:7b@bfloat16,embedded@float32 --contexts 1024,4096,16384

For each model and context T: a random prompt of T tokens is prefilled
into a DynamicCache (in chunks), then every width runs --repeats times,
widths in a rotating order, each forward followed by a crop back to T.
Every clock read waits for the device first (torch.cuda.synchronize on a
GPU): a GPU forward returns when its kernels are queued, not done. A cell
is the median. Then pld's decoder prefills another prompt of T tokens
(one that repeats itself) with token trees and decodes 24 steps: its
learned c(w) (two probe forwards, then every step's timed forward) is set
beside the curve, once as this release times (synchronised) and once as
a clock without synchronisation would (the previous release on a GPU).

Models: ``embedded`` (SmolLM2-135M), a folder or .gguf, or ``shape:NAME``
(pld.bench.shapes: 7b, 1b, wide, tiny), each with ``@dtype``. Writes
table.md, results.json and forward_cost.png into --out.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import textwrap
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import report, shapes
from .options import DTYPES, at_least, int_list

SHOWN = (2, 4, 8, 16, 32, 64)  # the widths the table shows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="embedded",
                   help="comma-separated MODEL[@DTYPE]: embedded, a folder or .gguf, shape:7b|1b|wide|tiny "
                        "(default: embedded)")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="dtype of a model without @DTYPE (default float32)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--contexts", type=int_list(1), default="1024,4096,16384",
                   help="context lengths (default %(default)s)")
    p.add_argument("--widths", type=int_list(1), default="1,2,3,4,6,8,12,16,24,32,48,64",
                   help="the widths timed, from 1 (default %(default)s)")
    p.add_argument("--repeats", type=at_least(1), default=7, help="timings a width (median; default 7)")
    p.add_argument("--no-calibration", action="store_true", help="skip pld's own calibration")
    p.add_argument("--out", default=os.path.join("bench-out", "forward-cost"))


def parse_models(spec: str, dtype: str, option: str = "--models") -> List[Tuple[Optional[str], str, str]]:
    """[(model argument for shapes.load_model, dtype, label)] of ``spec``
    (the value of ``option``): a ValueError naming it for no model, an
    empty name or a dtype not in DTYPES."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, _, d = item.partition("@")
        if not name or (d or dtype) not in DTYPES:
            raise ValueError(f"{option}: expected MODEL[@DTYPE], DTYPE one of {', '.join(DTYPES)}; got {item!r}")
        out.append((None if name == "embedded" else name, d or dtype, item if d else f"{item}@{dtype}"))
    if not out:
        raise ValueError(f"{option}: names no model, got {spec!r}")
    return out


def _ids(n: int, vocab: int, seed: int, period: int = 0) -> Any:
    """[1, n] token ids from a generator of their own (torch's global RNG
    untouched); with ``period``, a random stretch of that length repeated."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if not period:
        return torch.randint(3, vocab - 1, (1, n), generator=gen)
    base = torch.randint(3, vocab - 1, (1, period), generator=gen)
    return base.repeat(1, n // period + 1)[:, :n]


def _prefill(model: Any, keyword: str, ids: Any, chunk: int = 4096) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for start in range(0, ids.shape[1], chunk):
        model(ids[:, start:start + chunk], **{keyword: cache}, use_cache=True, logits_to_keep=1)
    return cache


def curve(model: Any, T: int, widths: List[int], repeats: int, wait: Any,
          clock: Any = time.perf_counter) -> Dict[int, float]:
    """{w: median seconds of a forward over w new tokens after T cached ones}."""
    import torch

    from pld.hf_adapter import model_traits

    traits = model_traits(model)
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    with torch.no_grad():
        cache = _prefill(model, traits.cache_argument, _ids(T, vocab, seed=T).to(device))
        new = _ids(max(widths), vocab, seed=T + 1).to(device)
        keep = {"logits_to_keep": 0} if traits.logits_to_keep else {}  # every position's logits, as a step
        times: Dict[int, List[float]] = {w: [] for w in widths}
        for r in range(repeats + 1):  # round 0 warms up
            shift = r % len(widths)
            for w in widths[shift:] + widths[:shift]:
                wait()
                t0 = clock()
                model(new[:, :w], **{traits.cache_argument: cache}, use_cache=True, **keep)
                wait()
                if r:
                    times[w].append(clock() - t0)
                cache.crop(-w)  # (negative: drop w; every release reads it so)
    del cache
    return {w: statistics.median(ts) for w, ts in times.items()}


@contextlib.contextmanager
def _unsynchronized() -> Iterator[None]:
    """pld's calibration as a clock without synchronisation sees the device
    (what the previous release measured on a GPU)."""
    from pld import forward_cost

    real = forward_cost.synchronizer
    forward_cost.synchronizer = lambda device: None
    try:
        yield
    finally:
        forward_cost.synchronizer = real


#: The widths pld's estimate is read at.
PLD_WIDTHS = (1, 2, 8, 16, 32, 33)


def pld_calibration(model: Any, T: int, synchronized: bool, steps: int = 24) -> Dict[int, float]:
    """The c(w) pld's loop learns (pld.decoder.Decoder.calibrate, token
    trees: widths up to 33) at a context of T tokens: its two probe
    forwards after the prefill, then ``steps`` decoding steps of a prompt
    that repeats itself (each timed forward a sample). {w: c(w)} at
    PLD_WIDTHS, and "samples": how many it learned from. Nothing is kept
    for the model afterwards."""
    import torch

    from pld import forward_cost, loop

    device = next(model.parameters()).device
    ids = _ids(T, model.config.vocab_size, seed=7, period=50).to(device)
    config = loop.resolve_config(model, None, dict(max_new_tokens=steps + 1, draft_tree=True, eos_token_id=None))
    # (unsynchronised from the start: the decoder takes its wait when it is made)
    with contextlib.nullcontext() if synchronized else _unsynchronized():
        adapter, decoder = loop.prepare(model, ids, config)
        forward_cost.forget(model)
        with torch.no_grad(), adapter.kernels():
            while decoder.step():
                pass
        cost = decoder.cost if decoder.cost is not None else decoder.calibrate()
    forward_cost.forget(model)
    return {**{w: cost(w) for w in PLD_WIDTHS}, "samples": len(cost.samples())}


def _one_model(name: Optional[str], dtype: str, label: str, args: argparse.Namespace, device: str) -> Dict[str, Any]:
    import torch

    from pld import forward_cost

    model, _, described = shapes.load_model(name, dtype, device)
    wait = forward_cost.waiter(device)
    widths = sorted({1, *args.widths})
    out: Dict[str, Any] = {"model": described, "dtype": dtype, "contexts": {}}
    for T in _contexts(args):
        seconds = curve(model, T, widths, args.repeats, wait)
        cell: Dict[str, Any] = {"seconds": seconds, "c": {w: s / seconds[1] for w, s in seconds.items()}}
        if not args.no_calibration:
            cell["pld_synchronized"] = pld_calibration(model, T, synchronized=True)
            cell["pld_unsynchronized"] = pld_calibration(model, T, synchronized=False)
        out["contexts"][T] = cell
        print(_row(label, T, cell), flush=True)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    del model
    return out


def _contexts(args: argparse.Namespace) -> List[int]:
    return list(args.contexts)


def _row(label: str, T: int, cell: Dict[str, Any]) -> str:
    c = cell["c"]
    shown = " | ".join(f"{c[w]:.2f}" if w in c else "" for w in SHOWN)
    pld_cells = ""
    if "pld_synchronized" in cell:
        pld_cells = " | " + " | ".join(_pld(cell[k], c) for k in ("pld_synchronized", "pld_unsynchronized"))
    return f"| {label} | {T:,} | {cell['seconds'][1] * 1e3:.2f} | {shown}{pld_cells} |"


def _pld(table: Dict[int, float], measured: Dict[int, float]) -> str:
    """pld's c at its widest calibrated width <= the curve's widest, beside the curve's."""
    common = [w for w in table if isinstance(w, int) and w in measured and w > 1]
    if not common:
        return "-"
    w = max(common)
    return f"c({w}) = {table[w]:.2f} (curve {measured[w]:.2f})"


def run(args: argparse.Namespace) -> int:
    device = shapes.resolve_device(args.device)
    header = ["| model | context | 1-token forward (ms) | " + " | ".join(f"c({w})" for w in SHOWN)
              + ("" if args.no_calibration else " | pld calibration, synchronised | pld calibration, unsynchronised")
              + " |"]
    header.append("|---|--:|--:|" + "--:|" * len(SHOWN) + ("" if args.no_calibration else "---|---|"))
    print("\n".join(header), flush=True)
    results, lines = {}, list(header)
    for name, dtype, label in parse_models(args.models, args.dtype):
        results[label] = _one_model(name, dtype, label, args, device)
        lines += [_row(label, T, cell) for T, cell in results[label]["contexts"].items()]
    caption = (f"{device} ({shapes.describe_device(device)}); {shapes.versions_line()}; "
               f"median of {args.repeats} timed forwards a width, the device synchronised around each")
    text = "\n".join(lines) + f"\n\n{caption}\n"
    report.save(args.out, text, {"device": device, "caption": caption, "results": results})
    plot(results, os.path.join(args.out, "forward_cost.png"), caption)
    return 0


def plot(results: Dict[str, Any], path: str, caption: str) -> None:
    """c(w) against w: a panel a model, a line a context; pld's calibrated
    points (synchronised: dots; unsynchronised: crosses)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (label, res) in zip(axes[0], results.items()):
        for i, (T, cell) in enumerate(res["contexts"].items()):
            color = f"C{i}"
            ws = sorted(int(w) for w in cell["c"])
            ax.plot(ws, [cell["c"][w] for w in ws], color=color, label=f"context {int(T):,}")
            for key, marker in (("pld_synchronized", "o"), ("pld_unsynchronized", "x")):
                table = {w: c for w, c in (cell.get(key) or {}).items() if isinstance(w, int)}
                if table:
                    ax.plot(list(table), list(table.values()), marker, color=color, linestyle="none")
        ax.set_title(f"{label}: {res['model']}", fontsize=9)
        ax.set_xlabel("new tokens in the forward (w)")
        ax.set_ylabel("c(w): time / one-token forward")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="o pld calibration, x without sync", title_fontsize=7)
    fig.suptitle("\n".join(textwrap.wrap(caption, 60 * len(results) + 40)), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
