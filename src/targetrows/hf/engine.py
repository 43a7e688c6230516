"""What an `HFModel` and its lanes share (`HFModel.engine`), and how a lone model's passes run.

A model's lanes (`targetrows.hf.lanes`) are `HFModel`s of their own, each with its own
sequence (cache, tree, features, generator, checks), over one `Engine`: the weights and their
forward, the settings and devices, the side stream, and the inputs of the feature layers that
the pass running now captures, whichever lane's it is (`capture_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .streams import SideStream


@dataclass(eq=False)
class Engine:
    """What a model and its lanes share (`HFModel.engine`): the weights and their forward, the
    settings, the devices, the feature hooks' capture and the side stream. Everything else an
    `HFModel` holds is its own sequence's: cache, tree, features, generator, checks."""

    model: torch.nn.Module
    lean: object | None  # the lean forward (`targetrows.hf.lean_forward`), or None
    name: str
    vocab_size: int
    context_window: int | None
    n_embeddings: int
    dtype: torch.dtype
    device: torch.device  # where rows come out
    input_device: torch.device
    keep_device: torch.device  # where the index of the rows to keep goes
    one_device: bool  # a stream is one device's: a split model has no side stream
    feature_layers: tuple[int, ...] = ()
    hidden_size: int = 0
    capture: dict | None = None  # the feature layers' inputs of the pass running now
    side: SideStream | None = None
    # how n lanes' passes run, (model, n) -> a group of passes: None for `BatchedPasses`;
    # static-shape passes set their own (`targetrows.hf.static_pass.use_static`)
    lane_group: object | None = None
    # static-shape passes: each sequence's feature buffer holds this many entries, allocated at
    # its first pass and never grown (None: it grows as the cache does)
    static_entries: int | None = None


def capture_inputs(engine: Engine, layers, ids: tuple[int, ...]) -> None:
    """Hooks on decoder `layers` `ids` that put each one's input (Hugging Face
    ``hidden_states[i]``) into `engine.capture` while a pass captures (what `KeptFeatures`
    keeps)."""
    def grabber(i):
        def grab(module, args, kwargs):
            if engine.capture is not None:
                engine.capture[i] = args[0] if args else kwargs["hidden_states"]
        return grab

    for i in sorted(set(ids)):
        layers[i].register_forward_pre_hook(grabber(i), with_kwargs=True)


class OwnPasses:
    """The passes of a model that is no lane: each runs alone, on the model's own cache (the
    group a batch of one runs, `targetrows.core.passes`)."""

    def __init__(self, model):
        self.model = model

    @torch.inference_mode()
    def run_batch(self, items):
        return [m._forward(feed, m._tree_mask(feed)) for m, feed in items]

    def side_stream(self) -> SideStream | None:
        return self.model.side_stream()
