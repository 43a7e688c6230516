"""Batched decoding: one scheduler, in one thread, drives every sequence's rounds as data.

Why this shape. A round is a planner's own sequence of model calls (the draft's levels, a root
pass, the verify pass), and what it asks next depends on the rows it read. Every planner is
written once, as steps that ask for their passes (`targetrows.core.passes`): a sequence is a
generator that yields a `Pass` where it needs one. The scheduler holds one such generator per
sequence of the batch (its state: what it committed, its round, its pending pass) and, while
any is live, runs the waiting passes of one group (one model's lanes) as one batched pass and
hands each sequence its result. Sequences are seldom far apart (every round drafts, then
verifies), so the groups are the batch; a sequence whose round is shorter (a pruned pool, a
stop token) joins the next group of its kind. The root pass beside drafting is a pass like any
other, queued on the target's side stream (`targetrows.decoding.round.on_side_stream`), so
overlap needs no thread either. Batch 1 is the same code with one sequence (`generate`).

Which pass runs next is a function of the sequences' requests alone: the largest group, ties
to the group whose first request comes from the lowest lane. The same command runs the same
passes in the same order every time.

Reproducible batches. Jobs are taken in fixed **segments** of `SEGMENT_BATCHES` x
`batch_size` consecutive jobs (prompt order). Within a segment a finished sequence's lane takes
the segment's next job at once; the next segment starts when all of this one's sequences are
done. With the deterministic schedule, a sequence's companions are then fixed by the job list
and the batch size, so a run resumed at a segment's first job batches exactly as an
uninterrupted one (`needed`: `targetrows.jobs.decode` resumes so) and writes the same tokens
in every dtype. The cost: at a segment's end, lanes idle until its last sequence finishes.

Lossless per sequence. A lane's rows equal its batch-1 model's to the rounding of a batched
product (`targetrows.hf.lanes`), its draws come from its own generator, seeded from its own
config, and verification is the loop's own: a sequence's tokens do not depend on which
sequences share its batch (the tests find them equal in float64 at batch 1, 3 and 8). In
bfloat16 the batch's shape decides how a batched product rounds, and a near-tie can go the
other way, as a tree pass can at batch 1.

A model decodes in batches through ``model.lanes(n, target_lanes)`` (a draft's lanes may need
its target's: an EAGLE-3 head reads its target lane's features).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from targetrows.core.passes import Pass, Passes

from .model import side_stream


@dataclass
class BatchStats:
    """What the scheduler ran: batched passes, the sequences' passes they held, and the order
    of the passes (each: its group's kind and how many sequences shared it)."""

    passes: int = 0
    requests: int = 0
    schedule: list[tuple[str, int]] = field(default_factory=list)

    @property
    def mean_batch(self) -> float:
        return self.requests / self.passes if self.passes else 0.0


@dataclass
class _Sequence:
    """One sequence of a batch: its job's index, the lane it runs on, its steps, and the pass
    it waits for (None once done)."""

    job: int
    lane: int
    steps: Passes
    request: Pass | None = None


# job(target, draft) -> the steps of one job (one or more sequences decoded one after another)
Job = Callable[[Any, Any], Passes]

# batches of jobs per segment: a resumed run redoes at most this many batches' worth of jobs,
# and lanes idle at most once per segment
SEGMENT_BATCHES = 4


def run_batched(target: Any, draft: Any | None, jobs: Sequence[Job], batch_size: int,
                stats: BatchStats | None = None,
                on_done: Callable[[int, Any], None] | None = None,
                needed: Sequence[bool] | None = None,
                on_failed: Callable[[int, Exception], None] | None = None) -> list[Any]:
    """Each job's result, in order (None for a job not run): the steps ``job(target, draft)``
    of every job, `batch_size` at a time on lanes of the models (at batch size 1, on the models
    themselves), segment by segment (see the module docstring). `needed[j]` False: job j's
    result is known already, and a segment none of whose jobs is needed is skipped (a resumed
    run; a segment with one needed job runs whole, so that it batches as it did). `on_done(j,
    result)` is called as job j finishes (what a caller writes as it goes).

    A job that fails fails alone: `on_failed(j, error)` is called, its neighbours in the same
    passes and every later job run on, and once all are done the first failure (in job order)
    is raised, with a note saying how many failed. An interrupt (Ctrl-C), wherever it is
    raised, stops at once: what `on_done` was handed so far is all there is."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if needed is not None and len(needed) != len(jobs):
        raise ValueError(f"{len(jobs)} jobs but {len(needed)} needed flags")
    n = max(min(batch_size, len(jobs)), 1)
    if n == 1:
        lanes = [(target, draft)]
    else:
        t_lanes = model_lanes(target, n)
        d_lanes = [None] * n if draft is None else model_lanes(draft, n, t_lanes)
        lanes = list(zip(t_lanes, d_lanes, strict=True))
    stats = BatchStats() if stats is None else stats
    results: list[Any] = [None] * len(jobs)
    errors: dict[int, Exception] = {}
    span = n * SEGMENT_BATCHES if n > 1 else 1  # alone, a job has no companions to keep
    ran = 0
    for first in range(0, len(jobs), span):
        segment = range(first, min(first + span, len(jobs)))
        if needed is not None and not any(needed[j] for j in segment):
            continue
        ran += len(segment)
        _run_segment(jobs, iter(segment), lanes, results, errors, (on_done, on_failed), stats)
    if errors:
        first_error = errors[min(errors)]
        if ran > 1:
            first_error.add_note(f"{len(errors)} of {ran} jobs failed (job {min(errors)}'s error "
                                 "above, the first); the others finished")
        raise first_error
    return results


def _run_segment(jobs, queue, lanes, results: list, errors: dict, callbacks, stats) -> None:
    """Drive the segment's jobs (`queue`, in order) on `lanes` until every one is done: a lane
    whose sequence finishes, or fails, takes the next job at once."""
    batch = [_Sequence(-1, lane, iter(())) for lane in range(len(lanes))]
    joined: dict[int, Any] = {}  # side streams with passes queued, by id(group)

    def start(seq: _Sequence) -> None:  # the lane's next job, until it asks for a pass
        while seq.request is None and (j := next(queue, None)) is not None:
            seq.job, seq.steps = j, jobs[j](*lanes[seq.lane])
            _advance(seq, None, None, results, errors, callbacks)

    for seq in batch:
        start(seq)
    while live := [s for s in batch if s.request is not None]:
        group, side, waiting = _next_group(live)
        if side:
            stream = side_stream(group)
            joined[id(group)] = stream
        else:  # the group's side passes are done before its next pass here touches its cache
            stream = joined.pop(id(group), None)
            if stream is not None:
                stream.join()
        try:
            if side:
                with stream:
                    outputs = group.run_batch([s.request.item for s in waiting])
            else:
                outputs = group.run_batch([s.request.item for s in waiting])
            error = None
        except Exception as err:  # every sequence in the pass gets the error
            outputs, error = [None] * len(waiting), err
        stats.passes += 1
        stats.requests += len(waiting)
        label = getattr(group, "label", type(group).__name__)
        stats.schedule.append((label + (" side" if side else ""), len(waiting)))
        for seq, out in zip(waiting, outputs, strict=True):
            failed = out if isinstance(out, Exception) else error  # its own, or the pass's
            _advance(seq, None if failed else out, failed, results, errors, callbacks)
            start(seq)


def _next_group(live: list[_Sequence]) -> tuple[Any, bool, list[_Sequence]]:
    """The group whose pass runs next and its waiting sequences: the most sequences waiting,
    ties to the group asked for by the lowest lane (`live` is in lane order)."""
    groups: dict[tuple[int, bool], tuple[Any, list[_Sequence]]] = {}
    for seq in live:
        key = (id(seq.request.group), seq.request.side)
        groups.setdefault(key, (seq.request.group, []))[1].append(seq)
    (_, side), (group, waiting) = max(groups.items(), key=lambda kv: len(kv[1][1]))
    return group, side, waiting


def _advance(seq: _Sequence, value: Any, error: Exception | None, results: list,
             errors: dict, callbacks) -> None:
    """Hand `seq` its pass's result (or error) and take its next request, or its result (or
    its failure: `callbacks` are (on_done, on_failed)). Only errors fail a job: an interrupt
    raised in its steps goes on up, and stops the whole call."""
    on_done, on_failed = callbacks
    try:
        seq.request = seq.steps.send(value) if error is None else seq.steps.throw(error)
    except StopIteration as done:
        seq.request = None
        results[seq.job] = done.value
        if on_done is not None:
            on_done(seq.job, done.value)
    except Exception as err:
        seq.request = None
        errors[seq.job] = err
        if on_failed is not None:
            on_failed(seq.job, err)


def model_lanes(model: Any, n: int, target_lanes=None) -> list[Any]:
    """`n` lanes of `model` (`model.lanes`); a model without lanes cannot decode in batches,
    and the error says so."""
    make = getattr(model, "lanes", None)
    if make is None:
        raise ValueError(f"{getattr(model, 'name', type(model).__name__)}: this backend cannot "
                         "decode in batches; use --batch-size 1")
    return make(n, target_lanes)
