"""`HFModel`: the Model interface over a Hugging Face causal LM, with a KV cache and tree attention.

The cache always holds, in order: the KV entries of a *prefix* of the committed context, then the
entries of the tree nodes fed in the current round (each tree node at most once, plus "dead"
copies of nodes whose row was asked for again, which nobody attends to). One `logits` call is
one forward pass: the uncached tail of the context as a chain, then the needed tree nodes, under
a 4D additive float mask (a bool mask is silently wrong under eager attention). A node attends
to the committed prefix, the tail, its fed ancestors and itself: never to other tree entries.
A pass that is only a causal chain gets no mask of ours: Hugging Face's own causal pass.
`commit` keeps the prefix plus the fed nodes along the committed path, gathered in place, and
never re-prefills.

Asked for `feature_layers`, the model also keeps, per cache entry, the residual stream entering
those decoder layers (Hugging Face ``hidden_states[i]``), captured by hooks in the same pass and
gathered and cropped with the KV entries: what an EAGLE-3 head drafts from (`targetrows.hf.eagle3`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from targetrows.core.passes import Pass, Passes, run_now
from targetrows.core.tree import Tree
from targetrows.hf.cache import cache_kwargs, growing_cache
from targetrows.hf.device_rounds import DeviceRounds
from targetrows.hf.engine import Engine, OwnPasses, capture_inputs
from targetrows.hf.fed_tree import adopt, common_prefix, extends
from targetrows.hf.feed import Feed, plan_feed, region, tree_mask
from targetrows.hf.gqa_attention import NAME as GQA_ATTENTION
from targetrows.hf.gqa_attention import use_gqa_kernel
from targetrows.hf.kept_features import KeptFeatures
from targetrows.hf.lean_forward import lean_forward
from targetrows.hf.streams import SideStream
from targetrows.hf.torch_rows import TorchRows, host_to_device, on_device


class HFModel(DeviceRounds, TorchRows):
    """A Hugging Face causal LM seen as a source of rows (implements `targetrows.decoding.model.Model`).

    `vocab_size` (default: the model's logit width) is the tokenizer's vocabulary: rows are cut
    to it, so a target and a draft whose logit widths differ only by padding compare equal.
    `lean`: run the passes through `targetrows.hf.lean_forward` where it reproduces the model
    (Llama-family models on the CPU), else through the model's own forward.
    """

    def __init__(self, model, vocab_size: int | None = None, name: str = "model",
                 feature_layers: Sequence[int] | None = None, lean: bool = True):
        config = model.config
        width = int(model.get_output_embeddings().weight.shape[0])
        vocab_size = width if vocab_size is None else int(vocab_size)
        if not 0 < vocab_size <= width:
            raise ValueError(
                f"{name}: vocab_size {vocab_size} must be in 1..{width} (the logit width)"
            )
        attn = getattr(config, "_attn_implementation", None)
        if attn not in ("eager", "sdpa", GQA_ATTENTION):
            raise ValueError(
                f"{name}: attention implementation {attn!r} ignores custom 4D masks, so tree "
                "attention would be wrong; load it with attn_implementation='sdpa' or 'eager'"
            )
        use_gqa_kernel(model)  # sdpa without copying the cache per query group: same numbers
        if getattr(config, "sliding_window", None) is not None or "sliding_attention" in (
            getattr(config, "layer_types", None) or ()
        ):
            raise ValueError(
                f"{name}: sliding-window attention is not supported (its cache drops entries "
                "that tree attention needs); use a model with full attention in every layer"
            )
        # Hugging Face picks the rows to keep from the final norm's output before lm_head, so
        # the index lives where that output does (another card than lm_head's in a split model)
        norm = getattr(model.get_decoder(), "norm", None)
        device = model.get_output_embeddings().weight.device  # where rows come out
        engine = Engine(
            model=model.eval(), lean=lean_forward(model) if lean else None, name=name,
            vocab_size=vocab_size,
            context_window=getattr(config, "max_position_embeddings", None),
            n_embeddings=int(model.get_input_embeddings().weight.shape[0]),
            dtype=model.dtype, device=device,
            input_device=model.get_input_embeddings().weight.device,
            keep_device=norm.weight.device if norm is not None else device,
            one_device=len({p.device for p in model.parameters()}) == 1)
        self._begin(engine, OwnPasses(self), lambda: growing_cache(config))
        if feature_layers is not None:
            self.keep_features(feature_layers)

    def _begin(self, engine: Engine, passes, new_cache) -> None:
        """This sequence's own state, on `engine`: its passes run by `passes` (alone, or a
        lane's batched pass), its cache made by `new_cache()` (its own, or its row of a lane
        buffer), its own generator and pending checks."""
        self.engine, self._passes, self._new_cache = engine, passes, new_cache
        self._generator = torch.Generator(device=engine.device)
        self.reset(None)

    # what the model and its lanes share, read through the engine
    model = property(lambda self: self.engine.model)
    name = property(lambda self: self.engine.name)
    # prompts are checked against these before decoding (`specbench.check_prompt`): an id past
    # the embedding table is an IndexError on the CPU and a device assert on a GPU
    context_window = property(lambda self: self.engine.context_window)
    n_embeddings = property(lambda self: self.engine.n_embeddings)
    dtype = property(lambda self: self.engine.dtype)
    device = property(lambda self: self.engine.device)
    input_device = property(lambda self: self.engine.input_device)
    feature_layers = property(lambda self: self.engine.feature_layers)
    hidden_size = property(lambda self: self.engine.hidden_size)

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @vocab_size.setter
    def vocab_size(self, size: int) -> None:
        """Rows are cut to `size` tokens (load_pair sets target and draft to one size)."""
        self.engine.vocab_size = int(size)

    def keep_features(self, feature_layers: Sequence[int]) -> None:
        """From now on keep, per cache entry, the inputs of decoder layers `feature_layers`
        (Hugging Face ``hidden_states[i]`` for each i), concatenated in ascending layer order
        (as every engine concatenates them, whatever order a list has), captured during our own
        passes only. Forgets the cache (its entries have no features)."""
        ids = tuple(sorted(int(i) for i in feature_layers))
        engine = self.engine
        if engine.feature_layers:
            if ids == self.feature_layers:
                return
            raise ValueError(f"{self.name}: already keeps features of layers "
                             f"{list(self.feature_layers)}, not {list(ids)}")
        layers = self.model.get_decoder().layers
        if not ids or min(ids) < 0 or max(ids) >= len(layers):
            raise ValueError(
                f"{self.name}: feature layers {list(ids)} must be in 0..{len(layers) - 1} (layer "
                f"i's input is hidden_states[i]; the model has {len(layers)} layers)"
            )
        capture_inputs(engine, layers, ids)
        engine.feature_layers = ids
        engine.hidden_size = int(self.model.config.hidden_size)
        self._clear_cache()

    # -- cache state ---------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        self._clear_cache()
        self._new_sequence(seed)

    def _clear_cache(self) -> None:
        if self.engine.lean is not None:  # weights changed since the last reset reach products
            self.engine.lean.refresh()
        self._cache = self._new_cache()
        self._prefix = np.zeros(0, dtype=np.int64)  # committed tokens whose KV is cached
        self._tree: Tree | None = None  # the tree whose nodes follow the prefix in the cache
        self._tree_ctx_len = 0  # length of the context that tree was fed under
        self._slot = np.zeros(0, dtype=np.int64)  # cache index of each tree node, -1 if unfed
        # per cache entry: the feature layers' inputs, concatenated (with feature_layers)
        # (static passes keep their buffer, made once at their capacity, for the next sequence)
        kept = getattr(self, "_kept", None)
        static = kept is not None and self.engine.static_entries is not None
        self._kept = KeptFeatures(self.device, kept.buffer if static else None)

    def lanes(self, n: int, target_lanes=None) -> list[HFModel]:
        """`n` lanes of this model for batched decoding (`targetrows.decoding.batch`): each with
        its own cache, generator and checks, their passes run together as batched passes
        (`targetrows.hf.lanes`)."""
        from .lanes import hf_lanes

        return hf_lanes(self, n)

    def side_stream(self) -> SideStream | None:
        """A stream of its own for the root pass beside drafting (`targetrows.hf.streams`);
        None for a model spread over several devices."""
        engine = self.engine
        if engine.side is None and engine.one_device:
            engine.side = SideStream(engine.device)
        return engine.side

    @property
    def cached_tokens(self) -> np.ndarray:
        """The committed tokens whose KV entries the cache holds (a copy)."""
        return self._prefix.copy()

    @property
    def kv_cache(self):
        """The KV cache (read it, don't change it): prefix entries, then tree entries."""
        return self._cache

    def _cache_len(self) -> int:
        return self._cache.get_seq_length()

    def _crop(self, length: int) -> None:
        """Keep only the first `length` cache entries."""
        extra = self._cache_len() - length
        if extra > 0:
            self._cache.crop(-extra)
        self._kept.crop(length)

    def _drop_tree(self) -> None:
        self._crop(len(self._prefix))
        self._tree = None
        self._slot = np.zeros(0, dtype=np.int64)

    def _keep_prefix(self, ctx: np.ndarray) -> None:
        """Shrink the cached prefix to its longest common prefix with `ctx` (dropping the tree if
        the prefix shrinks)."""
        common = common_prefix(self._prefix, ctx)
        if common < len(self._prefix):
            self._drop_tree()
            self._prefix = self._prefix[:common].copy()
            self._crop(common)

    def _adopt_tree(self, tree: Tree, n_ctx: int) -> None:
        """Make `tree` the current one: keep the fed entries when it extends the current tree
        (`fed_tree.extends`), else drop them."""
        old = self._tree
        kept = extends(old, self._tree_ctx_len, tree, n_ctx)
        if not kept:
            self._drop_tree()
        self._slot = adopt(self._slot, old, tree, kept)
        if not kept and len(self._prefix) == n_ctx:  # the root's KV is the last prefix entry
            self._slot[0] = n_ctx - 1
        self._tree, self._tree_ctx_len = tree, n_ctx

    # -- rows ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def logits_passes(self, context: Sequence[int], tree: Tree,
                      nodes: Sequence[int]) -> Passes[torch.Tensor]:
        """`logits` as steps that ask for their pass (`targetrows.core.passes`): what is fed is
        planned here, the pass runs wherever the caller runs it (alone, or batched with other
        lanes' passes), and its rows, features and cache come back here."""
        ctx, nodes = self._request(context, tree, nodes)
        if len(nodes) == 0:
            return torch.empty((0, self.vocab_size), dtype=self.dtype, device=self.device)
        self._keep_prefix(ctx)
        self._adopt_tree(tree, len(ctx))
        return (yield from self._pass_rows(self._plan_feed(ctx, tree, nodes), ctx))

    def _pass_rows(self, feed: Feed, ctx: np.ndarray) -> Passes[torch.Tensor]:
        """Ask for `feed`'s pass; keep its features and committed tail; its requested rows."""
        try:
            logits, captured = yield Pass(self._passes, (self, feed))
        except Exception:
            self._clear_cache()  # a pass that failed midway leaves layers of uneven length
            raise
        if self.feature_layers:
            self._append_features(captured, feed.base)
        if len(feed.tail):
            self._prefix = ctx[: feed.start + len(feed.tail)].copy()
        rows = logits[0, :, : self.vocab_size]
        self._check_finite(rows, feed.positions, feed.keep)
        return rows

    def _plan_feed(self, ctx: np.ndarray, tree: Tree, nodes: np.ndarray) -> Feed:
        """What one pass feeds (`targetrows.hf.feed.plan_feed`); the cache's length is the
        prefix's when there is a tail (the tree was just dropped)."""
        return plan_feed(len(self._prefix), self._cache_len(), self._slot,
                         tree.ancestor_mask(), ctx, tree, nodes)

    def _region(self, feed: Feed) -> np.ndarray:
        """What each token `feed` feeds sees past the prefix (`targetrows.hf.feed.region`)."""
        if feed.seen is not None:  # a level of a pool grown on the device: made there
            return feed.seen
        return region(feed, self._slot, self._tree.ancestor_mask())

    def _tree_mask(self, feed: Feed) -> torch.Tensor | None:
        return tree_mask(feed, self._region(feed), self.dtype, self.input_device)

    def _forward(self, feed: Feed, mask: torch.Tensor | None):
        """(logits of the kept rows, the feature layers' inputs captured) of one pass, through
        the lean forward where there is one."""
        ids = on_device(feed.ids, self.input_device)[None]
        positions = on_device(feed.positions, self.input_device)[None]
        engine = self.engine
        keep = host_to_device(feed.keep, engine.keep_device)  # the rows the last layer computes
        if self.feature_layers:
            engine.capture = {}
        try:
            if engine.lean is not None:
                logits = engine.lean(ids, positions, mask, self._cache, keep, engine.capture)
            else:
                logits = self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                                    use_cache=True, **cache_kwargs(self.model, self._cache),
                                    logits_to_keep=keep).logits
        finally:
            captured, engine.capture = engine.capture, None
        return logits, captured

    def _append_features(self, captured: dict[int, torch.Tensor], base: int) -> None:
        """The pass's layer inputs [1, q, H] each -> [q, len(layers) * H] after entry `base`,
        low | mid | high in the order of `feature_layers`."""
        fresh = torch.cat([captured[i][0].to(self.device) for i in self.feature_layers], dim=-1)
        try:
            self._kept.append(fresh, base, self.engine.static_entries)
        except RuntimeError as err:
            self._clear_cache()
            raise RuntimeError(f"{self.name}: {err}") from None

    def features(self, context: Sequence[int], start: int, end: int) -> torch.Tensor:
        """The feature layers' inputs [end - start, len(layers) * H] at positions start..end-1 of
        `context`, from the cache. A prefix the cache does not hold yet (a prompt before its
        first pass) is fed now, in one pass, and committed: the next pass feeds only the rest."""
        return run_now(self.features_passes(context, start, end))

    @torch.inference_mode()
    def features_passes(self, context: Sequence[int], start: int,
                        end: int) -> Passes[torch.Tensor]:
        """`features` as steps that may ask for a pass (`targetrows.core.passes`)."""
        if not self.feature_layers:
            raise ValueError(f"{self.name}: built without feature_layers; it keeps no features")
        ctx = np.asarray(context, dtype=np.int64).reshape(-1)[:end]
        if not 0 <= start <= end == len(ctx):
            raise ValueError(f"{self.name}: features {start}..{end} outside a {len(context)}-token "
                             "context")
        # Rows of the committed prefix never change while it stays committed, and the root
        # pass that may be queued beside drafting (on its own stream) only extends it: read
        # them without waiting for that pass, only for a growth's copy of them.
        if end and common_prefix(self._prefix, ctx) < len(ctx):  # not all of it committed
            yield from self.logits_passes(ctx, Tree.root_only(int(ctx[-1])), [0])
            self.commit(ctx)
        return self._kept.read(start, end, len(self.feature_layers) * self.hidden_size,
                               self.dtype)

    # -- commit --------------------------------------------------------------------------------
    @torch.inference_mode()
    def commit(self, context: Sequence[int]) -> None:
        ctx = np.asarray(context, dtype=np.int64).reshape(-1)
        self._keep_prefix(ctx)
        tree, start = self._tree, len(self._prefix)
        kept: list[int] = []  # cache indices of the fed tree nodes along ctx, in order
        n_t = self._tree_ctx_len
        if tree is not None and len(ctx) >= n_t and ctx[n_t - 1] == tree.tokens[0]:
            node = 0
            if self._slot[0] >= start:  # the root was fed as a tree node
                kept.append(int(self._slot[0]))
            for tok in ctx[n_t:].tolist():  # the accepted path: a few steps
                node = tree.child_with_token(node, tok)
                if node < 0 or self._slot[node] < 0:
                    break
                kept.append(int(self._slot[node]))
        if kept:  # move the path's entries right after the prefix; everything after goes
            end = start + len(kept)
            if kept == list(range(start, end)):  # in place already (ar's root): a crop will do
                self._crop(end)
            else:
                kept = np.asarray(kept, dtype=np.int64)
                on: dict[torch.device, torch.Tensor] = {}  # the index on each layer's device

                def index(device):
                    if device not in on:
                        on[device] = host_to_device(kept, device)
                    return on[device]

                for layer in self._cache.layers:
                    layer.keep_entries(index(layer.keys.device), start)
                self._kept.keep(index, start)
            self._prefix = ctx[:end].copy()
        self._drop_tree()
