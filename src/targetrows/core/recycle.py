"""Token recycling: trees drafted from the target's own past rows, without a draft model.

Token Recycling (arXiv 2408.08696, github.com/Luowaterbi/TokenRecycling) and RACER (arXiv
2604.14885, github.com/hkr04/RACER) keep one row of a table per vocabulary token: the ids of
the target's top-k next tokens (k = 8) at the last node carrying that token that a target pass
computed, accepted or not (`TokenTable`; RACER also writes the prompt's rows). The next tree
grows from the root token through the table:

    Token Recycling  a fixed template of ranks (`TOKEN_RECYCLING_TEMPLATE`, 80 nodes) filled
                     through the table (`fill_template`);
    RACER            breadth-first, each node's children the first `breadth` ids of its token's
                     row, breadths shrinking by halves (`table_tree`), after the n-gram
                     continuations of the history (`targetrows.core.ngram_trie`) took their
                     share of the budget (`racer_tree`).

Their verification differs from ours (theirs is not lossless when sampling); every tree built
here goes through our verification, so a decoder drafting with it stays lossless. A token never
seen has no row (-1): its node gets no children, where both published tables hold zeros and
propose token 0. `Recycler` holds the state of one decode: the table, the n-gram trie and what
to keep across prompts. docs/prior-art.md cites their code line by line.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .checks import check_count
from .ngram_trie import NgramTrie
from .tree import GrowingTree, Tree

# Token Recycling's default template ("2.2.2"), data from github.com/Luowaterbi/TokenRecycling
# at commit 1b4c05c, model/recycling/tree_template_.py:3-10 (its 80 rank paths), re-encoded here
# as the number of children of each node, level by level, nodes in breadth-first order and
# children in rank order (80 non-root nodes; tests/test_recycle.py checks the shape).
TOKEN_RECYCLING_BRANCHES = (
    (8,),
    (8, 4, 3, 2, 1, 1, 1, 1),
    (8, 3, 2, 1, 1, 1, 1, 1, 2, 1, 0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0),
    (5, 2, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0),
    (3, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0),
    (2, 0, 0, 1, 0, 0, 0, 0),
    (0, 0, 0),
)


class TokenTable:
    """``ids[t]``: the target's top-k next-token ids after token t, best first, from the last
    row written for it (-1: none yet); ``logp[t]``: their log-probs where the writer gave them
    (NaN otherwise), for a caller that mixes the table into a draft's distribution."""

    def __init__(self, vocab_size: int, k: int = 8):
        self.vocab_size = check_count(vocab_size, "vocab_size")
        self.k = check_count(k, "k")
        self.ids = np.full((self.vocab_size, self.k), -1, dtype=np.int64)
        self.logp = np.full((self.vocab_size, self.k), np.nan, dtype=np.float32)

    def clear(self) -> None:
        self.ids.fill(-1)
        self.logp.fill(np.nan)

    def seen(self, tokens) -> np.ndarray:
        """Whether each token has a row."""
        return self.ids[np.asarray(tokens, dtype=np.int64), 0] >= 0

    def update(self, tokens, topk_ids, topk_logp=None) -> None:
        """Write ``topk_ids[i]`` (at least k ids, best first) as the row of ``tokens[i]``, for
        every i at once; a token given twice keeps its last row, as in a loop over i."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        ids = np.asarray(topk_ids, dtype=np.int64)
        if ids.ndim != 2 or len(ids) != len(tokens) or ids.shape[1] < self.k:
            raise ValueError(f"topk_ids must be [{len(tokens)}, >= {self.k}] for "
                             f"{len(tokens)} tokens, got {ids.shape}")
        ids = ids[:, : self.k]
        if len(tokens) == 0:
            return
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise ValueError(f"tokens must be ids in [0, {self.vocab_size}), got "
                             f"{tokens.min()}..{tokens.max()}")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"topk_ids must be ids in [0, {self.vocab_size})")
        ordered = np.sort(ids, axis=1)
        if np.any(ordered[:, 1:] == ordered[:, :-1]):  # siblings drafted from a row: distinct
            raise ValueError("a row of topk_ids repeats a token: top-k ids are distinct")
        # the last occurrence of each token: NumPy leaves repeated-index assignment unordered
        _, from_end = np.unique(tokens[::-1], return_index=True)
        last = len(tokens) - 1 - from_end
        self.ids[tokens[last]] = ids[last]
        if topk_logp is None:
            self.logp[tokens[last]] = np.nan
        else:
            logp = np.asarray(topk_logp, dtype=np.float32)
            if logp.shape[0] != len(tokens) or logp.ndim != 2 or logp.shape[1] < self.k:
                raise ValueError(f"topk_logp must be shaped like topk_ids, got {logp.shape}")
            self.logp[tokens[last]] = logp[last, : self.k]

    def update_from_tree(self, tree: Tree, topk_ids, topk_logp=None, nodes=None) -> None:
        """Write the rows of a verify pass: ``topk_ids[j]`` is the target's top-k at node
        ``nodes[j]`` (default: every node, the root included). Nodes are written shallowest
        first, as RACER walks its tree breadth-first, so for a token at several depths the
        deepest row wins."""
        nodes = np.arange(len(tree)) if nodes is None else np.asarray(nodes, dtype=np.int64)
        order = np.argsort(tree.depth[nodes], kind="stable")
        ids = np.asarray(topk_ids)[order]
        logp = None if topk_logp is None else np.asarray(topk_logp)[order]
        self.update(tree.tokens[nodes[order]], ids, logp)


def _grow_from_table(paths: GrowingTree, table: TokenTable, limit: int, breadth: int,
                     charge_merged: bool) -> None:
    """RACER's breadth-first growth from the root through the table, into `paths`, until
    `limit` nodes are charged: every grown node when `charge_merged` (RACER, whose trie merges a
    node it already holds after charging it), else only the new ones.

    The root has `breadth` children. The i-th child (from 0) of a node of breadth b at depth d
    gets breadth max(1, f >> i) with f = b at depth 1 and b >> 1 at any other depth: RACER's
    schedule, which keeps the first grandchild of the root as wide as its parent. Every node
    has breadth >= 1, so the tree only stops at the budget or at tokens without a row."""
    if limit <= 0:
        return
    nodes = np.array([0])
    widths = np.array([breadth])
    depth = 0
    charged = 0
    while len(nodes) and charged < limit:
        rows = table.ids[np.asarray(paths.tokens)[nodes]]  # [F, k], -1 without a row
        rank = np.arange(table.k)
        first = widths if depth == 1 else widths >> 1
        keep = (rank < widths[:, None]) & (rows >= 0)
        child_width = np.maximum(1, first[:, None] >> rank)
        parent = np.broadcast_to(nodes[:, None], rows.shape)
        next_nodes, next_widths = [], []
        # row-major order is breadth-first order: parents in turn, each child by rank
        for p, tok, w in zip(parent[keep], rows[keep], child_width[keep], strict=True):
            node, new = paths.child(p, tok)
            if new or charge_merged:
                charged += 1
            next_nodes.append(node)
            next_widths.append(w)
            if charged >= limit:
                break
        nodes, widths, depth = np.array(next_nodes, dtype=np.int64), np.array(next_widths), depth + 1


def table_tree(table: TokenTable, root_token: int, budget: int, breadth: int | None = None) -> Tree:
    """RACER's tree from the table alone: at most `budget` non-root nodes grown breadth-first
    from `root_token` (`_grow_from_table`; `breadth`: the root's, default the table's k)."""
    paths = GrowingTree(root_token)
    _grow_from_table(paths, table, budget, table.k if breadth is None else breadth, True)
    return paths.tree()


def template_from_branches(branches: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(parents, ranks) of a rank template given as the number of children of each node, level
    by level in breadth-first order (`TOKEN_RECYCLING_BRANCHES`); ranks count from 1, the
    root's is 0."""
    parents, ranks = [-1], [0]
    level = [0]
    for counts in branches:
        if len(counts) != len(level):
            raise ValueError(f"a level of {len(level)} nodes was given {len(counts)} counts")
        below = []
        for node, count in zip(level, counts, strict=True):
            for r in range(1, count + 1):
                below.append(len(parents))
                parents.append(node)
                ranks.append(r)
        level = below
    if level:
        raise ValueError(f"the last level's {len(level)} nodes have no counts")
    return np.array(parents, dtype=np.int64), np.array(ranks, dtype=np.int64)


