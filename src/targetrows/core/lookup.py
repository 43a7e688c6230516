"""Prompt lookup's guess: the token that followed the last few tokens where they occurred before.

Prompt lookup decoding (Saxena, 2023; Hugging Face's ``prompt_lookup_num_tokens``) drafts
without a model: it finds the last ``n`` tokens of the sequence earlier in the sequence and
proposes what followed them there. Replies copy from their prompts (names, code, quoted
passages), and a small draft trained on little data misses most of those copies
(docs/eagle3.md); the guess is what `targetrows.decoding.lookup_draft` mixes into a draft.

The rule, Hugging Face's: for n from `max_ngram` down to 1, the earliest occurrence of the last
n tokens that has a token after it; the guess is that token, found by the longest n that
matches. `NgramIndex` keeps, for every n-gram of a growing sequence, the token after its
earliest occurrence, so a guess is a dictionary lookup however long the context grows.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """The token after the earliest occurrence of each n-gram (n <= max_ngram) of a sequence
    that grows (the committed context of one decode); `extend` indexes what is new."""

    def __init__(self, max_ngram: int = 2):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
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
