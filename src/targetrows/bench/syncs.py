"""Host syncs of a decoding, counted and placed: each time Python waits for the GPU.

A CUDA backend queues its kernels and returns at once; the host only waits where it needs a
value back (a `.cpu()`, an `.item()`, a `bool()` of a tensor, `nonzero`), or copies from
pageable memory with a blocking copy. Each wait drains the queue, so the GPU idles while
Python prepares the next launch: in a round of a few small passes, the syncs rather than the
matrix products can set the pace. torch's sync debug mode warns at every such operation;
`counting_syncs` records those warnings with the line of our code that caused each one.

    with counting_syncs() as syncs:
        result = generate(target, draft, prompt, config)
    syncs.total / len(result.rounds), syncs.sites.most_common(5)

On a machine without CUDA nothing is counted (`counted` is False).
"""

from __future__ import annotations

import contextlib
import os
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/targetrows
_MESSAGE = "synchronizing CUDA operation"  # torch's warning text in sync debug mode "warn"


@dataclass
class SyncCount:
    counted: bool = False  # False without CUDA: nothing to count
    total: int = 0
    # "file:line function" of the innermost frame in targetrows (else the innermost frame) ->
    # syncs caused there
    sites: Counter = field(default_factory=Counter)

    def per(self, n: int) -> float:
        return self.total / n if n else float("nan")


def _site(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame inside this package (the code to change), else the innermost one."""
    ours = [f for f in stack if f.filename.startswith(PACKAGE) and not f.filename.endswith(
        os.path.join("bench", "syncs.py"))]
    frame = (ours or stack)[-1]
    where = os.path.relpath(frame.filename, os.path.dirname(PACKAGE)) if ours else frame.filename
    return f"{where}:{frame.lineno} {frame.name}"


@contextlib.contextmanager
def counting_syncs():
    """Count the host syncs of the CUDA work inside the block (every thread's), by source line.
    Yields a `SyncCount` that is filled in when the block ends."""
    import torch

    out = SyncCount()
    if not torch.cuda.is_available():
        yield out
        return
    out.counted = True
    previous_mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if _MESSAGE in str(message):
                out.total += 1
                out.sites[_site(traceback.extract_stack()[:-1])] += 1
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield out
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)
