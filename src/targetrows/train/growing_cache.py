"""A KV cache that grows in place: each layer's keys and values live in a buffer with room to
spare, and a new entry is written into it instead of concatenated onto a fresh copy.

Hugging Face's `DynamicCache` concatenates on every update, so a decoding step copies the whole
cache of every layer once. At batch 1 that is a small part of a step; for the replies' batched
greedy decoding (over a hundred rows) it can cost more than the matrix products. Here the
buffer doubles when full, so each entry is copied O(1) times on
average, and attention reads a view of the filled part (the same entries, the same results)."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from targetrows.hf.streams import record_use


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose `keys`/`values` are views of the first `length` entries of
    preallocated buffers [batch, heads, capacity, head_dim]."""

    def __init__(self, capacity: int = 256, **kwargs):
        super().__init__(**kwargs)
        self.capacity = max(1, int(capacity))
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.length = 0
        self._k = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[3]))
        self._v = value_states.new_empty((*value_states.shape[:2], self.capacity,
                                          value_states.shape[3]))
        self._views()
        self.is_initialized = True

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def _reserve(self, needed: int) -> None:
        if needed <= self._k.shape[2]:
            return
        room = max(needed, 2 * self._k.shape[2])
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], room, old.shape[3]))
            new[:, :, : self.length] = old[:, :, : self.length]
            record_use(old)  # copied on this stream, maybe not the one it was made on
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self._reserve(self.length + n)
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def reset(self) -> None:
        self.length = 0
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative count of entries to drop")
        if self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)
            self._views()

    def _select(self, index: torch.Tensor) -> None:
        """Keep rows `index` of the batch (only the filled entries are copied)."""
        if self.is_initialized:
            index = index.to(self._k.device)
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = old.new_empty((len(index), *old.shape[1:]))
                new[:, :, : self.length] = old[index, :, : self.length]
                setattr(self, name, new)
            self._views()

    def keep_entries(self, index: torch.Tensor, start: int) -> None:
        """Move entries `index` (each >= `start`) to `start`, `start` + 1, ... in that order and
        drop every entry after them: a committed path of tree nodes joining the prefix."""
        index = index.to(self._k.device)
        for buf in (self._k, self._v):
            buf[:, :, start : start + len(index)] = buf.index_select(2, index)
        self.length = start + len(index)
        self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        indices = torch.as_tensor(indices)
        self._select(indices.nonzero()[:, 0] if indices.dtype == torch.bool else indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._select(torch.arange(self._k.shape[0], device=self._k.device)
                         .repeat_interleave(repeats))


def growing_cache(config, capacity: int = 256) -> Cache:
    """A cache for a model with `config` (full attention in every layer), each layer with room
    for `capacity` entries before it first grows."""
    text = config.get_text_config(decoder=True)
    if getattr(text, "sliding_window", None) is not None or "sliding_attention" in (
        getattr(text, "layer_types", None) or ()
    ):
        raise ValueError("growing_cache: sliding-window layers need Hugging Face's own cache")
    return Cache(layers=[GrowingLayer(capacity) for _ in range(text.num_hidden_layers)])
