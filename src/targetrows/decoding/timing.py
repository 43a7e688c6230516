"""A round's part times (drafting, the root pass) without making a GPU's host wait for them.

A CUDA backend queues its work and returns at once, so a host clock read after a draft's passes
measures their launches, not their run. Waiting for the device before reading the clock
(`synchronize`) measures the run, but each wait drains the queue, and the GPU idles while
Python plans the next pass: a timer must not cost what it measures. So on one GPU a part is
bracketed by timing events queued on the stream that runs it (`stamp`), and its seconds are
read at the round's end (`Timings.settle`), after the round's last read has waited for the
device anyway. Elsewhere (the CPU, the toy, models on different devices, whose events share no
clock) a stamp is the host clock, read once the models' queued work is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .model import synchronize


def stamp(*models: Any) -> Any:
    """The point in time at which the work queued so far on `models` is done: a timing event
    queued on their device's current stream, where they share one GPU (the backend's
    ``timing_event``), else the host clock once they are done."""
    models = tuple(m for m in models if m is not None)
    if not models:
        return time.perf_counter()
    devices = {str(getattr(m, "device", None)) for m in models}
    make = getattr(models[0], "timing_event", None) if len(devices) == 1 else None
    event = make() if make is not None else None
    if event is not None:
        return event
    for model in models:
        synchronize(model)
    return time.perf_counter()


def seconds_between(start: Any, end: Any) -> float:
    """Seconds from one `stamp` to a later one (of the same models)."""
    if isinstance(start, float):
        return end - start
    if not end.query():  # the round's reads have waited for it, so this is rare
        end.synchronize()
    return start.elapsed_time(end) / 1e3


@dataclass
class Timings:
    """A round's part times still on the device: (the `RoundStats` fields each adds to, start,
    end), settled into the statistics once the round's last read is done."""

    spans: list[tuple[tuple[str, ...], Any, Any]] = field(default_factory=list)

    def add(self, fields: tuple[str, ...], start: Any, end: Any) -> None:
        self.spans.append((fields, start, end))

    def settle(self, stats: Any) -> None:
        """Add each span's seconds to its fields of `stats` (once)."""
        spans, self.spans = self.spans, []
        for fields, start, end in spans:
            seconds = seconds_between(start, end)
            for name in fields:
                setattr(stats, name, getattr(stats, name) + seconds)
