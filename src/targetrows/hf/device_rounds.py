"""An `HFModel`'s side of the rounds kept on the device: the hooks through which
`targetrows.hf.device_pool` grows a draft's pool there, and the verify pass over a tree
chosen there (`targetrows.hf.device_tree`).

`HFSequence` inherits them (`DeviceRounds`); they read and write its row's bookkeeping (the
committed prefix, the current tree and each node's entry), as the rest of the class does,
through its own helpers: a pool's level is a pass planned on the device, and a tree chosen on the
device is a pass planned for a stand-in of its size, its nodes' tokens, positions and
ancestors given there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from targetrows.core.passes import Passes
from targetrows.core.tree import Tree

from .device_pool import grow_pool_passes
from .device_tree import TreeOnDevice
from .pass_builder import Feed
from .row_trees import plan_feed, seen_by
from .torch_rows import host_to_device, ranked


class DeviceRounds:
    """`HFSequence`'s methods for pools and trees on the device (see the module docstring)."""

    # -- pools grown on the device (`targetrows.hf.device_pool`) --------------------------------
    grow_passes = grow_pool_passes

    def _pool_width(self) -> int:
        return self.vocab_size

    def _root_position(self, n_ctx: int) -> int:
        return n_ctx - 1

    def _pool_first(self, context, tree: Tree, roots: np.ndarray) -> Passes[torch.Tensor]:
        return self.logits_passes(context, tree, roots)

    def _pool_topk(self, rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`topk`'s (ids, float64 log-probs), left on the device, each in memory of its own:
        a GPU's ids are the first k columns of a sort, which the level's gathers, the pool's
        read and a tree chosen on the device would each copy out again."""
        ids, vals = ranked(self._work(rows), k)
        return ids.contiguous(), vals.double()

    def _pool_seen(self, nodes: np.ndarray) -> torch.Tensor:
        state = self._state
        seen = seen_by(nodes, len(state.prefix), self._cache_len(), state.slot,
                       state.tree.ancestor_mask())
        return host_to_device(seen, self.input_device)

    def _pool_entries(self) -> int:
        return self._cache_len()

    def _pool_feed(self, rows, parent, ids: torch.Tensor, positions: np.ndarray,
                   seen: torch.Tensor) -> Passes[torch.Tensor]:
        """One level of new tree nodes, their tokens and what they see given on the device."""
        prefix = self._state.prefix
        start, n = len(prefix), len(ids)
        feed = Feed(self.row, start, self._cache_len(), ids=ids, positions=positions,
                    seen=seen[:, start:], keep=np.arange(n))
        return (yield from self._pass_rows(feed, prefix))

    def _pool_adopt(self, pool: Tree, n_ctx: int, fed) -> None:
        """The pool becomes the model's tree, its live fed nodes at the entries they were fed
        at (rows asked for at them later are not fed again; `commit` keeps the accepted
        ones)."""
        self._adopt_tree(pool, n_ctx)
        slot = self._state.slot
        for first_slot, _, nodes in fed:
            live = np.flatnonzero(nodes >= 0)
            slot[nodes[live]] = first_slot + live

    # -- trees chosen on the device (`targetrows.hf.device_tree`) -------------------------------
    def tree_on_device_passes(self, context: Sequence[int], tree: TreeOnDevice,
                              root: bool = True) -> Passes[torch.Tensor]:
        """`logits_passes` at the nodes of a tree chosen on the device and not read yet
        (`targetrows.hf.device_tree`): all of them, or all but the `root` (its row known, from
        the root pass that committed it). The pass is planned for a stand-in of the tree's size
        (the tail, the slots) and fed the tree's tokens, positions and ancestors from the
        device. `settle_tree` makes the read tree this model's, before `commit`."""
        ctx = np.asarray(context, dtype=np.int64).reshape(-1)
        self._keep_prefix(ctx[:-1] if root else ctx)  # a root asked for is fed again
        self._drop_tree()
        stand_in = Tree(np.full(tree.size, ctx[-1]), np.arange(-1, tree.size - 1))  # a chain
        self._adopt_tree(stand_in, len(ctx))
        feed = plan_feed(self.row, self._state, self._cache_len(), ctx, stand_in,
                         np.arange(0 if root else 1, tree.size))
        feed = tree.feed(feed, len(ctx) - 1, self.input_device)
        return (yield from self._pass_rows(feed, ctx))

    def settle_tree(self, tree: TreeOnDevice) -> Tree:
        """The tree `tree_on_device_passes` fed, read (with the pool: after the pass's draws,
        no further wait), made this model's tree in its stand-in's place."""
        read = tree.read()
        self._state.tree = read
        return read
