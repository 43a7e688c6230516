"""Hugging Face's own forward over the one cache, for an architecture the lean forward
(`targetrows.hf.forward`) does not reproduce: the same passes, laid out by the same builder,
through the model's own modules.

Each attention layer hands its new keys and values to the cache through a Hugging Face `Cache`
layer of ours (`_CacheLayer`), which writes them at the pass's slots and gives back the pass's
span of entries; the mask is the builder's, as Hugging Face's additive 4D mask (a boolean one
is silently wrong under eager attention); the feature layers' inputs are taken by hooks.
Slower than the lean forward (every layer's Python, the cache's keys and values repeated per
query group, the LM head over every query) and, unlike it, never captured as a CUDA graph.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers.cache_utils import Cache, DynamicLayer


class HFForward:
    """A Hugging Face causal LM's own forward over a `KVCache` (`LeanForward`'s interface)."""

    def __init__(self, model):
        self.model = model

    def _capturing(self, feature_layers: tuple[int, ...], captured: dict) -> list:
        """Hooks that put the inputs of `feature_layers` into `captured` during this pass (and
        are removed after it: the model, perhaps another's too, is left as it was)."""
        def grabber(i):
            def grab(module, args, kwargs):
                captured[i] = args[0] if args else kwargs["hidden_states"]
            return grab

        layers = self.model.get_decoder().layers
        return [layers[i].register_forward_pre_hook(grabber(i), with_kwargs=True)
                for i in sorted(set(feature_layers))]

    def refresh(self) -> None:
        """Nothing to rebuild: the model's own modules read their weights as they are."""

    @torch.inference_mode()
    def __call__(self, inputs, cache, feature_layers: tuple[int, ...] = ()) -> torch.Tensor:
        """Logits [kept queries, vocabulary] of the pass `inputs` holds (see `LeanForward`)."""
        model, (lo, hi) = self.model, inputs.rows
        dtype = model.get_input_embeddings().weight.dtype
        mask = torch.zeros(inputs.allowed.shape, dtype=dtype, device=inputs.allowed.device)
        mask.masked_fill_(~inputs.allowed, torch.finfo(dtype).min)
        past = Cache(layers=[_CacheLayer(cache.layer(i)[:, lo:hi], inputs)
                             for i in range(len(cache.devices))])
        captured: dict[int, torch.Tensor] = {}
        hooks = self._capturing(feature_layers, captured)
        try:
            logits = model(input_ids=inputs.ids, position_ids=inputs.positions,
                           attention_mask=mask[:, None], use_cache=True,
                           **cache_kwargs(model, past)).logits
        finally:
            for hook in hooks:
                hook.remove()
        if feature_layers:
            at = inputs.at.to(cache.features.device)
            rows = torch.arange(len(at), device=at.device)[:, None]
            cache.features[lo:hi][rows, at] = torch.cat(
                [captured[i].to(cache.features.device) for i in feature_layers], dim=-1)
        logits = logits.flatten(0, 1)
        return logits if inputs.keep is None else logits.index_select(
            0, inputs.keep.to(logits.device))


class _CacheLayer(DynamicLayer):
    """One layer's rows of the cache (`kv` [2, rows, kv_heads, entries, head_dim]) as Hugging
    Face's attention reads and writes them: `update` writes the pass's keys and values at its
    slots and returns the pass's span of entries."""

    def __init__(self, kv: torch.Tensor, inputs):
        super().__init__()
        self._kv, self._inputs = kv, inputs
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        at = self._inputs.at.to(key_states.device)
        rows = torch.arange(len(at), device=at.device)[:, None]
        self._kv[0][rows, :, at] = key_states.transpose(1, 2)
        self._kv[1][rows, :, at] = value_states.transpose(1, 2)
        span = self._inputs.span
        return self._kv[0, :, :, :span], self._kv[1, :, :, :span]

    def get_seq_length(self) -> int:
        return self._inputs.span - self._inputs.width  # the entries before the pass's own


@functools.cache
def _cache_name(model_class: type) -> str:
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model, cache: Cache) -> dict:
    """`{name: cache}` under the name `model.forward` takes a cache by: `cache` in transformers
    5.24 and later, `past_key_values` before. A cache passed under the other name lands in
    `**kwargs` and is ignored without a word: every pass would run without the cache."""
    return {_cache_name(type(model)): cache}
