"""How many draft tokens to verify next: fixed, or adapted to how the last
drafts fared. The output never depends on it (greedy keeps the model's
tokens; sampling stays exact for any deterministic draft); only the cost
per step does.

Why adapt: a verification forward over 1 + k tokens is not free. How much
more it costs than a one-token forward depends on the device and the
matrix-product kernel (little on a GPU; on a CPU anywhere from a little to
about twice and more: see the README's measurements), so a draft pays only
when enough of it is accepted, and a no-draft step is the cheapest step
there is.

The adaptive schedule:

* after a fully accepted draft the length grows by 2 (up to ``k``);
* after a partly accepted draft it shrinks by 1 (down to 1);
* after a draft with nothing accepted it also shrinks by 1, and the next
  ``skip`` steps run without a draft, where ``skip`` doubles with each
  consecutive rejected draft (1, 2, 4, ... up to ``max_skip``) and resets
  when a draft gains a token. Text that stops copying its input costs
  little; text that copies is picked up again within a few tokens.
"""
from __future__ import annotations


class DraftLength:
    """Fixed draft length ``k`` (the default) or, with ``adaptive``, the
    schedule above. Call :meth:`next` before a step and :meth:`update` with
    what the step proposed and accepted."""

    def __init__(self, k: int, adaptive: bool = False, max_skip: int = 8) -> None:
        if k < 1:
            raise ValueError(f"prompt_lookup_num_tokens must be >= 1, got {k}")
        self.k = k
        self.adaptive = adaptive
        self.max_skip = max_skip
        self.length = k
        self._skip = 0
        self._rejected_in_a_row = 0

    def next(self) -> int:
        """Draft tokens to ask for in the coming step (0: no draft)."""
        if self._skip:
            self._skip -= 1
            return 0
        return self.length

    def update(self, proposed: int, accepted: int) -> None:
        if not self.adaptive or proposed == 0:
            return
        # (conditionals, not min/max: this runs every step of every request)
        if accepted == proposed:
            self.length = self.length + 2 if self.length + 2 < self.k else self.k
        elif self.length > 1:
            self.length -= 1
        if accepted == 0:
            skip = 1 << self._rejected_in_a_row if self._rejected_in_a_row < 16 else 1 << 16
            self._skip = skip if skip < self.max_skip else self.max_skip
            self._rejected_in_a_row += 1
        else:
            self._rejected_in_a_row = 0
