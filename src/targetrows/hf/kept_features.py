"""The target's features an EAGLE-3 head reads: per cache entry, the inputs of the head's
feature layers, concatenated (`HFModel.keep_features`).

They are kept beside the KV cache and change with it: a pass appends its entries' rows, a crop
drops the tree's, a commit moves the accepted path's rows after the prefix. `rows` is a view of
the first rows of a buffer that grows like the KV cache (to twice what it must hold, so a pass
copies nothing but its own rows); under static passes the buffer is made once, at their
capacity, and kept for the next sequence.

The head reads committed rows on its own stream while the root pass, beside it on another, may
append. Appending never changes a committed row, so a reader waits for nothing, except where the
append grew the buffer: the rows already held are then copied into the new buffer on the
appending stream, and a reader waits for that copy (`copied`, an event set before the buffer
switches, so a reader who sees the new buffer sees it too).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .streams import ready_event, record_use, wait_for


class KeptFeatures:
    """One sequence's feature rows on `device`; `buffer`: static passes' buffer, kept from the
    last sequence."""

    def __init__(self, device: torch.device, buffer: torch.Tensor | None = None):
        self.device, self.buffer = device, buffer
        self.rows: torch.Tensor | None = None  # the first `held` rows of `buffer`
        self.copied = None  # the last growth's copy, queued: readers wait for it

    @property
    def held(self) -> int:
        return 0 if self.rows is None else len(self.rows)

    def append(self, fresh: torch.Tensor, base: int, capacity: int | None = None) -> None:
        """Rows `fresh` [q, width] for the entries after entry `base`: the entries held (or, at
        0, none: a new prefix). Anything else is out of step with the KV cache: RuntimeError.
        `capacity`: static passes' entries per sequence, the size of a buffer made for them
        (they check a pass against it first); None: the buffer grows."""
        held = self.held
        if held != base:
            if base:
                raise RuntimeError(f"features out of step with the KV cache: {held} rows held, "
                                 f"a pass appends after entry {base}")
            held = 0
        end = held + len(fresh)
        buf = self.buffer
        if buf is None or len(buf) < end:  # room for twice as many: O(1) copies per entry
            grown = fresh.new_empty((capacity or max(256, 2 * end), fresh.shape[1]))
            if held:
                grown[:held] = buf[:held]
                record_use(buf)  # copied on this stream, maybe not the one it was made on
                self.copied = ready_event(self.device)  # set before the buffer switches
            self.buffer = buf = grown
        buf[held:end] = fresh
        self.rows = buf[:end]

    def crop(self, length: int) -> None:
        """Keep the first `length` entries' rows."""
        if self.rows is not None:
            self.rows = self.rows[:length]

    def keep(self, index: Callable[[torch.device], torch.Tensor], start: int) -> None:
        """Move the rows of entries `index(device)` (a tensor of entry indices, on the device
        asked for) to start, start + 1, ... and drop everything after them: a commit's
        compaction, as the KV cache's (`targetrows.hf.cache`)."""
        if self.rows is not None:
            at = index(self.rows.device)
            end = start + len(at)
            self.rows[start:end] = self.rows.index_select(0, at)
            self.rows = self.rows[:end]

    def read(self, start: int, end: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """A copy of rows start..end-1 [end - start, width], made on the caller's stream after
        any growth's copy of them; empty before anything was appended."""
        if self.rows is None:  # nothing fed yet, nothing asked for
            return torch.zeros((0, width), dtype=dtype, device=self.device)
        wait_for(self.copied, self.device)
        rows = self.rows[start:end].clone()
        record_use(self.rows)  # read on this stream: its block outlives the copy
        return rows
