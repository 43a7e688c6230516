"""`HFModel`: the Model interface over a Hugging Face causal LM, its sequences rows of one cache.

A model's sequences are rows of one `KVCache` (`Lanes`): the model's own sequence is the one row
of its own lanes, and ``lanes(n)`` gives n `HFSequence`s on n rows of another, for batched
decoding. A sequence is a row index and that row's bookkeeping (`RowTree`: the committed prefix,
the round's tree and each fed node's entry), never a copy of the model; its passes are `Feed`s
that its `Lanes` serve, one pass for every sequence waiting, at every batch size and on every
device, eager or replayed as a CUDA graph (`--graphs`: `targetrows.hf.graphs`).

The row always holds, in order: the entries of a *prefix* of the committed context, then those
of the tree nodes fed in the current round (each at most once, plus "dead" copies of nodes
whose row was asked for again, which nobody attends to). One `logits` call is one pass: the
uncached tail of the context as a chain, then the needed tree nodes (`row_trees.plan_feed`).
`commit` keeps the prefix plus the fed nodes along the committed path, moved in place, and
never prefills again.

Asked for `feature_layers`, the model also keeps, per entry, the residual stream entering those
decoder layers (Hugging Face ``hidden_states[i]``), written by the same pass beside the keys and
values and moved with them: what an EAGLE-3 head drafts from (`targetrows.hf.eagle3`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from targetrows.core.passes import Pass, Passes, run_now
from targetrows.core.tree import Tree

from .device_rounds import DeviceRounds
from .forward import lean_supported, make_forward
from .kv_cache import KVCache
from .lanes import Lanes
from .pass_builder import PassShape
from .row_trees import common_prefix, plan_feed
from .sequence import (
    RowSequence,
    first_entries,
    hand_out,
    max_entries,
    set_shape,
)
from .streams import SideStream


@dataclass(eq=False)
class Engine:
    """What a model's sequences share: the weights and their forward, the settings, the devices,
    the pass shape, the side stream, and the lanes (its own, and the last ones asked for)."""

    model: torch.nn.Module
    forward: object  # `LeanForward`, or `HFForward` for another architecture
    name: str
    vocab_size: int
    context_window: int | None
    n_embeddings: int
    dtype: torch.dtype
    device: torch.device  # where rows come out
    input_device: torch.device
    layer_devices: list[torch.device]
    kv_heads: int
    head_dim: int
    feature_layers: tuple[int, ...] = ()
    hidden_size: int = 0
    shape: PassShape = PassShape(capacity=None)
    side: SideStream | None = None
    own: Lanes | None = None  # the lanes of the sequence the model itself is
    lanes: Lanes | None = None  # the last ones handed out

    @property
    def one_device(self) -> bool:
        return len(set(self.layer_devices)) == 1 and self.layer_devices[0] == self.device

    @property
    def grows(self) -> bool:
        """Whether the cache starts small and grows: passes over the live entries on the CPU
        (a CUDA card's cache, and one that passes read whole, are allocated once, at the
        limit)."""
        return not self.shape.full_span and all(d.type == "cpu" for d in self.layer_devices)

    @property
    def max_entries(self) -> int:
        return max_entries(self.shape, self.context_window, self.grows)

    def make_lanes(self, rows: int) -> Lanes:
        """`rows` sequences' lanes: a cache with room for the feature layers' inputs, served
        by this model's forward."""
        limit = self.max_entries
        cache = KVCache(self.layer_devices, rows, self.kv_heads, self.head_dim, self.dtype,
                        first_entries(limit, self.grows), limit,
                        len(self.feature_layers) * self.hidden_size, self.device)
        return Lanes(self.name, cache, self.shape, self.input_device,
                     lambda inputs: self.forward(inputs, cache, self.feature_layers),
                     side_stream=lambda: _side_stream(self))


def _side_stream(engine: Engine) -> SideStream | None:
    """A stream of its own for the root pass beside drafting (`targetrows.hf.streams`); None
    for a model spread over several devices."""
    if engine.side is None and engine.one_device:
        engine.side = SideStream(engine.device)
    return engine.side


