"""The one cache of a model's sequences: each sequence is a row of one buffer.

Keys and values of every layer live in one tensor [2, layers, rows, kv_heads, entries,
head_dim] (one per device where a model is spread over several), so that a commit moves a
sequence's accepted path in every layer at once: two launches, where a copy per layer, keys
and values apart, took 4 x layers. Row r holds entries 0..lengths[r]-1 of sequence r: its
committed prefix, then the tree nodes fed this round. Beside them, optional per-entry
**features** [rows, entries, width] move with the entries: the target's feature-layer inputs
(what an EAGLE-3 head drafts from), or a head's own outputs g.

Entry `capacity` is a **scratch** entry: a padded pass writes its padding there, and no real
query ever sees it (entries past it, up to a multiple of `ALIGN`, are never written). The
buffer starts zeroed: a masked entry still enters attention's products with weight 0, and 0
times an uninitialised NaN would be NaN.

Where a pass would need more than `capacity` entries, the cache grows (doubling, up to
`limit`) if it may: on the CPU, eager passes start small and grow. A CUDA card's cache is
allocated at its limit and never reallocates (a CUDA graph replays fixed addresses); a
sequence past the limit is a `CapacityError` that names the setting that raises it.
"""

from __future__ import annotations

import numpy as np
import torch

from .torch_rows import host_to_device

ALIGN = 16  # entries per row are a multiple of this: aligned rows for fused attention kernels


class CapacityError(ValueError):
    """A sequence would hold more entries than its cache's limit."""


def capacity_error(name: str, needed: int, limit: int) -> CapacityError:
    return CapacityError(
        f"{name}: a pass would hold {needed} entries, past the cache's {limit} (the prompt, "
        "the answer so far and one round's tree); raise --max-context (config: "
        "decode.max_context)")


class KVCache:
    """Keys, values and features of `rows` sequences (see the module docstring). `devices`:
    each layer's device, in order; `limit`: the most entries a row may hold (the cache starts
    at `capacity` and grows up to it)."""

    def __init__(self, devices: list[torch.device], rows: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, capacity: int, limit: int, feature_width: int = 0,
                 feature_device: torch.device | None = None):
        if not 1 <= capacity <= limit:
            raise ValueError(f"cache capacity {capacity} must be in 1..{limit}")
        self.devices, self.limit = [torch.device(d) for d in devices], int(limit)
        self.lengths = np.zeros(rows, dtype=np.int64)
        self._shape = (rows, kv_heads, head_dim, dtype)
        self._features = (feature_width, torch.device(feature_device or self.devices[-1]))
        self.parts: list[torch.Tensor] = []
        self.features: torch.Tensor | None = None
        self._allocate(int(capacity))

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def _allocate(self, capacity: int) -> None:
        """Buffers for `capacity` real entries a row, with what they hold now copied in."""
        rows, kv_heads, head_dim, dtype = self._shape
        entries = -(-(capacity + 1) // ALIGN) * ALIGN
        held = int(self.lengths.max(initial=0))
        old_parts, old_features = self.parts, self.features
        self.capacity, self.parts, self._where = capacity, [], []
        for device in dict.fromkeys(self.devices):  # one buffer per device, layers in order
            n = sum(d == device for d in self.devices)
            self.parts.append(torch.zeros((2, n, rows, kv_heads, entries, head_dim),
                                          dtype=dtype, device=device))
        seen: dict[torch.device, int] = {}
        for device in self.devices:  # layer i: which buffer, which of its layers
            part = list(dict.fromkeys(self.devices)).index(device)
            self._where.append((part, seen.get(device, 0)))
            seen[device] = seen.get(device, 0) + 1
        width, device = self._features
        if width:
            self.features = torch.zeros((rows, entries, width), dtype=dtype, device=device)
        for new, old in zip(self.parts, old_parts, strict=False):
            new[..., :held, :] = old[..., :held, :]
        if old_features is not None:
            self.features[:, :held] = old_features[:, :held]

    def layer(self, i: int) -> torch.Tensor:
        """Layer i's keys and values [2, rows, kv_heads, entries, head_dim] (a view)."""
        part, j = self._where[i]
        return self.parts[part][:, j]

    def make_room(self, needed: int) -> None:
        """Room for `needed` entries a row (at most `limit`, checked by the caller): the cache
        grows to at least twice its size, so that each entry is copied O(1) times."""
        if needed > self.capacity:
            self._allocate(min(self.limit, max(needed, 2 * self.capacity)))

    def clear(self, row: int) -> None:
        """Empty `row` for a new sequence, its entries zeroed: a masked entry still enters
        attention's products (with weight 0), so one left non-finite by a sequence that
        overflowed would make every later query of the row NaN."""
        for part in self.parts:
            part[:, :, row].zero_()
        if self.features is not None:
            self.features[row].zero_()
        self.lengths[row] = 0

    def keep_entries(self, row: int, index: np.ndarray, start: int) -> None:
        """Entries `index` (each >= `start`) of `row` move to start, start + 1, ... in that
        order, in every layer and the features at once, and the row ends after them: a
        committed path of tree nodes joining the prefix."""
        end = start + len(index)
        if not np.array_equal(index, np.arange(start, end)):  # else in place already
            for part in self.parts:
                entries = part[:, :, row]  # [2, layers, kv_heads, entries, head_dim]
                at = host_to_device(index, part.device)
                entries[:, :, :, start:end] = entries.index_select(3, at)
            if self.features is not None:
                at = host_to_device(index, self.features.device)
                self.features[row, start:end] = self.features[row].index_select(0, at)
        self.lengths[row] = end

    def entries(self, row: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]],
                                         torch.Tensor | None]:
        """What row `row` holds (views; read them, don't change them): each layer's keys and
        values [kv_heads, length, head_dim], and the features [length, width] if kept."""
        n = int(self.lengths[row])
        kv = [(self.layer(i)[0, row, :, :n], self.layer(i)[1, row, :, :n])
              for i in range(len(self.devices))]
        return kv, None if self.features is None else self.features[row, :n]
