"""Batched decoding: many sequences at once, each run by the one round loop, their model passes
gathered into batched passes.

Why this shape. A round is a planner's own sequence of model calls (the draft's levels, a root
pass, the verify pass), and what it asks next depends on the rows it read. Writing every planner
again over a batch would be a second loop beside the first. Instead each sequence runs
`targetrows.decoding.loop.generate` as it is, in a thread of its own, on a **lane** of each
model: a per-sequence view with its own cache, random generator and pending checks, which hands
its passes to a `PassBatcher` instead of running them. When every live sequence is waiting on a
pass, the batcher runs the largest group of waiting passes of one model as one batched pass
(the target's verify passes of the whole batch, or the draft's level passes) and wakes their
sequences. Sequences are seldom far apart (every round drafts, then verifies), so the groups are
the batch; a sequence whose round is shorter (a pruned pool, a stop token) simply joins the next
group. A finished sequence leaves the batch at once and the next prompt takes its lane.

Lossless per sequence. A lane's rows equal its batch-1 model's to the rounding of a batched
product (`targetrows.hf.lanes`), its draws come from its own generator, seeded from its own
config, and verification is the loop's own: a sequence's tokens do not depend on which
sequences share its batch (the tests find them equal in float64 at batch 1, 3 and 8). In
bfloat16 the batch's shape decides how a batched product rounds, and a near-tie can go the
other way, as a tree pass can at batch 1.

A model decodes in batches through ``model.lanes(n, batcher, target_lanes)`` (a draft's lanes
may need its target's: an EAGLE-3 head reads its target lane's features); at batch size 1 the
models run as they are, through the same `generate`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .config import DecodeConfig
from .loop import DecodeResult, generate


@dataclass
class _Request:
    item: Any
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass
class BatchStats:
    """What the batcher ran: batched passes, and the sequences' passes they held."""

    passes: int = 0
    requests: int = 0

    @property
    def mean_batch(self) -> float:
        return self.requests / self.passes if self.passes else 0.0


class PassBatcher:
    """Gathers the passes of the sequences decoding together and runs them in batches.

    A lane calls `submit(group, item)` and waits for its answer. `group` is the object that can
    run many lanes' passes of one model at once (``group.run_batch(items) -> results``, one
    result per item, in order). When every live worker (`join`) is waiting, the waiting
    thread that sees it first runs the largest group (ties: the group that waited longest) and
    hands each item its result, or the pass's exception."""

    def __init__(self):
        self._cond = threading.Condition()
        self._live = 0  # worker threads decoding a sequence
        self._waiting: dict[int, tuple[Any, list[_Request]]] = {}  # by id(group), oldest first
        self._n_waiting = 0
        self._running = False
        self.stats = BatchStats()

    def join(self, n: int = 1) -> None:
        """`n` more workers: threads that each decode sequences. Passes run only when every
        worker is waiting on one (or has left), so all of a batch's workers join before any
        starts (else the first would run its passes alone while the others start)."""
        with self._cond:
            self._live += n

    def leave(self) -> None:
        """A worker is done: the others may all be waiting now."""
        with self._cond:
            self._live -= 1
            self._cond.notify_all()

    def submit(self, group: Any, item: Any) -> Any:
        """`item`'s result from the next batched pass of `group` (the caller waits for it);
        the pass's exception, if it failed."""
        request = _Request(item)
        cond = self._cond
        with cond:
            self._waiting.setdefault(id(group), (group, []))[1].append(request)
            self._n_waiting += 1
            while not request.done:
                if self._running or self._n_waiting < self._live:
                    cond.wait()
                    continue
                group_now, requests = self._take()
                self._running = True
                cond.release()  # the pass runs without the lock: lanes may read their state
                try:
                    results, error = group_now.run_batch([r.item for r in requests]), None
                except BaseException as err:  # every sequence in the pass gets the error
                    results, error = [None] * len(requests), err
                finally:
                    cond.acquire()
                    self._running = False
                for r, out in zip(requests, results, strict=True):
                    r.result, r.error, r.done = out, error, True
                self._n_waiting -= len(requests)
                self.stats.passes += 1
                self.stats.requests += len(requests)
                cond.notify_all()
        if request.error is not None:
            raise request.error
        return request.result

    def _take(self) -> tuple[Any, list[_Request]]:
        key = max(self._waiting, key=lambda k: len(self._waiting[k][1]))  # first of the largest
        return self._waiting.pop(key)