class HFSequence(DeviceRounds, RowSequence):
    """One sequence a Hugging Face causal LM decodes (implements `targetrows.decoding.model.Model`):
    row `row` of `lanes` (see the module docstring)."""

    model = property(lambda self: self.engine.model)
    input_device = property(lambda self: self.engine.input_device)
    hidden_size = property(lambda self: self.engine.hidden_size)

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @vocab_size.setter
    def vocab_size(self, size: int) -> None:
        """Rows are cut to `size` tokens (load_pair sets target and draft to one size)."""
        self.engine.vocab_size = int(size)

    def side_stream(self) -> SideStream | None:
        return _side_stream(self.engine)

    # -- the row -------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        self.engine.forward.refresh()  # weights changed since the last reset reach products
        super().reset(seed)

    def _crop(self, length: int) -> None:
        """Keep only the first `length` entries."""
        lengths = self._cache.lengths
        lengths[self.row] = min(lengths[self.row], length)

    def _drop_tree(self) -> None:
        self._crop(len(self._state.prefix))
        self._state.drop_tree()

    def _keep_prefix(self, ctx: np.ndarray) -> None:
        """Shrink the cached prefix to its longest common prefix with `ctx` (dropping the tree
        if the prefix shrinks)."""
        state = self._state
        common = common_prefix(state.prefix, ctx)
        if common < len(state.prefix):
            self._drop_tree()
            state.prefix = state.prefix[:common].copy()
            self._crop(common)

    def _adopt_tree(self, tree: Tree, n_ctx: int) -> None:
        """Make `tree` the current one: keep the fed entries when it extends the current tree,
        else drop them (a root committed last is the last prefix entry)."""
        state = self._state
        kept = state.extended_by(tree, n_ctx)
        if not kept:
            self._drop_tree()
        state.adopt(tree, n_ctx, kept)
        if not kept and len(state.prefix) == n_ctx:
            state.slot[0] = n_ctx - 1

    # -- rows ----------------------------------------------------------------------------------
    def logits_passes(self, context: Sequence[int], tree: Tree,
                      nodes: Sequence[int]) -> Passes[torch.Tensor]:
        """`logits` as steps that ask for their pass (`targetrows.core.passes`): what is fed
        is planned here, the pass runs wherever the caller runs it (alone, or batched with
        other sequences'), and its rows come back here."""
        ctx, nodes = self._request(context, tree, nodes)
        if len(nodes) == 0:
            return torch.empty((0, self.vocab_size), dtype=self.dtype, device=self.device)
        self._keep_prefix(ctx)
        self._adopt_tree(tree, len(ctx))
        feed = plan_feed(self.row, self._state, self._cache_len(), ctx, tree, nodes)
        return (yield from self._pass_rows(feed, ctx))

    def _pass_rows(self, feed, ctx: np.ndarray) -> Passes[torch.Tensor]:
        """Ask for `feed`'s pass; keep its committed tail; its requested rows."""
        try:
            logits = yield Pass(self._group(), feed)
        except Exception:
            self.reset(None)  # the row's entries and bookkeeping no longer agree
            raise
        if len(feed.tail):
            self._state.prefix = ctx[: feed.start + len(feed.tail)].copy()
        rows = logits[:, : self.vocab_size]
        self._check_finite(rows, feed.positions, feed.keep)
        return rows

    def features(self, context: Sequence[int], start: int, end: int) -> torch.Tensor:
        """The feature layers' inputs [end - start, len(layers) * H] at positions start..end-1
        of `context`, from the cache. A prefix the cache does not hold yet (a prompt before its
        first pass) is fed now, in one pass, and committed: the next pass feeds only the rest."""
        return run_now(self.features_passes(context, start, end))

    def features_passes(self, context: Sequence[int], start: int,
                        end: int) -> Passes[torch.Tensor]:
        """`features` as steps that may ask for a pass (`targetrows.core.passes`)."""
        if not self.feature_layers:
            raise ValueError(f"{self.name}: built without feature_layers; it keeps no features")
        ctx = np.asarray(context, dtype=np.int64).reshape(-1)[:end]
        if not 0 <= start <= end == len(ctx):
            raise ValueError(f"{self.name}: features {start}..{end} outside a {len(context)}-token "
                             "context")
        if end and common_prefix(self._state.prefix, ctx) < len(ctx):  # not all committed
            yield from self.logits_passes(ctx, Tree.root_only(int(ctx[-1])), [0])
            self.commit(ctx)
        return self._cache.features[self.row, start:end].clone()

    # -- commit --------------------------------------------------------------------------------
    def commit(self, context: Sequence[int]) -> None:
        ctx = np.asarray(context, dtype=np.int64).reshape(-1)
        self._keep_prefix(ctx)
        state = self._state
        start = len(state.prefix)
        kept = state.path_slots(ctx, start)
        if kept:  # the path's entries move right after the prefix; everything after goes
            self._cache.keep_entries(self.row, np.asarray(kept, dtype=np.int64), start)
            state.prefix = ctx[: start + len(kept)].copy()
        self._drop_tree()


