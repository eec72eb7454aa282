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
            raise ValueError(f"num_pred_tokens must be >= 1, got {k}")
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
        if accepted == proposed:
            self.length = min(self.k, self.length + 2)
        else:
            self.length = max(1, self.length - 1)
        if accepted == 0:
            self._skip = min(self.max_skip, 1 << min(self._rejected_in_a_row, 16))
            self._rejected_in_a_row += 1
        else:
            self._rejected_in_a_row = 0


class CostGate:
    """Verify a draft only where drafts pay for their verification.

    A drafted step costs ``r`` plain steps (``r`` = time of a forward over
    the pending tokens plus the draft, over the time of a one-token forward)
    and gains ``1 + a`` tokens for ``a`` accepted draft tokens, so it beats a
    plain step when ``a > r - 1``. The gate learns both online: ``r`` from
    the forward times of drafted and plain steps (moving averages), and the
    mean ``a`` for each n-gram size of the match behind a draft (longer
    matches are accepted more often), as a running mean that starts from a
    prior worth ``prior_weight`` drafts. A draft whose match size does not
    pay is dropped, so the step runs without one. Where ``r`` is close to 1
    (a GPU) every draft passes; the larger ``r`` (a CPU, depending on its
    matrix-product kernel), the longer the matches whose drafts pass. A closed
    size is let through every ``explore`` drafts so it can reopen when the
    text starts copying. The output never depends on the gate.

    The default priors (mean accepted tokens 0.6, 1.4 and 3.2 for 1-, 2- and
    3-gram matches, 3.2 beyond) are what the embedded model accepted (k =
    10, every draft verified, 128 new tokens) on Spec-Bench prompts 41-80
    of summarization and rag: 1,996, 881 and 554 drafts gave 0.62, 1.41
    and 3.17 tokens. The benchmark's reported runs use the first 20.
    """

    PRIOR_GAIN = (0.0, 0.6, 1.4, 3.2)

    def __init__(self, max_ngram_size: int, prior_weight: float = 8.0, explore: int = 12,
                 prior_ratio: float = 1.4, alpha: float = 0.15) -> None:
        sizes = max_ngram_size + 1
        prior = [self.PRIOR_GAIN[min(n, len(self.PRIOR_GAIN) - 1)] for n in range(sizes)]
        self.explore = explore
        self.prior_ratio = prior_ratio
        self.alpha = alpha
        self._sum = [p * prior_weight for p in prior]
        self._count = [prior_weight] * sizes
        self._closed = [0] * sizes
        self.plain_seconds: float = 0.0
        self.draft_seconds: float = 0.0

    def gain(self, ngram: int) -> float:
        """Estimated mean accepted tokens of a draft from an ``ngram`` match."""
        return self._sum[ngram] / self._count[ngram]

    @property
    def ratio(self) -> float:
        """Measured cost of a drafted forward in plain forwards (the prior
        until both kinds of step have been timed)."""
        if self.plain_seconds > 0 and self.draft_seconds > 0:
            return self.draft_seconds / self.plain_seconds
        return self.prior_ratio

    def allow(self, ngram: int) -> bool:
        """Whether to verify a draft that came from an ``ngram``-token match."""
        if self.gain(ngram) > self.ratio - 1:
            self._closed[ngram] = 0
            return True
        self._closed[ngram] += 1
        if self._closed[ngram] >= self.explore:
            self._closed[ngram] = 0
            return True
        return False

    def update(self, ngram: int, proposed: int, accepted: int, seconds: float) -> None:
        """After a step: the match size behind its draft (0: none), the draft
        length, the tokens accepted and the forward time."""
        a = self.alpha
        if proposed:
            self._sum[ngram] += accepted
            self._count[ngram] += 1
            self.draft_seconds = seconds if not self.draft_seconds else \
                self.draft_seconds + a * (seconds - self.draft_seconds)
        else:
            self.plain_seconds = seconds if not self.plain_seconds else \
                self.plain_seconds + a * (seconds - self.plain_seconds)