def model_lanes(model: Any, n: int, batcher: PassBatcher, target_lanes=None) -> list[Any]:
    """`n` lanes of `model` (`model.lanes`), sharing `batcher`; a model without lanes cannot
    decode in batches, and the error says so."""
    make = getattr(model, "lanes", None)
    if make is None:
        raise ValueError(f"{getattr(model, 'name', type(model).__name__)}: this backend cannot "
                         "decode in batches; use --batch-size 1")
    return make(n, batcher, target_lanes)


def run_batched(target: Any, draft: Any | None, jobs: Sequence[Callable[[Any, Any], Any]],
                batch_size: int, stats: BatchStats | None = None,
                on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Each job's result, in order: ``job(target, draft)`` for every job, `batch_size` at a time,
    each on its own lanes of the models (at batch size 1, on the models themselves). A lane
    takes the next job as soon as its job is done; `on_done(j, result)` is called as job j
    finishes (one call at a time: what a caller writes as it goes). The first job to fail (in
    job order) raises after the running ones have finished; no job starts after a failure."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    n = min(batch_size, len(jobs))
    if n <= 1:
        results = []
        for j, job in enumerate(jobs):
            results.append(job(target, draft))
            if on_done is not None:
                on_done(j, results[-1])
        return results
    batcher = PassBatcher()
    t_lanes = model_lanes(target, n, batcher)
    d_lanes = [None] * n if draft is None else model_lanes(draft, n, batcher, t_lanes)
    results: list[Any] = [None] * len(jobs)
    errors: dict[int, BaseException] = {}
    lock = threading.Lock()
    next_job = iter(range(len(jobs)))

    def take() -> int | None:
        with lock:
            return None if errors else next(next_job, None)

    def lane(i: int) -> None:
        try:
            while (j := take()) is not None:
                try:
                    results[j] = jobs[j](t_lanes[i], d_lanes[i])
                    if on_done is not None:
                        with lock:
                            on_done(j, results[j])
                except BaseException as err:
                    with lock:
                        errors[j] = err
                    return
        finally:
            batcher.leave()

    threads = [threading.Thread(target=lane, args=(i,), name=f"lane-{i}") for i in range(n)]
    batcher.join(n)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if stats is not None:
        stats.passes += batcher.stats.passes
        stats.requests += batcher.stats.requests
    if errors:
        raise errors[min(errors)]
    return results


def generate_batch(target: Any, draft: Any | None, prompts: Sequence[Sequence[int]],
                   configs: DecodeConfig | Sequence[DecodeConfig], batch_size: int,
                   stats: BatchStats | None = None) -> list[DecodeResult]:
    """`generate` for every prompt (one config for all, or one per prompt: each its own seed),
    `batch_size` sequences at a time; each result as its batch-1 `generate` gives it. A
    draft-free decoder that keeps what it learned across prompts depends on their order, so it
    runs at batch size 1 only."""
    if isinstance(configs, DecodeConfig):
        configs = [configs] * len(prompts)
    if len(configs) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(configs)} configs")
    check_batchable(configs, batch_size)
    jobs = [_job(p, c) for p, c in zip(prompts, configs, strict=True)]
    return run_batched(target, draft, jobs, batch_size, stats)


def check_batchable(configs: Sequence[DecodeConfig], batch_size: int) -> None:
    """Refuse what a batch cannot reproduce: a draft-free state carried from prompt to prompt
    (`DecodeConfig.keep_across_prompts`) learns in prompt order, which a batch does not keep."""
    if batch_size > 1 and any(c.keep_across_prompts and c.decoder.new_state for c in configs):
        raise ValueError("keep_across_prompts carries a draft-free decoder's state from prompt "
                         "to prompt in order, which a batch does not keep: use batch size 1")


def _job(prompt: Sequence[int], config: DecodeConfig) -> Callable[[Any, Any], DecodeResult]:
    def job(target, draft):
        return generate(target, draft if config.decoder.needs_draft else None, prompt, config)
    return job
