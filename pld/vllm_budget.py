"""How many draft tokens each request sends to vLLM in a step.

vLLM verifies every request's draft in one forward over all of them, so a
draft token pays when the tokens it is expected to add are worth the time
it adds to the step. Both sides are learned while the engine serves:

- what a draft token adds: the probability that it is reached (accepted
  with every token before it), from pld's acceptance model
  (pld.token_tree.AcceptanceModel, its prior and its buckets: n-gram size,
  support, depth, origin), updated from what vLLM accepted of each draft;
- what it costs: the step's time as a function of the draft tokens in it,
  c(w) with w = 1 + the draft tokens of the step, in units of a step
  without drafts, per batch-size class (pld.forward_cost.LearnedCost, fed
  with the time between two ``propose`` calls over the same requests; while
  it has timed one width of steps with drafts, the line through c(1) and
  that width). After PLAIN_EVERY steps of a class in a row with drafts,
  one drafts nothing, so that its unit stays current as the contexts grow.
  ``verify_cost`` (a number s) fixes c(w) = 1 + s (w - 1) instead: no
  clock is read, so the drafts depend on the tokens served alone.

The plan takes the draft tokens likeliest to be reached across all
requests (each request's first ones first) while the expected tokens of
the step, ``rows + their summed reach``, per unit of c grow. Reach depends
on the bucket alone, so a plan is a depth per bucket, made by sorting a few
dozen (bucket, depth) groups whatever the batch, and each bucket's depth
worked out when a row first draws on it. It is made again after
REPLAN_EVERY steps that drafted, or had a match while vLLM's answers to
earlier drafts waited to be learned (any other step counts 1/IDLE_STEPS
of one: a plan then would learn only step times), or at once when the
batch-size class changes or a bucket it lacks appears, so a step between
costs a dictionary look-up a request. After EXPLORE_EVERY
steps that drafted nothing though there were candidates, every request
drafts its first token again. The drafts never change vLLM's output;
only the step's cost does.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .acceptance_buckets import DEPTH_EDGES, NGRAM_BUCKETS, ROW, SUPPORT_BUCKETS
from .forward_cost import LearnedCost
from .token_tree import AcceptanceModel
from .width_budget import EXPLORE_EVERY

#: Steps in a row with drafts after which a step of that batch-size class
#: drafts nothing (the unit of its learned cost, t(1), kept current).
PLAIN_EVERY = 64

#: Steps that draft (or have a match and answers to learn) a plan (a depth
#: per bucket) is kept before it is made again with what was learned since...
REPLAN_EVERY = 16
#: ...where IDLE_STEPS other steps count as one: no row had a match (no
#: choice was made), or none drafted and no answer waits (nothing new to
#: learn but step times). At one row of text that nothing matches, or of
#: random ids whose matches never pay, a plan every 256 steps and not 16;
#: an exploration step's answer is learned within REPLAN_EVERY steps.
#: Level with 1 on the fit set's replays, where at one row nearly every
#: match drafts.
IDLE_STEPS = 16

#: Slope of c(w) while a class has no timed step with drafts yet: optimistic,
#: so that its first steps draft and the slope gets measured.
UNMEASURED_SLOPE = 0.02

#: A candidate: (origin, n-gram bucket 1..NGRAM_BUCKETS - 1, support bucket
#: 1..SUPPORT_BUCKETS, tokens in the chain >= 1).
Candidate = Tuple[int, int, int, int]
Group = Tuple[int, int, int]
#: The depths at which a chain enters the next depth bucket.
DEPTH_STARTS = frozenset([1, *(edge + 1 for edge in DEPTH_EDGES)])
NOTHING = (0, 0.0)  # no draft, none predicted


def size_class(rows: int) -> int:
    """1, 2, 3-4, 5-8, ... rows share a learned cost."""
    return max(rows - 1, 0).bit_length()


class StepBudget:
    """The draft lengths of a vLLM step: :meth:`choose` once a ``propose``
    call, before the drafts go out, and :meth:`accepted` with what vLLM
    kept of each."""

    def __init__(self, k: int, verify_cost: Optional[float] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.k = k
        self.model = AcceptanceModel()
        self.fixed = verify_cost
        self.clock = clock
        self.costs: Dict[int, LearnedCost] = {}
        self.since_plain: Dict[int, int] = {}
        self._idle = 0
        self._last: Optional[Tuple[float, int, int]] = None  # (time, size class, width) of the last step
        #: (group, proposed, accepted, predicted) of each draft vLLM answered, learned at
        #: the next plan: appended by :meth:`accepted`, or by pld._core.draft_rows
        self.outcomes: List[Tuple[Group, int, int, float]] = []
        self._timed: Dict[int, List[Tuple[int, float]]] = {}  # size class -> (width, seconds): likewise
        self._plan: Dict[Group, Tuple[int, List[float]]] = {}  # group -> (depth, reach at depths 1..k), on demand
        self._taken: Dict[Group, int] = {}  # the plan's depth for the groups its rows drew on
        self._alone: Tuple[float, List[float]] = (1.0, [1.0])  # (gained, c at depths 0..k) of a row alone
        self._reaches: Dict[Group, List[float]] = {}  # the plan's reach of the groups asked so far
        self._chosen: Dict[Candidate, Tuple[int, float]] = {}  # what the plan gives a candidate
        self._groups = {(ROW, n, s) for n in range(1, NGRAM_BUCKETS) for s in range(1, SUPPORT_BUCKETS + 1)}  # planned
        self._reach: Dict[Group, List[float]] = {}  # group -> unscaled reach, until it learns
        self._stale: set = set()
        self._plan_key = -1
        self._plan_age = REPLAN_EVERY * IDLE_STEPS  # (in 1/IDLE_STEPS of a step that counts whole)

    # ----------------------------------------------------------- the cost

    def cost(self, key: int) -> Callable[[int], float]:
        """c(w) of a step of batch-size class ``key``."""
        if self.fixed is not None:
            s = self.fixed
            return lambda w: 1.0 + s * (w - 1)
        learned = self.costs.get(key)
        widths = learned.wide_widths() if learned is not None else 0
        if widths == 0:
            return lambda w: 1.0 + UNMEASURED_SLOPE * (w - 1)
        if widths == 1:  # (the learned line is flat then): the line through c(1) and that width
            w0 = next(w for w, _ in learned.samples() if w >= 2)
            slope = (learned(w0) - 1.0) / (w0 - 1)
            return lambda w: 1.0 + slope * (w - 1)
        return learned

    # ---------------------------------------------------------- the choice

    def choose(self, candidates: Sequence[Optional[Candidate]], rows: int,
               same_rows: bool = False) -> List[Tuple[int, float]]:
        """(draft length, its predicted accepted tokens) of each candidate
        (None: a row with nothing to draft) for a step of ``rows`` decoding
        rows. Under a learned cost the clock is read: if this step serves
        the same requests as the last (``same_rows``: no arrival, departure
        or prefill since), the time since the last call is a sample of that
        step's cost (learned at the next plan)."""
        learned = self.fixed is None
        if learned:
            now, last = self.clock(), self._last
            if same_rows and last is not None:
                timed = self._timed.get(last[1])
                if timed is None:
                    timed = self._timed[last[1]] = []
                timed.append((last[2], now - last[0]))
        key = (rows - 1).bit_length() if rows else 0  # size_class(rows), inline: this runs every step
        since = self.since_plain.get(key, PLAIN_EVERY)
        if not rows or learned and since >= PLAIN_EVERY:  # a step that measures t(1)
            chosen, drafted, wanted = [NOTHING] * len(candidates), 0, any(candidates)
        else:
            if self._plan_age >= REPLAN_EVERY * IDLE_STEPS or key != self._plan_key:
                self._replan(candidates, rows, key)
            planned = self._planned(candidates)
            if planned is None:  # a bucket the plan lacks
                self._replan(candidates, rows, key)
                planned = self._planned(candidates)
            chosen, drafted, wanted = planned
            if drafted or not wanted:
                self._idle = 0
            else:
                self._idle += 1
                if self._idle >= EXPLORE_EVERY:  # try the drafts judged not to pay again
                    self._idle = 0
                    chosen, drafted = self._first_tokens(candidates)
        self.since_plain[key] = since + 1 if drafted else 0
        self._plan_age += IDLE_STEPS if wanted and (drafted or self.outcomes) else 1
        if learned:  # (the time from this call to the next)
            self._last = (now, key, 1 + drafted) if rows else None
        return chosen

    def _planned(self, candidates: Sequence[Optional[Candidate]]
                 ) -> Optional[Tuple[List[Tuple[int, float]], int, bool]]:
        """(the plan's lengths, their sum, whether any candidate had a
        token), or None if a candidate's bucket is not in the plan."""
        chosen = self._chosen
        out = []
        drafted, wanted = 0, False
        for c in candidates:
            if c is None:
                out.append(NOTHING)
                continue
            got = chosen.get(c)
            if got is None:  # (the plan's choice for this candidate, kept until the next plan)
                planned = self._group_plan(c[:3])
                if planned is None:
                    return None
                d = c[3] if c[3] < planned[0] else planned[0]
                got = chosen[c] = (d, sum(planned[1][:d], 0.0))
            out.append(got)
            drafted += got[0]
            wanted = True
        return out, drafted, wanted

    def _first_tokens(self, candidates: Sequence[Optional[Candidate]]) -> Tuple[List[Tuple[int, float]], int]:
        """Every candidate's first token (exploration), and their count."""
        out = [(1, self._group_plan(c[:3])[1][0]) if c is not None else NOTHING for c in candidates]
        return out, sum(d for d, _ in out)

    def _replan(self, candidates: Sequence[Optional[Candidate]], rows: int, key: int) -> None:
        """Learn what happened since the last plan, then a depth per bucket:
        the rows' first tokens, likeliest first across rows, while
        (rows + reach) / c(1 + tokens) grows; then every bucket at least
        the depth that pays for a row of it in place of an average row of
        that plan (at one row: alone), so that a bucket no row has now, or
        a chain longer than the rows have now, is cut where it pays. A
        bucket's depth is worked out when a row first draws on it
        (:meth:`_group_plan`), from what this plan fixed."""
        self._learn()
        cost = self.cost(key)
        wanting: Dict[Group, List[int]] = {}  # group -> rows whose chain holds >= j + 1 tokens, by j
        for c in candidates:
            if c is not None:
                counts = wanting.get(c[:3])
                if counts is None:
                    counts = wanting[c[:3]] = [0] * self.k
                for j in range(min(c[3], self.k)):
                    counts[j] += 1
        self._groups.update(wanting)
        self._plan, self._chosen, self._reaches = {}, {}, {}
        # (at one row, each bucket's own depth below is what a plan across rows would give it)
        best, self._taken = self._across(wanting, rows, cost) if rows > 1 else ((1.0, 1), {})
        # A row of any bucket in place of an average row of that plan (its
        # chain maybe longer than those seen now): alone, at one row.
        share = 1.0 - 1.0 / rows
        base_gained, base_width = best[0] * share + 1.0, 1 + (best[1] - 1) * share
        self._alone = (base_gained, [cost(base_width + d) for d in range(self.k + 1)])  # (the same for every bucket)
        self._plan_key, self._plan_age = key, 0

    def _across(self, wanting: Dict[Group, List[int]], rows: int, cost: Callable[[int], float]
                ) -> Tuple[Tuple[float, int], Dict[Group, int]]:
        """The rows' first tokens, likeliest first across rows, while
        (rows + reach) / c(1 + tokens) grows: ((rows + reach, width) of the
        best step, the depth it takes of each group)."""
        items = sorted(((self._plan_reach(g)[j], g, j, n) for g, counts in wanting.items()
                        for j, n in enumerate(counts) if n), key=lambda t: -t[0])
        gained, width, best = float(rows), 1, (float(rows), 1)
        best_rate, taken = rows / cost(1), 0
        for i, (reach, _, _, count) in enumerate(items):  # (the rate rises, then falls: stop there)
            gained += reach * count
            width += count
            rate = gained / cost(width)
            if rate <= best_rate:
                break
            best_rate, best, taken = rate, (gained, width), i + 1
        return best, {group: j + 1 for _, group, j, _ in items[:taken]}

    def _group_plan(self, group: Group) -> Optional[Tuple[int, List[float]]]:
        """(depth, reach at depths 1..k) the current plan gives ``group``;
        None if the plan was made without it (a new corpus bucket)."""
        planned = self._plan.get(group)
        if planned is None:
            if group not in self._groups:
                return None
            reach = self._plan_reach(group)
            gained, costs = self._alone
            rate, d = gained / costs[0], 0
            for j, r in enumerate(reach):
                gained += r
                more = gained / costs[j + 1]
                if more <= rate:
                    break
                rate, d = more, j + 1
            taken = self._taken.get(group, 0)
            planned = self._plan[group] = (d if d > taken else taken, reach)
        return planned

    def _plan_reach(self, group: Group) -> List[float]:
        """:meth:`reach` of ``group``, once a plan (the model learns only
        when a plan is made)."""
        reach = self._reaches.get(group)
        if reach is None:
            reach = self._reaches[group] = self.reach(*group)
        return reach

    def _learn(self) -> None:
        """The outcomes and step times gathered since the last plan."""
        chains: Dict[Tuple[Group, int, int], List[float]] = {}  # (group, proposed, accepted) -> [drafts, predicted]
        for group, proposed, accepted, predicted in self.outcomes:
            same = chains.get((group, proposed, accepted))
            if same is None:
                chains[group, proposed, accepted] = [1, predicted]
            else:
                same[0] += 1
                same[1] += predicted
        for (group, proposed, accepted), (count, predicted) in chains.items():
            self.model.observe_chain(group[1], group[2], proposed, accepted, group[0], predicted, int(count))
            self._stale.add(group)
        self.outcomes.clear()
        for key, samples in self._timed.items():
            cost = self.costs.get(key)
            if cost is None:
                cost = self.costs[key] = LearnedCost()
            cost.observe_many(samples)
        self._timed.clear()

    def _unscaled_reach(self, group: Group) -> List[float]:
        """The product of the bucket's rates along a chain, depths 1..k
        (kept until the bucket learns)."""
        reach = self._reach.get(group)
        if reach is None or group in self._stale:
            self._stale.discard(group)
            origin, ngram, support = group
            reach, r, rate = [], 1.0, 0.0
            for depth in range(1, self.k + 1):
                if depth in DEPTH_STARTS:  # (a new depth bucket: its rate)
                    rate = self.model.rate(ngram, support, depth, origin=origin)
                r *= rate
                reach.append(r)
            self._reach[group] = reach
        return reach

    def reach(self, origin: int, ngram: int, support: int) -> List[float]:
        """P(reached) of the draft's tokens at depths 1..k for a chain of
        this bucket (the model's rates along the chain, times its scale)."""
        return self.model.scaled(self._unscaled_reach((origin, ngram, support)))

    # --------------------------------------------------------- the outcome

    def accepted(self, candidate: Candidate, proposed: int, accepted: int, predicted: float) -> None:
        """vLLM kept ``accepted`` of the ``proposed`` tokens of a draft of
        this candidate's bucket, for which :meth:`choose` predicted
        ``predicted`` (learned at the next plan)."""
        self.outcomes.append((candidate[:3], proposed, accepted, predicted))
