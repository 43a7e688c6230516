"""A synthetic target/draft pair over a small vocabulary, for tests, examples and benchmarks.

Each model's logits at a context are a seeded Gaussian vector drawn from a hash of the *whole*
context, so rows depend on every committed token (as real rows do) and exact reuse can be told
from inexact reuse. The draft mixes the target's logits with its own noise: ``closeness=1`` makes
the draft equal to the target, ``closeness=0`` makes it unrelated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .passes import Pass, Passes, run_now
from .pool import topk_tokens
from .rows import greedy, log_softmax, ranking_temperature, softmax
from .tree import Tree


def _gaussian(seed: int, context: Sequence[int], size: int) -> np.ndarray:
    digest = hashlib.blake2b(
        np.asarray(context, dtype=np.int64).tobytes(), digest_size=8, key=seed.to_bytes(8, "little")
    ).digest()
    return np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(size)


@dataclass
class ToyModel:
    """One side of the toy pair; implements `targetrows.decoding.model.Model` with NumPy rows."""

    vocab_size: int
    seed: int
    scale: float  # logit spread: larger means peakier rows
    closeness: float = 1.0  # weight of the target's logits (the draft mixes in its own noise)
    target_seed: int | None = None  # the target's seed when this model is a draft
    device: None = None
    _memo: dict = field(default_factory=dict, repr=False)
    _rng: np.random.Generator = field(default=None, repr=False)
    # what runs its passes (`targetrows.core.passes`): the toy's batched pass, shared by a
    # batch's lanes (`lanes`)
    _group: Any = field(default=None, repr=False)

    def row_logits(self, context: Sequence[int]) -> np.ndarray:
        key = tuple(int(t) for t in context)
        if key not in self._memo:  # pure function of the context: memoised for speed
            base = _gaussian(self.target_seed if self.target_seed is not None else self.seed,
                             key, self.vocab_size)
            if self.target_seed is not None:
                own = _gaussian(self.seed, key, self.vocab_size)
                base = self.closeness * base + np.sqrt(1.0 - self.closeness**2) * own
            if len(self._memo) >= 200_000:  # bound the memory: start afresh
                self._memo.clear()
            self._memo[key] = self.scale * base
        return self._memo[key]

    def row(self, context: Sequence[int], temperature: float = 1.0) -> np.ndarray:
        """The next-token distribution at `context`."""
        return softmax(self.row_logits(context), temperature)

    # -- the Model interface ------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)

    def logits(self, context: Sequence[int], tree: Tree, nodes: Sequence[int]) -> np.ndarray:
        return run_now(self.logits_passes(context, tree, nodes))

    def logits_passes(self, context: Sequence[int], tree: Tree,
                      nodes: Sequence[int]) -> Passes[np.ndarray]:
        return (yield Pass(self._group or _PASSES, (self, context, tree, nodes)))

    def _rows(self, context: Sequence[int], tree: Tree, nodes: Sequence[int]) -> np.ndarray:
        context = list(context)
        if tree.tokens[0] != context[-1]:
            raise ValueError(f"tree root token {tree.tokens[0]} is not the last context token {context[-1]}")
        return np.stack([self.row_logits(context + tree.path_tokens(int(n))) for n in nodes])

    def commit(self, context: Sequence[int]) -> None:
        """Nothing is cached but the memo of pure rows."""

    def draw(self, logits: np.ndarray, temperature: float) -> np.ndarray:
        from .verify import draw_rows

        if isinstance(logits, tuple):  # row blocks, drawn in order as one
            logits = np.concatenate(logits)
        if greedy(temperature):
            return draw_rows(logits, None)
        if self._rng is None:
            raise ValueError("call reset(seed) before sampling from a toy model")
        return draw_rows(softmax(logits, temperature), self._rng)

    def topk(self, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return topk_tokens(log_softmax(logits), k)

    def topk_at(self, context: Sequence[int], tree: Tree, nodes: Sequence[int],
                k: int) -> tuple[np.ndarray, np.ndarray]:
        return run_now(self.topk_at_passes(context, tree, nodes, k))

    def topk_at_passes(self, context: Sequence[int], tree: Tree, nodes: Sequence[int],
                       k: int) -> Passes[tuple[np.ndarray, np.ndarray]]:
        return self.topk((yield from self.logits_passes(context, tree, nodes)), k)

    def logprobs(self, logits: np.ndarray, tokens: np.ndarray, temperature: float) -> np.ndarray:
        if isinstance(logits, tuple):  # row blocks, read as one
            logits = np.concatenate(logits)
        lp = log_softmax(logits, ranking_temperature(temperature))
        return np.take_along_axis(lp, np.atleast_2d(np.asarray(tokens, dtype=np.int64)), -1)

    def probs(self, logits: np.ndarray, temperature: float) -> np.ndarray:
        return softmax(logits, temperature)

    def lanes(self, n: int, target_lanes=None) -> list[ToyModel]:
        """`n` copies for a batch (`targetrows.decoding.batch`), each with its own generator,
        sharing one batched pass: rows are a pure function of the context, so a batched pass
        is each lane's own, and the toy pair exercises the batching alone."""
        group = _Passes()
        return [replace(self, _rng=None, _group=group) for _ in range(n)]


class _Passes:
    """The toy's batched pass: each lane's rows, one after another."""

    @staticmethod
    def run_batch(items) -> list[np.ndarray]:
        return [model._rows(context, tree, nodes) for model, context, tree, nodes in items]


_PASSES = _Passes()  # a model that is no lane runs its passes alone


class ToyPair:
    """A toy target and a draft of tunable closeness over the same small vocabulary."""

    def __init__(self, vocab_size: int = 32, seed: int = 0, closeness: float = 0.8,
                 scale: float = 2.0):
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if not 0.0 <= closeness <= 1.0:
            raise ValueError(f"closeness must be in [0, 1], got {closeness}")
        self.vocab_size = vocab_size
        self.target = ToyModel(vocab_size, seed, scale)
        self.draft = ToyModel(vocab_size, seed + 1_000_003, scale, closeness, target_seed=seed)

    def target_row(self, context: Sequence[int], temperature: float = 1.0) -> np.ndarray:
        return self.target.row(context, temperature)

    def draft_row(self, context: Sequence[int]) -> np.ndarray:
        return self.draft.row(context)
