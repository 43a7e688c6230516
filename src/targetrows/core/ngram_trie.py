"""N-gram continuations of the history, with counts: the retrieval half of RACER's draft.

RACER (arXiv 2604.14885, github.com/hkr04/RACER) keeps every window of `n` consecutive
tokens of the history (n = 10) as a path in a trie whose nodes count the windows that pass
through them. A node at depth d spells a string s; its count is the number of windows that
start with s: the occurrences of s at a position i of the history with i + n <= len(history)
(an occurrence in the last n - 1 positions is counted once later tokens complete its window).

To draft, the suffixes of the context (ending with the root token) that are paths of the trie
are the *matches* (RACER: "borders"; at least `min_match` = 2 tokens long, so a lone token
never matches). Everything below a match in the trie is something that followed that suffix
earlier, and a node's count is how often. The candidates are (match, continuation) pairs,
taken best first by count (`ranked`); the same continuation under two matches is two
candidates, which the tree built from them merges (`targetrows.core.recycle`).

We look each suffix up from the trie's root (at most n walks of at most n steps) instead of
running RACER's Aho-Corasick automaton; that finds every matching suffix, which their
automaton is meant to (docs/prior-art.md says where theirs can miss some). Ties between equal
counts, which RACER leaves to hash and pointer order, are broken here by a fixed key
(`rank_key`), so the result is deterministic and a brute force can reproduce it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .checks import check_count


@dataclass(frozen=True)
class Candidate:
    """One retrieval candidate: the last `match` tokens of the context, followed earlier in the
    history by `tokens` (empty for the match itself, which stands for the root), `count` times."""

    match: int
    tokens: tuple[int, ...]
    count: int


def rank_key(c: Candidate) -> tuple:
    """The order candidates are taken in: more windows first; then shorter continuations (so a
    parent always comes before its child, which has no more windows); then longer matches (the
    more specific context); then by token ids, only to make the order total."""
    return (-c.count, len(c.tokens), -c.match, c.tokens)


class NgramTrie:
    """Counts of the windows of `n` tokens of a growing sequence, as a trie.

    `extend(sequence)` indexes what is new when `sequence` extends the sequence indexed so far;
    any other sequence starts a new history: the counts are forgotten, unless
    `keep_across_sequences` (RACER keeps its trie across prompts; our default does not, so a
    prompt's trees do not depend on which prompts were decoded before it)."""

    def __init__(self, n: int = 10, keep_across_sequences: bool = False):
        self.n = check_count(n, "n")
        self.keep_across_sequences = keep_across_sequences
        self.clear()

    def clear(self) -> None:
        """Forget every count and the history."""
        self.history: list[int] = []
        self._child: dict[tuple[int, int], int] = {}  # (node, token) -> node; node 0 is the root
        self._children: list[list[int]] = [[]]
        self._token: list[int] = [-1]
        self._count: list[int] = [0]  # node 0: every window

    def __len__(self) -> int:
        """Nodes, the root included."""
        return len(self._count)

    def start(self) -> None:
        """A new sequence begins: windows never span the old and the new one."""
        if self.keep_across_sequences:
            self.history = []
        else:
            self.clear()

    def extend(self, sequence: Sequence[int]) -> None:
        """Index the windows that end in the part of `sequence` not indexed yet (all of it when
        it does not extend the indexed history)."""
        sequence = [int(t) for t in sequence]
        if sequence[: len(self.history)] != self.history:
            self.start()
        old = len(self.history)
        self.history.extend(sequence[old:])
        # a window ends at each new position with n - 1 tokens before it
        for end in range(max(old, self.n - 1), len(self.history)):
            self._insert(self.history[end - self.n + 1 : end + 1])

    def _insert(self, window: list[int]) -> None:
        node = 0
        self._count[0] += 1
        for token in window:
            child = self._child.get((node, token))
            if child is None:
                child = len(self._count)
                self._child[(node, token)] = child
                self._children[node].append(child)
                self._children.append([])
                self._token.append(token)
                self._count.append(0)
            self._count[child] += 1
            node = child

    def _node(self, tokens: Sequence[int]) -> int:
        """The node spelling `tokens`, or -1."""
        node = 0
        for token in tokens:
            node = self._child.get((node, int(token)), -1)
            if node < 0:
                return -1
        return node

    def count(self, tokens: Sequence[int]) -> int:
        """Windows that start with `tokens` (0 when none does)."""
        node = self._node(tokens)
        return self._count[node] if node >= 0 else 0

    def matches(self, tail: Sequence[int], min_match: int = 2) -> list[tuple[int, int]]:
        """(length, node) of each suffix of `tail`, `min_match` to n tokens long, that is a path
        of the trie; longest first."""
        check_count(min_match, "min_match")
        tail = [int(t) for t in tail[-self.n :]]
        found = []
        for m in range(len(tail), min_match - 1, -1):
            node = self._node(tail[len(tail) - m :])
            if node >= 0:
                found.append((m, node))
        return found

    def ranked(self, tail: Sequence[int], min_match: int = 2,
               with_matches: bool = True) -> Iterator[Candidate]:
        """Every candidate under the matches of `tail`, best first by `rank_key`: a best-first
        search from the matches, which is exact because no node ranks above its parent. With
        `with_matches`, each match comes first as a candidate of its own (empty `tokens`): RACER
        charges its budget one node per match."""
        heap = []
        for m, node in self.matches(tail, min_match):
            c = Candidate(m, (), self._count[node])
            if with_matches:
                heap.append((rank_key(c), node, c))
            else:
                self._push_children(heap, node, c)
        heapq.heapify(heap)
        while heap:
            _, node, c = heapq.heappop(heap)
            if c.tokens or with_matches:
                yield c
            self._push_children(heap, node, c)

    def _push_children(self, heap: list, node: int, c: Candidate) -> None:
        for child in self._children[node]:
            d = Candidate(c.match, c.tokens + (self._token[child],), self._count[child])
            heapq.heappush(heap, (rank_key(d), child, d))

    def top(self, tail: Sequence[int], limit: int, min_match: int = 2,
            with_matches: bool = True) -> list[Candidate]:
        """The first `limit` candidates of `ranked`."""
        out = []
        if limit <= 0:
            return out
        for c in self.ranked(tail, min_match, with_matches):
            out.append(c)
            if len(out) == limit:
                break
        return out
