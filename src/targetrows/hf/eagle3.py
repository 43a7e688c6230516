"""EAGLE-3 draft heads as a draft backend: `Eagle3Draft`, a `Model` bound to its target that
drafts from the target's features through the head's layer (`targetrows.heads.module`).

Entry t of a head's row pairs the target feature at position t with token t+1 (position t) and
predicts token t+2. For a context of n tokens the committed entries are 0..n-2, built from the
target's features (`HFSequence.features`); entry n-2 is the tree's root. A tree node feeds its
parent's output g with its own token, sees the committed entries and its ancestors, and is
dropped at `commit`; the next call feeds the accepted tokens again with the features the target
computed for them in its verify pass.

A head's sequences are rows of one cache, as a target's are (`targetrows.hf.model`): keys and
values of its one layer, and each entry's output g as the entry's feature, where a deeper level
reads its parent's. Its steps are `Feed`s laid out by the same builder and served by the same
`Lanes`, eager or replayed as CUDA graphs, with the step's h and token embeddings as
per-query inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from targetrows.core.passes import Pass, Passes
from targetrows.core.tree import Tree
from targetrows.heads.module import Eagle3Head

from .device_pool import grow_pool_passes
from .forward import attend, folded_mask
from .graphs import BucketGraphs
from .kv_cache import KVCache
from .lanes import Lanes
from .pass_builder import Feed, PassShape
from .row_trees import common_prefix, seen_by
from .sequence import RowSequence, first_entries, hand_out, max_entries, set_shape
from .torch_rows import TorchRows, host_to_device, on_device, ranked


@dataclass(eq=False)
class HeadEngine:
    """What a head's sequences share: the head's weights, settings, devices, its vocabulary's
    map into the target's, the pass shape, and its lanes (its own, the last ones handed out)."""

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
    shape: PassShape = PassShape()
    own: Lanes | None = None  # the lanes of the sequence the head itself is
    lanes: Lanes | None = None  # the last ones handed out
    ranking: BucketGraphs | None = None  # on graphs: a pool level's ranking, replayed too

    @property
    def grows(self) -> bool:
        """As `targetrows.hf.model.Engine.grows`."""
        return self.device.type == "cpu" and not self.shape.full_span

    @property
    def max_entries(self) -> int:
        return max_entries(self.shape, self.context_window, self.grows)

    def make_lanes(self, rows: int) -> Lanes:
        """`rows` sequences' lanes: the cache of the head's layer (each entry's feature its g)
        and its steps, which read the step's h and token embeddings as per-query inputs."""
        s, limit = self.head.shape, self.max_entries
        cache = KVCache([self.device], rows, s.num_kv_heads, s.head_dim, self.dtype,
                        first_entries(limit, self.grows), limit, s.hidden_size, self.device)
        if self.shape.graphs and self.ranking is None:
            # five launches a pool level (a copy in, the replay, three copies out), where there
            # were sixteen around a short step (`benchmarks/host_reads.py` counts them)
            self.ranking = BucketGraphs(self.device, self._rank_inputs, self.rank)
        hidden = ((s.hidden_size,), self.dtype)
        return Lanes(self.name, cache, self.shape, self.device,
                     lambda inputs: self.step(cache, inputs), {"h": hidden, "embeds": hidden})

    def step(self, cache: KVCache, inputs) -> torch.Tensor:
        """The head's layer over the step `inputs` holds: keys, values and g written to the
        cache; the kept queries' g."""
        head, (lo, hi) = self.head, inputs.rows
        s = head.shape
        q, k, v, residual = head.attention_inputs(inputs.extra["h"], inputs.extra["embeds"],
                                                  inputs.positions)
        kv = cache.layer(0)[:, lo:hi]
        rows = torch.arange(hi - lo, device=inputs.at.device)[:, None]
        kv[0][rows, :, inputs.at] = k.transpose(1, 2)
        kv[1][rows, :, inputs.at] = v.transpose(1, 2)
        mask = folded_mask(inputs.allowed, s.num_heads // s.num_kv_heads, q.dtype)
        out = attend(q.transpose(1, 2), kv[0, :, :, : inputs.span], kv[1, :, :, : inputs.span],
                     mask, s.head_dim ** -0.5)
        g = head.layer_output(residual, out)
        cache.features[lo:hi][rows, inputs.at] = g
        g = g.flatten(0, 1)
        return g if inputs.keep is None else g.index_select(0, inputs.keep)

    def _rank_inputs(self, width: int) -> SimpleNamespace:
        """One width's input buffer for a pool level's ranking: g [width, H]."""
        return SimpleNamespace(g=torch.zeros((width, self.head.shape.hidden_size),
                                             dtype=self.dtype, device=self.device))

    def rank(self, inputs) -> tuple[torch.Tensor, ...]:
        """(draft-vocabulary ids, log-probs, each row's no-NaN flag) of every row of g, best
        first: `ranked` as a GPU runs it, every column kept, so that one graph serves any k."""
        small = self.head.draft_logits(inputs.g)
        clean = ~torch.isnan(small).any(dim=-1)
        lp = torch.log_softmax(TorchRows._work(small[:, self.draft_cols]), dim=-1)
        vals, ids = torch.sort(lp, dim=-1, descending=True, stable=True)
        return ids, vals, clean


class HeadSequence(RowSequence):
    """One sequence an EAGLE-3 head drafts (implements `targetrows.decoding.model.Model`): row
    `row` of `lanes`, reading the features of `target`, its target's sequence.

    Rows come out over the target's vocabulary (`vocab_size`), -inf outside the draft
    vocabulary, so pools, rules and row logs treat the head like any draft."""

    # a round's committed tokens are fed again, from the target's features, in the next round's
    # first pass (the cost model prices that pass by the tokens fed: `PartTimes.draft_refeeds`)
    refeeds_committed = True
    draft_kind = "eagle3"  # what answers and tables call this kind of draft (`draft_kind`)

    def __init__(self, engine: HeadEngine, lanes: Lanes | None, row: int, target):
        self.target = target
        super().__init__(engine, lanes, row)

    head = property(lambda self: self.engine.head)

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

    # -- the row -------------------------------------------------------------------------------
    @property
    def _n(self) -> int:
        """Committed entries: the row's prefix stands for ctx[:n + 1]."""
        return max(len(self._state.prefix) - 1, 0)

    def _drop_tree(self) -> None:
        self._cache.lengths[self.row] = self._n
        self._state.drop_tree()

    def _keep_prefix(self, ctx: np.ndarray) -> None:
        """Keep the committed entries that `ctx` still stands behind: entry t needs tokens
        0..t+1 unchanged, and a context of n tokens uses entries 0..n-2 only."""
        state, n = self._state, self._n
        keep = max(min(n, common_prefix(state.prefix, ctx) - 1, len(ctx) - 1), 0)
        if keep < n:
            self._drop_tree()
            state.prefix = state.prefix[: keep + 1] if keep else state.prefix[:0]
            self._cache.lengths[self.row] = keep

    def _adopt_tree(self, tree: Tree, n_ctx: int) -> None:
        state = self._state
        kept = state.extended_by(tree, n_ctx)
        if not kept:
            self._drop_tree()
        state.adopt(tree, n_ctx, kept)

    def _g_at(self, slots: np.ndarray) -> torch.Tensor:
        """The outputs g [len(slots), H] of the row's entries `slots`."""
        return self._cache.features[self.row].index_select(0, host_to_device(slots, self.device))

    # -- steps ---------------------------------------------------------------------------------
    def _embed(self, tokens: np.ndarray | torch.Tensor) -> torch.Tensor:
        embed = self.head.embed_tokens if self.head.embed_tokens is not None else (
            self.engine.target_embed)
        return embed(on_device(tokens, embed.weight.device)).to(device=self.device,
                                                                 dtype=self.dtype)

    def _feed(self, h: torch.Tensor, tokens: np.ndarray | torch.Tensor, positions: np.ndarray,
              seen: np.ndarray | torch.Tensor) -> Passes[torch.Tensor]:
        """One head step over new entries after the row's, asked for as a pass (alone, or
        batched with other sequences' steps); `seen`: what each sees past the committed
        entries, which all see. Returns their g. Tokens and `seen` may be on the host or, from
        a pool grown on the device, there."""
        feed = Feed(self.row, self._n, self._cache_len(), ids=tokens, positions=positions,
                    seen=seen, keep=np.arange(len(tokens)),
                    inputs={"h": h, "embeds": self._embed(tokens)})
        try:
            return (yield Pass(self._group(), feed))
        except Exception:
            self.reset(None)  # the row's entries and bookkeeping no longer agree
            raise

    def _feed_committed(self, ctx: np.ndarray) -> Passes[None]:
        """Entries n..len(ctx)-2 from the target's features (one pass; none when up to date)."""
        start, end = self._n, len(ctx) - 1
        if end <= start:
            return
        self._drop_tree()  # tree entries sit after the committed ones
        features = yield from self.target.features_passes(ctx, start, end)
        h = self.head.project(features.to(self.device, self.dtype))
        yield from self._feed(h, ctx[start + 1: end + 1], np.arange(start, end),
                              np.tri(end - start, dtype=bool))
        self._state.prefix = ctx[: end + 1].copy()

    def logits_passes(self, context: Sequence[int], tree: Tree,
                      nodes: Sequence[int]) -> Passes[torch.Tensor]:
        return self._rows((yield from self._node_g(context, tree, nodes)))

    def topk_at_passes(self, context: Sequence[int], tree: Tree, nodes: Sequence[int],
                       k: int) -> Passes[tuple[np.ndarray, np.ndarray]]:
        """`topk` of the nodes' rows, ranked over the draft vocabulary's own logits: the rows
        are never widened to the target's vocabulary and gathered back (pool expansion asks
        this at every level of every round)."""
        g = yield from self._node_g(context, tree, nodes)
        if k > len(self.engine.target_ids):
            return self.topk(self._rows(g), k)
        ids, logp = super().topk(self._draft_logits(g)[:, self.engine.draft_cols], k)
        return self.engine.target_ids[ids], logp

    def _node_g(self, context: Sequence[int], tree: Tree,
                nodes: Sequence[int]) -> Passes[torch.Tensor]:
        """The head's output g at `nodes` [len(nodes), H], feeding what is not cached yet:
        one step per level, as a node needs its parent's g."""
        ctx, nodes = self._request(context, tree, nodes)
        n_ctx = len(ctx)
        if len(nodes) == 0:
            return torch.zeros((0, self.head.shape.hidden_size), dtype=self.dtype,
                               device=self.device)
        self._keep_prefix(ctx)
        yield from self._feed_committed(ctx)
        self._adopt_tree(tree, n_ctx)
        state, n = self._state, self._n
        if n_ctx >= 2:  # the root is committed entry n - 2
            state.slot[0] = n_ctx - 2
        anc = tree.ancestor_mask()
        need = anc[nodes].any(axis=0) & (state.slot < 0)
        for depth in np.unique(tree.depth[need]):
            level = np.flatnonzero(need & (tree.depth == depth))
            if depth == 0:  # a one-token context: no feature exists, the root starts from 0
                h = torch.zeros((1, self.head.shape.hidden_size), dtype=self.dtype,
                                device=self.device)
            else:
                h = self.head.fed_back(self._g_at(state.slot[tree.parents[level]]))
            base, k = self._cache_len(), len(level)
            seen = np.zeros((k, base + k - n), dtype=bool)
            in_tree = state.slot >= n
            seen[:, state.slot[in_tree] - n] = anc[level][:, in_tree]
            seen[np.arange(k), base - n + np.arange(k)] = True
            state.slot[level] = base + np.arange(k)
            yield from self._feed(h, tree.tokens[level], max(n_ctx - 2, 0) + tree.depth[level],
                                  seen)
        return self._g_at(state.slot[nodes])

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
        rows[:, self.engine.target_cols] = small[:, self.engine.draft_cols]
        return rows

    @torch.inference_mode()
    def topk(self, logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """As for any rows, but over the draft vocabulary's columns only (every other token is
        -inf, so its softmax is the same): a softmax and top-k as wide as the draft
        vocabulary instead of the target's, at every level of every round."""
        if k > len(self.engine.target_ids):
            return super().topk(logits, k)
        ids, logp = super().topk(logits[:, self.engine.target_cols], k)
        return self.engine.target_ids[ids], logp

    def commit(self, context: Sequence[int]) -> None:
        """Keep the committed entries `context` still stands behind and drop the tree: the
        accepted tokens are fed again, from the target's features, by the next `logits`."""
        self._keep_prefix(np.asarray(context, dtype=np.int64).reshape(-1))
        self._drop_tree()

    # -- pools grown on the device (`targetrows.hf.device_pool`) --------------------------------
    grow_passes = grow_pool_passes

    def _pool_width(self) -> int:
        return len(self.engine.target_ids)

    def _root_position(self, n_ctx: int) -> int:
        return max(n_ctx - 2, 0)

    def _pool_first(self, context, tree: Tree, roots: np.ndarray) -> Passes[torch.Tensor]:
        return self._node_g(context, tree, roots)

    def _pool_topk(self, g: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`topk_at`'s (target ids, float64 log-probs), left on the device; on graphs, the
        ranking is replayed as a graph of its own, its k best copied out (the next replay of
        the width overwrites its outputs)."""
        engine = self.engine
        if engine.ranking is None:
            ids, vals = ranked(self._work(self._draft_logits(g)[:, engine.draft_cols]), k)
            return engine.target_cols[ids], vals.double()
        width = len(g)
        bucket = engine.shape.bucket(width)
        inputs = engine.ranking.inputs(bucket)
        inputs.g[:width] = g  # padding rows keep earlier, finite values
        ids, vals, clean = (engine.ranking.run(inputs, bucket)
                            if bucket in engine.shape.buckets else engine.rank(inputs))
        self._check_clean(clean[:width].clone())
        return (engine.target_cols[ids[:width, :k]],
                vals[:width, :k].to(torch.float64, copy=True))

    def _pool_seen(self, nodes: np.ndarray) -> torch.Tensor:
        """[len(nodes), entries]: the entries each fed node sees, itself included."""
        state = self._state
        seen = seen_by(nodes, self._n, self._cache_len(), state.slot, state.tree.ancestor_mask())
        return host_to_device(seen, self.device)

    def _pool_entries(self) -> int:
        return self._cache_len()

    def _pool_feed(self, g: torch.Tensor, parent: torch.Tensor, ids: torch.Tensor,
                   positions: np.ndarray, seen: torch.Tensor) -> Passes[torch.Tensor]:
        return self._feed(self.head.fed_back(g[parent]), ids, positions, seen[:, self._n:])

    def _pool_adopt(self, pool: Tree, n_ctx: int, fed) -> None:
        """The pool becomes the head's tree, its live fed nodes at their entries, where their
        g is (rows asked for at them later are not fed again)."""
        self._adopt_tree(pool, n_ctx)
        slot = self._state.slot
        for first_slot, _, nodes in fed:
            live = np.flatnonzero(nodes >= 0)
            slot[nodes[live]] = first_slot + live


class Eagle3Draft(HeadSequence):
    """An EAGLE-3 head bound to its target `HFModel`: its weights and settings (`engine`) and a
    sequence of its own. The target is made to keep the head's feature layers
    (`HFModel.keep_features`)."""

    def __init__(self, head: Eagle3Head, target, feature_layers: Sequence[int],
                 name: str = "eagle3"):
        target.keep_features(feature_layers)
        weight = head.lm_head.weight
        engine = HeadEngine(head=head.eval(), name=name,
                            feature_layers=tuple(sorted(int(i) for i in feature_layers)),
                            device=weight.device, dtype=weight.dtype,
                            context_window=target.context_window,
                            n_embeddings=target.n_embeddings,
                            target_embed=target.model.get_input_embeddings())
        super().__init__(engine, None, 0, target)
        self.vocab_size = target.vocab_size

    def lanes(self, n: int, target_lanes) -> list[HeadSequence]:
        """`n` sequences for batched decoding, sequence i reading target sequence i's features
        (`targetrows.decoding.batch`); their steps run as one batched step
        (`targetrows.hf.sequence.hand_out`)."""
        if target_lanes is None or len(target_lanes) != n:
            raise ValueError(f"{self.name}: an EAGLE-3 head's lanes read their target lanes' "
                             f"features: give {n} target lanes")
        lanes = hand_out(self.engine, n)
        return [HeadSequence(self.engine, lanes, row, target)
                for row, target in enumerate(target_lanes)]

    def set_pass_shape(self, shape: PassShape) -> None:
        """Take every step at `shape` from now on (`targetrows.hf.graphs.apply_graphs`)."""
        set_shape(self.engine, shape)
        self.engine.ranking = None
        self.reset(None)

    def graphs_unsupported(self) -> str | None:
        """Why this head's steps cannot replay as CUDA graphs, or None."""
        if self.device.type != "cuda":
            return f"{self.name} runs on {self.device.type}, and CUDA graphs need a CUDA card"
        return None