TOKEN_RECYCLING_TEMPLATE = template_from_branches(TOKEN_RECYCLING_BRANCHES)


def fill_template(table: TokenTable, root_token: int, parents, ranks) -> Tree:
    """A rank template (node j is the ``ranks[j]``-th child of ``parents[j]``, ranks from 1,
    parents before children) filled through the table: Token Recycling's static tree, or a
    Sequoia shape (`targetrows.core.rules.sequoia`). A node whose parent has no row, or whose
    rank is beyond k, is dropped with everything below it."""
    parents = np.asarray(parents, dtype=np.int64)
    ranks = np.asarray(ranks, dtype=np.int64)
    topological = parents[0] == -1 and np.all((parents[1:] >= 0) & (parents[1:] < np.arange(1, len(parents))))
    if len(parents) != len(ranks) or not topological:
        raise ValueError("a template needs parents[0] = -1 and parents[j] < j, one rank per node")
    if np.any(ranks[1:] < 1):
        raise ValueError("template ranks count from 1")
    paths = GrowingTree(root_token)
    where = np.full(len(parents), -1, dtype=np.int64)  # template node -> tree node
    where[0] = 0
    for j in range(1, len(parents)):
        at = where[parents[j]]
        if at < 0 or ranks[j] > table.k:
            continue
        token = table.ids[paths.tokens[at], ranks[j] - 1]
        if token >= 0:
            where[j] = paths.child(at, token)[0]
    return paths.tree()


