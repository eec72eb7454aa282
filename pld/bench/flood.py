"""Hash flooding: the cost of extending an index with ids crafted to collide.

An index files n-grams in open-addressing tables whose home slot comes from
a hash of the tokens. Whoever knows the hash can pick ids that all land in
one home slot, and each new one then probes past all the others: extend
turns quadratic. pld keys the hash per index (``NgramIndex(seed=None)``
draws a random key), so ids crafted for one key are ordinary ids for
another.

The crafted ids here are built for key 0 (the key ``seed=0`` gives, and the
only hash of builds before the key): ids >= 2^20 (past the direct array of
small unigram ids) whose unigram tags under key 0 share their low 16 bits.
For each policy the benchmark times ``extend`` of --count of them and of
--count random ids >= 2^20, alternating, --repeats times (median), on

  keyed (random)   NgramIndex(..., seed=None): the default
  key 0            NgramIndex(..., seed=0): the key the ids were made for
  compared build   another build's NgramIndex (--compare-build), if given

and prints the table (time per id, crafted / random). Writes table.md and
results.json into --out.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from ..config import POLICIES
from .lookup import load_build, machine_info, versions
from .options import at_least

#: how many distinct ids crafted_ids makes (the 2^16 - 1 tags with zero
#: low bits, less those whose id is below 2^20)
MAX_CRAFTED = 65522


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--count", type=at_least(1, MAX_CRAFTED), default=40000,
                   help=f"ids per extend (default 40000, at most {MAX_CRAFTED}: the distinct ids that "
                   "can be crafted)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed extends per cell, crafted and random alternating (default 5)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="comma-separated policies (default: all three)")
    p.add_argument("--compare-build", metavar="SO", default=None,
                   help="path of another build of the extension (pld/_core*.so): its "
                   "NgramIndex runs the same extends (a build before the keyed hash "
                   "shows the quadratic case)")
    p.add_argument("--out", default=os.path.join("bench-out", "flood"),
                   help="output directory (default bench-out/flood)")


def _unmix32(tag: int) -> int:
    """The id in [0, 2^32) whose key-0 unigram tag is `tag` (the inverse of
    the 32-bit mix in csrc/pld_index.c; callers check the result against
    pld._core._ngram_tag, so a changed mix fails loudly)."""
    m = 2**32
    x = tag ^ (tag >> 16)
    x = (x * pow(0x846CA68B, -1, m)) % m
    x ^= (x >> 15) ^ (x >> 30)
    x = (x * pow(0x7FEB352D, -1, m)) % m
    return x ^ (x >> 16)


def crafted_ids(count: int) -> List[int]:
    """`count` distinct ids >= 2^20 whose key-0 unigram tags share their low
    16 bits: under key 0 they all have one home slot in a table of up to
    2^16 homes, and two in the next size up. At most MAX_CRAFTED (a
    ValueError naming --count beyond)."""
    from .. import _core

    if count > MAX_CRAFTED:
        raise ValueError(f"--count: at most {MAX_CRAFTED} distinct ids can be crafted, got {count}")
    out, r = [], 1
    while len(out) < count:
        x = _unmix32((r << 16) & 0xFFFFFFFF)
        r += 1
        if x >= 1 << 20:
            out.append(x)
    for x in out[:: max(1, count // 64)]:  # the mix is the one this build files under
        if _core._ngram_tag([x], 0) & 0xFFFF != 0:
            raise RuntimeError("crafted_ids: the index's key-0 unigram tag has changed")
    return out


def random_ids(count: int, seed: int = 0) -> List[int]:
    return np.random.default_rng(seed).integers(1 << 20, 1 << 32, count).tolist()


def _time_extend(make: Callable[[], object], ids: List[int]) -> float:
    """Seconds for one extend of ids into a fresh index (built untimed)."""
    ix = make()
    t0 = time.perf_counter()
    ix.extend(ids)
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    """`python -m pld bench flood`: time, print and write the table. Returns
    0, or 2 (after a message) on bad --count, --repeats or --policies."""
    policies = _policies(args)
    if policies is None:
        return 2
    compared = load_build(args.compare_build) if args.compare_build else None
    crafted, rand = crafted_ids(args.count), random_ids(args.count)
    makers = _makers(compared)
    m, v = machine_info(), versions()
    print(f"machine: {m['cpu']}, {m['cores']} cores; "
          + ", ".join(f"{k} {v[k]}" for k in ("python", "numpy", "pld")))
    print(f"extend of {args.count:,} ids, median of {args.repeats}; crafted ids share "
          "their key-0 unigram home")
    results = _time_cells(policies, makers, crafted, rand, args.repeats)
    _write_report(args, results, m, v)
    return 0


def _policies(args: argparse.Namespace) -> Optional[List[str]]:
    """The --policies to run, or None after printing why the options are
    refused (--count or --repeats < 1, no policy or an unknown one)."""
    if args.count < 1 or args.repeats < 1:
        print("--count and --repeats must be >= 1")
        return None
    policies = [p for p in args.policies.replace(" ", "").split(",") if p]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        print(f"--policies: unknown {bad or args.policies!r}; choose from {POLICIES}")
        return None
    return policies


def _makers(compared: Optional[object]) -> Dict[str, Callable[[str], Callable[[], object]]]:
    """{index label: policy -> factory of a fresh empty index}: pld's keyed
    (random key) and key-0 indexes, and the compared build's if given."""
    import pld

    makers: Dict[str, Callable[[str], Callable[[], object]]] = {
        "keyed (random)": lambda pol: (lambda: pld.NgramIndex(3, 1, pol)),
        "key 0": lambda pol: (lambda: pld.NgramIndex(3, 1, pol, seed=0)),
    }
    if compared is not None:
        makers["compared build"] = lambda pol: (lambda: compared.NgramIndex(3, 1, pol))
    return makers


