"""argparse types the commands share: a bad number is a usage error at
once, naming the option, not a traceback after the model has loaded."""
from __future__ import annotations

import argparse
import math
import os
from typing import Callable, List, Optional

#: the dtypes a model loads in (pld.models.load)
DTYPES = ("float32", "float16", "bfloat16")

#: the most torch threads --threads takes (more is a typo: libgomp aborts, or the int overflows)
MAX_THREADS = max(1024, os.cpu_count() or 1)


def at_least(low: int, high: Optional[int] = None) -> Callable[[str], int]:
    """An int >= ``low`` (and <= ``high`` when given)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"expected an integer {bound}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


#: --threads: torch CPU threads, 0 for torch's default
threads = at_least(0, MAX_THREADS)


def positive_float(text: str) -> float:
    """A finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def env_int(name: str, default: int) -> int:
    """The integer in environment variable ``name`` (the notebooks' small
    runs), ``default`` where it is unset; a ValueError naming the variable."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {text!r}") from None


def probability(text: str) -> float:
    """A number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text!r}")
    return value


def int_list(low: int) -> Callable[[str], List[int]]:
    """A comma-separated non-empty list of ints, each >= ``low``."""
    one = at_least(low)

    def parse(text: str) -> List[int]:
        values = [one(part.strip()) for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}")
        return values
    parse.__name__ = f"list of integers >= {low}"
    return parse


def out_folder_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be an output folder, or None: it must be a
    folder, or not exist yet with its nearest existing ancestor a writable
    folder (where the command makes it). Nothing is made here."""
    if not path or "\0" in path:
        return f"expected a folder path, got {path!r}"
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{path!r} exists and is not a folder"
    above = os.path.abspath(path)
    while not os.path.lexists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        return f"{path!r} cannot be made: {above!r} is not a folder"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"{path!r} cannot be written: {above!r} is not writable"
    return None


def device_problem(name: str) -> Optional[str]:
    """Why ``name`` (--device) names no device this machine has, or None:
    "auto", or a torch device ("cpu", "cuda", "cuda:1") this machine has."""
    if name == "auto":
        return None
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        return f"expected auto, cpu, cuda or cuda:N, got {name!r}"
    if device.type == "cpu":
        return None
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu
    if not (hasattr(backend, "is_available") and backend.is_available()):
        return f"{name!r}: this machine has no {device.type} device"
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if device.index is not None and device.index >= count:
        return f"{name!r}: this machine has {count} {device.type} device(s)"
    return None