def racer_tree(context: Sequence[int], trie: NgramTrie, table: TokenTable, budget: int,
               accounting: str = "racer", min_match: int = 2, breadth: int | None = None) -> Tree:
    """RACER's draft under the root ``context[-1]``, at most `budget` non-root nodes: first the
    n-gram continuations of the context's suffixes (`trie`, which holds the history before the
    root), best first by count; the table fills the rest.

    ``accounting="racer"`` charges the budget as RACER does (its ``max_num_draft`` is budget + 1,
    the root counted): one slot per candidate, each match included, even where the tree merges
    it (every match is the root; the same continuation under two matches is one node), and one
    for the table's root, so the tree can be smaller than `budget`. ``"distinct"`` charges only
    the nodes the tree gains, so it fills the budget whenever the sources can."""
    check_count(budget, "budget")
    paths = GrowingTree(context[-1])
    breadth = table.k if breadth is None else breadth
    if accounting == "racer":
        chosen = trie.top(context, budget + 1, min_match, with_matches=True)
        for c in chosen:
            paths.add_path(c.tokens)
        _grow_from_table(paths, table, budget - len(chosen), breadth, charge_merged=True)
    elif accounting == "distinct":
        for c in trie.ranked(context, min_match, with_matches=False):
            if paths.budget >= budget:
                break
            paths.add_path(c.tokens)  # its parent ranked first: one node at most is new
        _grow_from_table(paths, table, budget - paths.budget, breadth, charge_merged=False)
    else:
        raise ValueError(f"accounting must be 'racer' or 'distinct', got {accounting!r}")
    return paths.tree()


def template_prefix(template: tuple[np.ndarray, np.ndarray], budget: int):
    """A rank template's first `budget` non-root nodes (and its root): its nodes are in
    breadth-first order, parents before children, so any prefix is a template too. How Token
    Recycling's 80-node tree runs at a smaller budget."""
    parents, ranks = template
    keep = check_count(budget, "budget") + 1
    return parents[:keep], ranks[:keep]


class Recycler:
    """The state of a draft-free decode: the token table and, with `ngrams`, RACER's n-gram
    trie, or with `template`, Token Recycling's static tree (`fill_template`) instead of
    RACER's breadth-first growth. Both persist within a sequence. `start()` begins a new prompt:
    the table and the trie are cleared unless `keep_across_prompts`. Both published codes keep
    them across prompts (and their warm-up runs); our default does not, so each prompt's trees,
    and so its acceptance, depend only on that prompt and a resumed or re-ordered run measures
    the same. With `prompt_rows` (RACER's, not Token Recycling's), each prompt's own rows are
    to be written first (`prompt_pending` says so until `observe_prompt` has)."""

    def __init__(self, vocab_size: int, k: int = 8, ngrams: bool = True, n: int = 10,
                 min_match: int = 2, breadth: int | None = None, accounting: str = "racer",
                 keep_across_prompts: bool = False, template=None, prompt_rows: bool = False):
        if template is not None and ngrams:
            raise ValueError("a template tree is filled from the table alone: give ngrams=False")
        self.table = TokenTable(vocab_size, k)
        self.trie = NgramTrie(n, keep_across_sequences=keep_across_prompts) if ngrams else None
        self.min_match = min_match
        self.breadth = breadth
        self.accounting = accounting
        self.keep_across_prompts = keep_across_prompts
        self.template = template
        self.prompt_rows = prompt_rows
        self.prompt_pending = False

    def start(self) -> None:
        if not self.keep_across_prompts:
            self.table.clear()
        if self.trie is not None:
            self.trie.start()
        self.prompt_pending = self.prompt_rows

    def observe(self, tokens, topk_ids, topk_logp=None) -> None:
        """Rows at a sequence of positions, in order: ``topk_ids[i]`` follows ``tokens[i]``."""
        self.table.update(tokens, topk_ids, topk_logp)

    def observe_prompt(self, prompt, topk_ids, topk_logp=None) -> None:
        """The prompt's rows (``topk_ids[i]`` at ``prompt[:i + 1]``): RACER's first writes."""
        self.observe(prompt, topk_ids, topk_logp)
        self.prompt_pending = False

    def observe_tree(self, tree: Tree, topk_ids, topk_logp=None, nodes=None) -> None:
        """The rows of a verify pass over `tree` (`TokenTable.update_from_tree`)."""
        self.table.update_from_tree(tree, topk_ids, topk_logp, nodes)

    def tree(self, context: Sequence[int], budget: int) -> Tree:
        """The draft under ``context[-1]``: the template's first `budget` nodes filled from
        the table; else `racer_tree`, or `table_tree` without n-grams."""
        if self.template is not None:
            return fill_template(self.table, context[-1], *template_prefix(self.template, budget))
        if self.trie is None:
            return table_tree(self.table, context[-1], budget, self.breadth)
        # the trie holds the history before the root, as RACER's does when it drafts
        self.trie.extend(context[:-1])
        return racer_tree(context, self.trie, self.table, budget, self.accounting,
                          self.min_match, self.breadth)
