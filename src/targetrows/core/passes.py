"""Model passes as requests: how one sequence's decoding asks for passes without running them.

Everything that needs a model pass (a round's planner, pool expansion, a model's own `logits`)
is written as a generator that ``yield``s a `Pass` where it needs one and receives the pass's
result back (``result = yield Pass(group, item)``); callers chain them with ``yield from``. So
the code of a round reads top to bottom as one sequence's story, while whoever drives the
generator decides how its passes run:

- alone: `run_now` runs each pass as a batch of one, for a caller that wants a plain function;
- in a batch: the scheduler (`targetrows.decoding.batch`) drives many sequences' generators
  in one thread, and runs the waiting passes of one group (one model's) as one batched pass.

A sequence's state is then data (its generator and what it holds), not a thread's call stack,
and batch 1 is the same code as batch N.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# what a generator that may ask for passes is: it yields Pass requests, is sent their results
Passes = Generator["Pass", Any, T]


@dataclass(frozen=True)
class Pass:
    """A request for one model pass. `group` is what runs it, batched with other sequences'
    requests to the same group (``group.run_batch(items) -> results``, one per item, in order;
    an item the pass could not serve gets an exception in its place, its neighbours their
    results);
    `item` is what this sequence hands over. `side`: queue it on the group's side stream (a
    root pass beside drafting: ``group.side_stream()``)."""

    group: Any
    item: Any
    side: bool = False


def run_now(steps: Passes[T]) -> T:
    """What `steps` returns, each pass it asks for run at once as a batch of one (a pass that
    fails its item, handing back an exception in its place, raises it in `steps`)."""
    try:
        request = next(steps)
        while True:
            result = request.group.run_batch([request.item])[0]
            request = (steps.throw(result) if isinstance(result, Exception)
                       else steps.send(result))
    except StopIteration as done:
        return done.value


def no_passes(value: T) -> Passes[T]:
    """A generator that asks for nothing and returns `value`: what a step that needs no pass
    this time hands to a caller that chains steps with ``yield from``."""
    return value
    yield  # unreachable: makes this function a generator
