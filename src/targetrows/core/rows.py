"""Rows: the target's next-token distribution at a full token context, and where they are kept.

A row is only ever looked up by the *whole* context. After verifying at context ``c``, accepting
``a`` and emitting the bonus ``a``, the next round's root is ``caa``: the row stored at ``ca`` (a
tree node's row from the verify pass) is a different context and is never returned for ``caa``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np


class RowStore:
    """Rows keyed by their full token context, optionally keeping only the `max_rows` newest."""

    def __init__(self, max_rows: int | None = None):
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1 or None, got {max_rows}")
        self.max_rows = max_rows
        self._rows: OrderedDict[tuple[int, ...], Any] = OrderedDict()

    @staticmethod
    def _key(context: Sequence[int]) -> tuple[int, ...]:
        # every round looks rows up by the whole context: a tuple made in C (a NumPy int
        # hashes and compares as the int it holds), not one int() per token
        return tuple(context.tolist() if isinstance(context, np.ndarray) else context)

    def put(self, context: Sequence[int], row: Any) -> None:
        key = self._key(context)
        self._rows[key] = row
        self._rows.move_to_end(key)
        if self.max_rows is not None and len(self._rows) > self.max_rows:
            self._rows.popitem(last=False)  # the oldest row goes first

    def get(self, context: Sequence[int]) -> Any | None:
        """The row stored at exactly this context, or None."""
        return self._rows.get(self._key(context))

    def __contains__(self, context: Sequence[int]) -> bool:
        return self._key(context) in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        self._rows.clear()


def check_rows(rows: Any, name: str = "rows", atol: float = 1e-4) -> np.ndarray:
    """`rows` as a float64 array of distributions (last axis), or ValueError naming what is wrong."""
    arr = np.asarray(rows, dtype=np.float64)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty vocabulary axis, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        where = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise ValueError(f"{name} contains NaN or inf (first at index {where})")
    if np.any(arr < 0):
        where = np.argwhere(arr < 0)[0].tolist()
        raise ValueError(f"{name} has a negative probability at index {where}")
    sums = arr.sum(axis=-1)
    off = np.flatnonzero(np.abs(sums - 1.0).reshape(-1) > atol)
    if len(off):
        raise ValueError(
            f"{name} are not distributions: row {int(off[0])} sums to {sums.reshape(-1)[off[0]]:.6g}"
        )
    return arr


def greedy(temperature: float) -> bool:
    """Temperature 0 is greedy decoding: every draw is the row's argmax (the first, so ties go
    to the lower id), and a row is one-hot at it. The one place that says so."""
    return temperature == 0


def ranking_temperature(temperature: float) -> float:
    """The temperature at which rows rank tokens (log-probs for scores and rules): a greedy
    row is one-hot and ranks nothing, so 0 reads as 1."""
    return 1.0 if greedy(temperature) else float(temperature)


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Rows of probabilities; temperature 0 gives one-hot rows at the argmax."""
    logits = np.asarray(logits, dtype=np.float64)
    if greedy(temperature):
        out = np.zeros_like(logits)
        np.put_along_axis(out, logits.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return out
    z = logits / temperature
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64) / ranking_temperature(temperature)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
