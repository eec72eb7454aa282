"""argparse types the commands share: a bad number is a usage error at
once, naming the option, not a traceback after the model has loaded."""
from __future__ import annotations

import argparse
from typing import Callable, List

#: the dtypes a model loads in (pld.models.load)
DTYPES = ("float32", "float16", "bfloat16")


def at_least(low: int) -> Callable[[str], int]:
    """An int >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


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
