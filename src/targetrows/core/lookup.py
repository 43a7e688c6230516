"""Prompt lookup: the token that followed the last few tokens where they occurred before, and a
draft with that guess mixed into its proposals.

Prompt lookup decoding (Saxena, 2023; Hugging Face's ``prompt_lookup_num_tokens``) drafts
without a model: it finds the last ``n`` tokens of the sequence earlier in the sequence and
proposes what followed them there. Replies copy from their prompts (names, code, quoted
passages), which a small draft trained on little data mostly misses.

The rule, Hugging Face's: for n from `max_ngram` down to 1, the earliest occurrence of the last
n tokens that has a token after it; the guess is that token, found by the longest n that
matches. `NgramIndex` keeps, for every n-gram of a growing sequence, the token after its
earliest occurrence, so a guess is a dictionary lookup however long the context grows.

`LookupDraft` wraps any draft and, at every node it is asked to expand, mixes the guess into
the draft's distribution q:

    q'(x) = (1 - w_n) q(x) + w_n [x = guess]

with w_n the weight of a guess found by an n-token match (a longer match is right more often).
Pool expansion only ever asks a draft for its top-k (`Model.topk_at`), so that is where the mix
enters: the top-k of q' (a guess that q does not rank in its top-k counts its own q as 0, a
lower bound, and enters when its weight alone beats the k-th token), and every rule picks its
tree from the mixed pool. A guessed node is fed to the draft like any other (a head embeds it
with the target's embedding, so a guess outside the head's draft vocabulary can still be
expanded). The guess is keyed on the node's last tokens (context + path) and looked up in the
committed context only (the tree's own n-grams are not indexed). Verification never reads the
draft, so every decoder stays lossless with this draft as with any other. Rows (`logits`,
`probs`) stay the inner draft's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .checks import check_count
from .passes import Passes, run_now
from .tree import Tree


class NgramIndex:
    """The token after the earliest occurrence of each n-gram (n <= max_ngram) of a sequence
    that grows (the committed context of one decode); `extend` indexes what is new."""

    def __init__(self, max_ngram: int = 2):
        check_count(max_ngram, "max_ngram")
        self.max_ngram = max_ngram
        self.clear()

    def clear(self) -> None:
        """Forget the sequence (a new decode starts)."""
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}

    def extend(self, sequence: Sequence[int]) -> None:
        """Index `sequence`: what is new when it extends the sequence indexed so far, else all
        of it afresh (the caller moved to another sequence)."""
        if list(sequence[: len(self.tokens)]) != self.tokens:
            self.clear()
        seq = self.tokens
        start = len(seq)
        seq.extend(int(t) for t in sequence[start:])
        for p in range(max(start, 1), len(seq)):  # seq[p] follows the n-grams ending at p - 1
            for n in range(1, min(self.max_ngram, p) + 1):
                self._next.setdefault(tuple(seq[p - n : p]), seq[p])

    def guess(self, tail: Sequence[int]) -> tuple[int, int] | None:
        """(token, n): what followed the longest matching suffix of `tail` (n tokens, at most
        max_ngram) at its earliest occurrence in the indexed sequence; None when not even its
        last token occurred with one after it."""
        for n in range(min(self.max_ngram, len(tail)), 0, -1):
            token = self._next.get(tuple(int(t) for t in tail[len(tail) - n :]))
            if token is not None:
                return token, n
        return None


# Weight of a guess by match length (1 token, 2 tokens): about the rate at which each was right
# on the embedded target's greedy replies to prompts no bench run uses
# (benchmarks/draft_guesses.py measures it).
DEFAULT_WEIGHTS = (0.15, 0.65)


class LookupDraft:
    """`inner` (any draft implementing `targetrows.decoding.model.Model`) with prompt lookup's guess mixed
    into the top-k it proposes; `weights[n - 1]` is the weight of a guess from an n-token match.
    The guess is always the longest match's, so a weight of 0 drops the guesses of that length
    (it does not fall back to a shorter match)."""

    def __init__(self, inner: Any, weights: Sequence[float] = DEFAULT_WEIGHTS):
        weights = tuple(float(w) for w in weights)
        if not weights or not all(0.0 <= w < 1.0 for w in weights):
            raise ValueError(f"lookup weights must be in [0, 1), one per match length, "
                             f"got {weights}")
        self.inner = inner
        self.weights = weights
        self.index = NgramIndex(max_ngram=len(weights))

    # The Model interface: everything but topk_at is the inner draft's.
    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def device(self) -> Any:
        return self.inner.device

    @property
    def name(self) -> str:
        weights = ", ".join(f"{w:g}" for w in self.weights)
        return f"{getattr(self.inner, 'name', 'draft')} + prompt lookup (weights {weights})"

    def __getattr__(self, name: str) -> Any:  # backend extras (synchronize, dtype, ...)
        if name == "inner":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def lanes(self, n: int, target_lanes=None) -> list[LookupDraft]:
        """`n` lanes for a batch: the inner draft's lanes, each with an n-gram index of its
        own (a sequence's guesses come from its own context)."""
        return [type(self)(lane, self.weights) for lane in self.inner.lanes(n, target_lanes)]

    def reset(self, seed: int | None = None) -> None:
        self.index.clear()
        self.inner.reset(seed)

    def commit(self, context: Sequence[int]) -> None:
        self.inner.commit(context)

    def logits(self, context: Sequence[int], tree: Tree, nodes: Sequence[int]) -> Any:
        return self.inner.logits(context, tree, nodes)

    def draw(self, logits: Any, temperature: float) -> np.ndarray:
        return self.inner.draw(logits, temperature)

    def topk(self, logits: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.inner.topk(logits, k)

    def logprobs(self, logits: Any, tokens: np.ndarray, temperature: float) -> np.ndarray:
        return self.inner.logprobs(logits, tokens, temperature)

    def probs(self, logits: Any, temperature: float) -> np.ndarray:
        return self.inner.probs(logits, temperature)

    def logits_passes(self, context: Sequence[int], tree: Tree, nodes: Sequence[int]) -> Passes:
        return self.inner.logits_passes(context, tree, nodes)

    def topk_at(self, context: Sequence[int], tree: Tree, nodes: Sequence[int],
                k: int) -> tuple[np.ndarray, np.ndarray]:
        return run_now(self.topk_at_passes(context, tree, nodes, k))

    def topk_at_passes(self, context: Sequence[int], tree: Tree, nodes: Sequence[int],
                       k: int) -> Passes[tuple[np.ndarray, np.ndarray]]:
        """The inner draft's top-k at each node, with the node's guess mixed in."""
        tokens, logp = yield from self.inner.topk_at_passes(context, tree, nodes, k)
        self.index.extend(context)
        tokens, logp = tokens.copy(), logp.copy()
        tail_from_context = [int(t) for t in context[-self.index.max_ngram:]]
        for row, node in enumerate(np.asarray(nodes, dtype=np.int64).tolist()):
            found = self.index.guess(tail_from_context + tree.path_tokens(node))
            if found is not None and self.weights[found[1] - 1] > 0:
                tokens[row], logp[row] = mix_guess(tokens[row], logp[row], found[0],
                                                   self.weights[found[1] - 1])
        return tokens, logp


def mix_guess(tokens: np.ndarray, logp: np.ndarray, guess: int,
              weight: float) -> tuple[np.ndarray, np.ndarray]:
    """One row's top-k (tokens, log-probs, best first) under (1 - weight) q + weight [guess],
    best first (ties keep q's order). A guess outside q's top-k counts its own q as 0: it takes
    the k-th place when the weight alone beats that token's mixed probability."""
    q = (1.0 - weight) * np.exp(logp)
    hit = np.flatnonzero(tokens == guess)
    if len(hit):
        q[hit[0]] += weight
    else:
        tokens, q = np.append(tokens, guess), np.append(q, weight)
    order = np.argsort(-q, kind="stable")[: len(logp)]
    with np.errstate(divide="ignore"):
        return tokens[order], np.log(q[order])
