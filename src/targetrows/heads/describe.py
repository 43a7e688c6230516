"""What a head is and how it will be read, before anything runs (`targetrows inspect-head`): its
layout and the engine whose reading applies, the feature layers (as layer inputs, with the key
they came from), the draft vocabulary and how much of the target's it covers, the variants, the
embedding and rotary settings, its tensors, and whether it fits a given target."""

from __future__ import annotations

import os

from . import checkpoint


def describe(path: str, target_config=None, weights: bool = True) -> dict:
    """A dict of what `path` (a head folder or hub id) holds and how it is read; with
    `target_config` (a transformers config), whether it fits that target (a mismatch is
    reported, not raised). `weights`: read the tensors' names and shapes too (a hub id then
    downloads the head)."""
    config = checkpoint.head_config(path)
    if config is None:
        raise ValueError(f"{path!r} is not an EAGLE-3 head (its config.json has no "
                         "draft_vocab_size / speculators_model_type eagle3)")
    raw, layer = config.raw, config.layer
    rope = layer.get("rope_parameters") or raw.get("rope_parameters") or {}
    out = {
        "head": path,
        "layout": config.layout.name,
        "read as": config.layout.engine,
        "written by an earlier targetrows": config.legacy,
        "draft vocabulary": config.draft_vocab_size,
        "target vocabulary": config.vocab_size,
        "draft vocabulary covers": f"{config.draft_vocab_size / config.vocab_size:.1%} of the "
                                   "target's token ids",
        "hidden size": config.hidden_size,
        "target hidden size": config.target_hidden_size,
        "variants": config.variants.names() or ["none (EAGLE-3's plain layer)"],
        "norm_output means": config.layout.norm_output,
        "embedding": ("the target's whenever the widths match (SGLang)"
                      if config.layout.embedding == "target"
                      else "its own table when it has one, else the target's"),
        "rope base": rope.get("rope_theta", layer.get("rope_theta", raw.get("rope_theta",
                                                                             10000.0))),
        "rope scaling": rope.get("rope_type") if rope.get("rope_type") not in (None, "default")
        else (layer.get("rope_scaling") or raw.get("rope_scaling")),
        "verifier named": config.verifier,
    }
    out.update(_feature_layers(config, target_config))
    if weights:
        out.update(_tensors(path, config, out.get("feature layers (inputs)")))
    return out


def _feature_layers(config, target_config) -> dict:
    """Which target layers the head reads, and from which key (or the default), checked
    against `target_config` when there is one."""
    if target_config is not None:
        try:
            layers = checkpoint.feature_layers_for(config, target_config,
                                                   getattr(target_config, "_name_or_path", "?"))
        except ValueError as err:
            return {"fits the target": f"no: {err}"}
        return {"feature layers (inputs)": list(layers.inputs),
                "feature layers from": layers.source, "fits the target": "yes"}
    raw = config.raw
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return {
        "feature layers from": ("eagle_aux_hidden_state_layer_ids (inputs)" if top else
                                "eagle_config.eagle_aux_hidden_state_layer_ids (outputs)"
                                if nested else "default: inputs of layers 2, L//2, L-3"),
        "feature layers (inputs)": (sorted(top) if top else
                                    sorted(i + (0 if config.legacy else 1) for i in nested)
                                    if nested else "2, L//2, L-3 (give --target for L)"),
    }


def _tensors(path: str, config, layers) -> dict:
    """The head's tensors' names and shapes (a hub id is downloaded), or why they are refused."""
    folder = path
    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        folder = snapshot_download(path, allow_patterns=checkpoint._HUB_FILES)
    n_features = len(layers) if isinstance(layers, list) else 3
    try:
        tensors = checkpoint.read_weights(folder, config, n_features)
    except ValueError as err:
        return {"tensors": f"refused: {err}"}
    return {"tensors": {k: list(v.shape) for k, v in sorted(tensors.items())},
            "own embedding table": "embed_tokens.weight" in tensors}


def format_description(info: dict) -> str:
    """The description as aligned `key: value` lines (tensors one per line)."""
    width = max(len(k) for k in info)
    lines = []
    for key, value in info.items():
        if key == "tensors" and isinstance(value, dict):
            lines.append(f"{key:<{width}}  {len(value)}")
            lines += [f"{'':<{width}}    {name} {shape}" for name, shape in value.items()]
        else:
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)