def _time_cells(policies: List[str], makers: Dict[str, Callable[[str], Callable[[], object]]],
                crafted: List[int], rand: List[int], repeats: int) -> Dict[str, Dict[str, Dict[str, float]]]:
    """{policy: {index label: {"random", "crafted": median us per id,
    "ratio": crafted / random}}}, `repeats` extends of each kind
    alternating (random first), gc off; prints each cell as it is done.
    crafted and rand have the same length."""
    count = len(crafted)
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for pol in policies:
            for name, maker in makers.items():
                make = maker(pol)
                times: Dict[str, List[float]] = {"crafted": [], "random": []}
                for _ in range(repeats):  # alternating
                    times["random"].append(_time_extend(make, rand))
                    times["crafted"].append(_time_extend(make, crafted))
                cell = {kind: statistics.median(ts) / count * 1e6
                        for kind, ts in times.items()}
                cell["ratio"] = cell["crafted"] / cell["random"]
                results.setdefault(pol, {})[name] = cell
                print(f"  {pol:8s} {name:15s} random {cell['random']:.3f} us/id, crafted "
                      f"{cell['crafted']:.3f} us/id: {cell['ratio']:.2f}x", flush=True)
    finally:
        if gc_was:
            gc.enable()
    return results


def _write_report(args: argparse.Namespace, results: Dict[str, Dict[str, Dict[str, float]]],
                  m: Dict, v: Dict) -> None:
    """Print the table and the verdict (crafted within 5x of random under
    the random key), and write them to OUT/table.md, with the raw numbers
    in OUT/results.json. m, v: machine_info() and versions()."""
    rows = ["| policy | index | random ids (us/id) | crafted ids (us/id) | crafted / random |",
            "|---|---|---:|---:|---:|"]
    for pol, cells in results.items():
        for name, c in cells.items():
            rows.append(f"| {pol} | {name} | {c['random']:.3f} | {c['crafted']:.3f} | "
                        f"{c['ratio']:.2f}x |")
    table = "\n".join(rows)
    keyed = [c["keyed (random)"]["ratio"] for c in results.values()]
    verdict = (f"criterion: crafted within 5x of random ids under the default (random) key: "
               f"max {max(keyed):.2f}x -> {'PASS' if max(keyed) <= 5 else 'FAIL'}")
    print("\n" + table + "\n\n" + verdict)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(f"machine: {m['cpu']}, {m['cores']} cores; versions: {v}\n\n{table}\n\n{verdict}\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": m, "versions": v, "count": args.count,
                   "repeats": args.repeats, "results": results}, f, indent=1)