class HFModel(HFSequence):
    """A Hugging Face causal LM seen as a source of rows: its weights, forward and settings
    (`engine`), and a sequence of its own (implements `targetrows.decoding.model.Model`).

    `vocab_size` (default: the model's logit width) is the tokenizer's vocabulary: rows are cut
    to it, so a target and a draft whose logit widths differ only by padding compare equal.
    """

    def __init__(self, model, vocab_size: int | None = None, name: str = "model",
                 feature_layers: Sequence[int] | None = None):
        super().__init__(_engine(model.eval(), vocab_size, name), None, 0)
        if feature_layers is not None:
            self.keep_features(feature_layers)

    def lanes(self, n: int, target_lanes=None) -> list[HFSequence]:
        """`n` sequences for batched decoding (`targetrows.decoding.batch`), rows of one cache
        whose passes run together (`targetrows.hf.sequence.hand_out`)."""
        lanes = hand_out(self.engine, n)
        return [HFSequence(self.engine, lanes, row) for row in range(n)]

    def set_pass_shape(self, shape: PassShape) -> None:
        """Run every pass at `shape` from now on (`targetrows.hf.graphs.apply_graphs`): the
        lanes made so far are retired, and this model's own sequence starts afresh."""
        set_shape(self.engine, shape)
        self.reset(None)

    def graphs_unsupported(self) -> str | None:
        """Why this model's passes cannot replay as CUDA graphs, or None."""
        engine = self.engine
        if engine.device.type != "cuda":
            return f"{self.name} runs on {engine.device.type}, and CUDA graphs need a CUDA card"
        if not engine.one_device:
            return f"{self.name} is spread over several devices"
        if not lean_supported(self.model):
            arch = getattr(self.model.config, "model_type", "?")
            return f"{self.name} is a {arch!r} model; graphs cover Llama, Qwen2 and Qwen3"
        return None

    def keep_features(self, feature_layers: Sequence[int]) -> None:
        """From now on keep, per entry, the inputs of decoder layers `feature_layers` (Hugging
        Face ``hidden_states[i]`` for each i), concatenated in ascending layer order (as every
        engine concatenates them, whatever order a list has). Forgets the cache (its entries
        have no features)."""
        ids = tuple(sorted(int(i) for i in feature_layers))
        engine = self.engine
        if engine.feature_layers:
            if ids == engine.feature_layers:
                return
            raise ValueError(f"{self.name}: already keeps features of layers "
                             f"{list(engine.feature_layers)}, not {list(ids)}")
        n_layers = len(engine.layer_devices)
        if not ids or min(ids) < 0 or max(ids) >= n_layers:
            raise ValueError(
                f"{self.name}: feature layers {list(ids)} must be in 0..{n_layers - 1} (layer "
                f"i's input is hidden_states[i]; the model has {n_layers} layers)")
        engine.feature_layers = ids
        engine.hidden_size = int(self.model.config.hidden_size)
        self.set_pass_shape(engine.shape)  # caches made anew, with room for the features


def _engine(model, vocab_size: int | None, name: str) -> Engine:
    """The `Engine` of a Hugging Face causal LM: its forward, devices and settings, checked."""
    config = model.config
    width = int(model.get_output_embeddings().weight.shape[0])
    vocab_size = width if vocab_size is None else int(vocab_size)
    if not 0 < vocab_size <= width:
        raise ValueError(f"{name}: vocab_size {vocab_size} must be in 1..{width} (the logit width)")
    if getattr(config, "sliding_window", None) is not None or "sliding_attention" in (
        getattr(config, "layer_types", None) or ()
    ):
        raise ValueError(
            f"{name}: sliding-window attention is not supported (its cache drops entries that "
            "tree attention needs); use a model with full attention in every layer")
    layers = model.get_decoder().layers
    heads = int(config.num_attention_heads)
    return Engine(
        model=model, forward=make_forward(model), name=name, vocab_size=vocab_size,
        context_window=getattr(config, "max_position_embeddings", None),
        n_embeddings=int(model.get_input_embeddings().weight.shape[0]), dtype=model.dtype,
        device=model.get_output_embeddings().weight.device,
        input_device=model.get_input_embeddings().weight.device,
        layer_devices=[next(layer.parameters()).device for layer in layers],
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads))
