"""EAGLE-3 draft heads as a draft backend: `Eagle3Draft`, a `Model` bound to its target that
drafts from the target's features with its own KV cache and tree attention, through the head's
layer (`targetrows.hf.eagle3_head`).

Entry t of the head's cache pairs the target feature at position t with token t+1 (position t)
and predicts token t+2. For a context of n tokens the committed entries are 0..n-2, built from
the target's features (`HFModel.features`); entry n-2 is the tree's root. A tree node feeds its
parent's g with its own token, sees the committed entries and its ancestors, and is dropped at
`commit`; the next call feeds the accepted tokens again with the features the target computed
for them in its verify pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from targetrows.core.passes import Pass, Passes
from targetrows.core.tree import Tree

from .device_pool import grow_pool_passes
from .eagle3_head import Eagle3Head
from .fed_tree import adopt, common_prefix, extends
from .model import HFModel
from .torch_rows import TorchRows, host_to_device, on_device, ranked


@dataclass(eq=False)
class HeadEngine:
    """What a head and its lanes share (`Eagle3Draft.engine`): the head's weights, settings,
    devices and its vocabulary's map into the target's. Everything else an `Eagle3Draft` holds
    is its own sequence's: its target lane, cache, tree, generator, checks."""

    head: Eagle3Head
    name: str
    feature_layers: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype
    context_window: int | None
    n_embeddings: int
    target_embed: nn.Module
    vocab_size: int = 0
    draft_cols: torch.Tensor | None = None  # draft-vocabulary columns inside vocab_size
    target_cols: torch.Tensor | None = None  # their target ids, ascending
    target_ids: np.ndarray | None = None  # the same, on the host
    # how n lanes' steps run, (head, n) -> a group: None for `HeadSteps`; static-shape
    # steps set their own (`targetrows.hf.static_head.use_static_head`)
    lane_group: object | None = None


class Eagle3Draft(TorchRows):
    """An EAGLE-3 head bound to its target `HFModel` (implements `targetrows.decoding.model.Model`).

    Rows come out over the target's vocabulary (`vocab_size`), -inf outside the draft
    vocabulary, so pools, rules and row logs treat the head like any draft. The target is made
    to keep the head's feature layers (`HFModel.keep_features`)."""

    # a round's committed tokens are fed again, from the target's features, in the next round's
    # first pass (the cost model prices that pass by the tokens fed: `PartTimes.draft_refeeds`)
    refeeds_committed = True
    draft_kind = "eagle3"  # what answers and tables call this kind of draft (`draft_kind`)

    def __init__(self, head: Eagle3Head, target: HFModel, feature_layers: Sequence[int],
                 name: str = "eagle3"):
        target.keep_features(feature_layers)
        weight = head.lm_head.weight
        shared = HeadEngine(head=head.eval(), name=name,
                            feature_layers=tuple(sorted(int(i) for i in feature_layers)),
                            device=weight.device, dtype=weight.dtype,
                            context_window=target.context_window,
                            n_embeddings=target.n_embeddings,
                            target_embed=target.model.get_input_embeddings())
        self._begin(shared, target, OwnSteps())
        self.vocab_size = target.vocab_size

    def _begin(self, engine: HeadEngine, target: HFModel, steps) -> None:
        """This sequence's own state on `engine`: the target (lane) whose features it reads,
        what runs its steps (alone, or a lane's batched step), its generator and caches."""
        self.engine, self.target, self._steps = engine, target, steps
        self._generator = torch.Generator(device=engine.device)
        self.reset(None)

    # what the head and its lanes share, read through the engine
    head = property(lambda self: self.engine.head)
    name = property(lambda self: self.engine.name)
    feature_layers = property(lambda self: self.engine.feature_layers)
    device = property(lambda self: self.engine.device)
    dtype = property(lambda self: self.engine.dtype)
    context_window = property(lambda self: self.engine.context_window)
    n_embeddings = property(lambda self: self.engine.n_embeddings)
    _target_embed = property(lambda self: self.engine.target_embed)
    _draft_cols = property(lambda self: self.engine.draft_cols)
    _target_cols = property(lambda self: self.engine.target_cols)
    _target_ids = property(lambda self: self.engine.target_ids)

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @vocab_size.setter
    def vocab_size(self, size: int) -> None:
        """Rows are cut to `size` tokens (load_pair sets target and draft to one size)."""
        engine = self.engine
        engine.vocab_size = int(size)
        draft_ids = torch.arange(engine.head.shape.draft_vocab_size, device=engine.device)
        target_ids = draft_ids + engine.head.d2t.to(engine.device)
        inside = target_ids < engine.vocab_size
        # ascending target ids, so that a top-k over these columns breaks ties as over the rows
        order = target_ids[inside].argsort()
        engine.draft_cols, engine.target_cols = draft_ids[inside][order], target_ids[inside][order]
        engine.target_ids = engine.target_cols.cpu().numpy()

    # -- cache state ---------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        s = self.head.shape
        empty = torch.zeros((s.num_kv_heads, 0, s.head_dim), dtype=self.dtype, device=self.device)
        self._k, self._v = empty, empty.clone()
        self._n = 0  # committed entries (built from target features)
        self._prefix = np.zeros(0, dtype=np.int64)  # the tokens they stand for: ctx[:n + 1]
        self._g_committed = torch.zeros((0, s.hidden_size), dtype=self.dtype, device=self.device)
        self._drop_tree()
        self._new_sequence(seed)

    @property
    def cached_tokens(self) -> np.ndarray:
        """The committed tokens the head's committed entries stand for (a copy)."""
        return self._prefix.copy()

    def _drop_tree(self) -> None:
        self._k, self._v = self._k[:, : self._n], self._v[:, : self._n]
        self._tree: Tree | None = None
        self._tree_ctx_len = 0
        self._slot = np.zeros(0, dtype=np.int64)  # cache index of each fed node, -1 if unfed
        self._g: torch.Tensor | None = None  # each fed node's output g

    def _keep_prefix(self, ctx: np.ndarray) -> None:
        """Keep the committed entries that `ctx` still stands behind: entry t needs tokens
        0..t+1 unchanged, and a context of n tokens uses entries 0..n-2 only."""
        keep = max(min(self._n, common_prefix(self._prefix, ctx) - 1, len(ctx) - 1), 0)
        if keep < self._n:
            self._n = keep
            self._drop_tree()
            self._g_committed = self._g_committed[:keep]
            self._prefix = self._prefix[: keep + 1] if keep else self._prefix[:0]

    def _adopt_tree(self, tree: Tree, n_ctx: int) -> None:
        """As `HFModel._adopt_tree`, with each fed node's output g kept beside its slot."""
        old = self._tree
        kept = extends(old, self._tree_ctx_len, tree, n_ctx)
        if not kept:
            self._drop_tree()
            self._g = torch.zeros((len(tree), self.head.shape.hidden_size), dtype=self.dtype,
                                  device=self.device)
        elif len(tree) > len(old):
            grow = len(tree) - len(old)
            self._g = torch.cat([self._g, self._g.new_zeros((grow, self._g.shape[1]))])
        self._slot = adopt(self._slot, old, tree, kept)
        self._tree, self._tree_ctx_len = tree, n_ctx

    # -- rows ----------------------------------------------------------------------------------
    def _embed(self, tokens: np.ndarray | torch.Tensor) -> torch.Tensor:
        embed = self.head.embed_tokens if self.head.embed_tokens is not None else self._target_embed
        return embed(on_device(tokens, embed.weight.device)).to(device=self.device,
                                                                 dtype=self.dtype)

    def _feed(self, h: torch.Tensor, tokens: np.ndarray | torch.Tensor, positions: np.ndarray,
              allowed: np.ndarray | torch.Tensor) -> Passes[torch.Tensor]:
        """One head step over new entries appended to the cache, asked for as a pass (alone,
        or batched with other lanes' steps: `targetrows.hf.lanes`); returns their g. Tokens
        and the mask may be on the host or, from a pool grown on the device, there."""
        step = yield Pass(self._steps, (self, h, self._embed(tokens), positions, allowed))
        g, self._k, self._v = step
        return g

    def lanes(self, n: int, target_lanes) -> list[Eagle3Draft]:
        """`n` lanes of this head for batched decoding, lane i reading target lane i's
        features (`targetrows.decoding.batch`); their steps run as one batched step."""
        from .lanes import head_lanes

        return head_lanes(self, n, target_lanes)

    def _feed_committed(self, ctx: np.ndarray) -> Passes[None]:
        """Entries n..len(ctx)-2 from the target's features (one pass; none when up to date)."""
        start, end = self._n, len(ctx) - 1
        if end <= start:
            return
        self._drop_tree()  # tree entries sit after the committed ones
        features = yield from self.target.features_passes(ctx, start, end)
        features = features.to(self.device, self.dtype)
        m = end - start
        allowed = np.ones((m, end), dtype=bool)
        allowed[:, start:] = np.tril(np.ones((m, m), dtype=bool))
        g = yield from self._feed(self.head.project(features), ctx[start + 1 : end + 1],
                                  np.arange(start, end), allowed)
        self._g_committed = torch.cat([self._g_committed, g])
        self._n, self._prefix = end, ctx[: end + 1].copy()

    @torch.inference_mode()
    def logits_passes(self, context: Sequence[int], tree: Tree,
                      nodes: Sequence[int]) -> Passes[torch.Tensor]:
        return self._rows((yield from self._node_g(context, tree, nodes)))

    @torch.inference_mode()
    def topk_at_passes(self, context: Sequence[int], tree: Tree, nodes: Sequence[int],
                       k: int) -> Passes[tuple[np.ndarray, np.ndarray]]:
        """`topk` of the nodes' rows, ranked over the draft vocabulary's own logits: the rows
        are never widened to the target's vocabulary and gathered back (pool expansion asks
        this at every level of every round)."""
        g = yield from self._node_g(context, tree, nodes)
        if k > len(self._target_ids):
            return self.topk(self._rows(g), k)
        ids, logp = super().topk(self._draft_logits(g)[:, self._draft_cols], k)
        return self._target_ids[ids], logp

    # -- pools grown on the device (`targetrows.hf.device_pool`) --------------------------------
    grow_passes = grow_pool_passes

    def _pool_width(self) -> int:
        return len(self._target_ids)

    def _root_position(self, n_ctx: int) -> int:
        return max(n_ctx - 2, 0)

    def _pool_first(self, context, tree: Tree, roots: np.ndarray) -> Passes[torch.Tensor]:
        return self._node_g(context, tree, roots)

    def _pool_topk(self, g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`topk_at`'s (target ids, float64 log-probs), left on the device; on graphs, the
        head's vocabulary step is replayed too (`StaticHeadSteps.pool_topk`)."""
        on_graphs = getattr(self._steps, "pool_topk", None)
        if on_graphs is not None:
            return on_graphs(self, g, k)
        small = self._draft_logits(g)[:, self._draft_cols]
        ids, vals = ranked(self._work(small), k)
        return self._target_cols[ids], vals.double()

    def _pool_seen(self, nodes: np.ndarray) -> torch.Tensor:
        """[len(nodes), cache entries]: the entries each fed node sees, itself included."""
        seen = np.zeros((len(nodes), self._k.shape[1]), dtype=bool)
        seen[:, : self._n] = True  # every committed entry (a committed root's among them)
        in_tree = self._slot >= self._n
        seen[:, self._slot[in_tree]] = self._tree.ancestor_mask()[nodes][:, in_tree]
        return host_to_device(seen, self.device)

    def _pool_entries(self) -> int:
        return self._k.shape[1]

    def _pool_feed(self, g: torch.Tensor, parent: torch.Tensor, ids: torch.Tensor,
                   positions: np.ndarray, seen: torch.Tensor) -> Passes[torch.Tensor]:
        return self._feed(self.head.fed_back(g[parent]), ids, positions, seen)

    def _pool_adopt(self, pool: Tree, n_ctx: int, fed) -> None:
        """The pool becomes the head's tree, its live fed nodes at their entries with their g
        (rows asked for at them later are not fed again)."""
        self._adopt_tree(pool, n_ctx)
        if not fed:
            return
        node, row, rows = [], [], 0  # each live fed node, and its row of the levels' g
        for first_slot, g, nodes in fed:
            live = np.flatnonzero(nodes >= 0)
            self._slot[nodes[live]] = first_slot + live
            node.append(nodes[live])
            row.append(rows + live)
            rows += len(g)
        # every level at once: on a GPU four launches, not four a level
        index = host_to_device(np.stack([np.concatenate(node), np.concatenate(row)]),
                               self.device)
        self._g[index[0]] = torch.cat([g for _, g, _ in fed])[index[1]]

    def _node_g(self, context: Sequence[int], tree: Tree,
                nodes: Sequence[int]) -> Passes[torch.Tensor]:
        """The head's output g at `nodes` [len(nodes), H], feeding what is not cached yet."""
        ctx, nodes = self._request(context, tree, nodes)
        n_ctx = len(ctx)
        if len(nodes) == 0:
            return self._g_committed.new_empty((0, self.head.shape.hidden_size))

        self._keep_prefix(ctx)
        yield from self._feed_committed(ctx)
        self._adopt_tree(tree, n_ctx)
        if n_ctx >= 2:  # the root is committed entry n-2
            self._slot[0] = n_ctx - 2
            self._g[0] = self._g_committed[n_ctx - 2]
        base_pos = max(n_ctx - 2, 0)
        anc = tree.ancestor_mask()
        need = anc[nodes].any(axis=0) & (self._slot < 0)
        for depth in np.unique(tree.depth[need]):  # one pass per level: a node needs its parent's g
            level = np.flatnonzero(need & (tree.depth == depth))
            if depth == 0:  # a one-token context: no feature exists, the root starts from h = 0
                h = self._g.new_zeros((1, self._g.shape[1]))
            else:
                h = self.head.fed_back(self._g[host_to_device(tree.parents[level],
                                                              self.device)])
            cache_len, k = self._k.shape[1], len(level)
            allowed = np.zeros((k, cache_len + k), dtype=bool)
            allowed[:, : self._n] = True  # every committed entry, the root's among them
            in_tree = self._slot >= self._n
            allowed[:, self._slot[in_tree]] = anc[level][:, in_tree]
            allowed[np.arange(k), cache_len + np.arange(k)] = True
            self._slot[level] = cache_len + np.arange(k)
            self._g[host_to_device(level, self.device)] = yield from self._feed(
                h, tree.tokens[level], base_pos + tree.depth[level], allowed)
        return self._g[host_to_device(nodes, self.device)]

    def _draft_logits(self, g: torch.Tensor) -> torch.Tensor:
        """The head's logits over its draft vocabulary [rows, draft_vocab_size]."""
        small = self.head.draft_logits(g)
        self._check_clean(~torch.isnan(small).any(dim=-1))
        return small

    def _check_clean(self, clean: torch.Tensor) -> None:
        """Queue the check that each row of the head's logits is free of NaN (`clean`, one
        flag a row): read with the next read of its rows, so the GPU does not wait here."""
        message = (f"{self.name}: the head's logits contain NaN; it overflows in {self.dtype}: "
                   "try --draft-dtype float32")
        self._check_later(clean, lambda flags: None if flags.all() else message)

    def _rows(self, g: torch.Tensor) -> torch.Tensor:
        """Draft logits scattered into the target's vocabulary, -inf elsewhere."""
        small = self._draft_logits(g)
        rows = small.new_full((small.shape[0], self.vocab_size), float("-inf"))
        rows[:, self._target_cols] = small[:, self._draft_cols]
        return rows

    @torch.inference_mode()
    def topk(self, logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """As for any rows, but over the draft vocabulary's columns only (every other token is
        -inf, so its softmax is the same): a softmax and top-k as wide as the draft
        vocabulary instead of the target's, at every level of every round."""
        if k > len(self._target_ids):
            return super().topk(logits, k)
        ids, logp = super().topk(logits[:, self._target_cols], k)
        return self._target_ids[ids], logp

    # -- commit --------------------------------------------------------------------------------
    @torch.inference_mode()
    def commit(self, context: Sequence[int]) -> None:
        """Keep the committed entries `context` still stands behind and drop the tree: the
        accepted tokens are fed again, from the target's features, by the next `logits`."""
        self._keep_prefix(np.asarray(context, dtype=np.int64).reshape(-1))
        self._drop_tree()


class OwnSteps:
    """The steps of a head that is no lane: each after its own cache (the group a batch of one
    runs, `targetrows.core.passes`)."""

    @torch.inference_mode()
    def run_batch(self, items):
        out = []
        for draft, h, embeds, positions, allowed in items:
            pos = host_to_device(positions, draft.device)
            mask = on_device(allowed, draft.device)[None, None]
            out.append(draft.head.step(h, embeds, pos, draft._k, draft._v, mask))
        return out
