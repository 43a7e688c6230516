"""Loading EAGLE-3 heads: both checkpoint layouts, checked against their target before weights load.

Layouts (the same tensors under two naming schemes):
- EAGLE / SpecForge: ``midlayer.*``, ``fc.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t``,
  ``t2d``, optional ``embed_tokens.weight``; config.json is a Llama config plus
  ``draft_vocab_size`` (optional ``target_hidden_size``, ``eagle_config``).
- vLLM / speculators: ``layers.0.*`` and ``draft_id_to_target_id`` (or ``d2t``); config.json
  either the same or a speculators config (``speculators_model_type: eagle3``, the layer's
  config under ``transformer_layer_config``).

Feature layers: ``eagle_aux_hidden_state_layer_ids`` (top level or in ``eagle_config``) counts
layer *inputs* as vLLM does: id i is Hugging Face ``hidden_states[i]``; without it the head reads
2, L//2 and L-3 of an L-layer target. Weights load from safetensors, or from
``pytorch_model.bin`` through torch's weights-only unpickler (tensors only, no code runs).
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass

import torch

from .eagle3 import Eagle3Draft, Eagle3Head, Eagle3Shape
from .model import HFModel

# canonical parameter name <- checkpoint name (after a leading "model." is dropped)
_RENAMES = ((re.compile(r"^(midlayer|layers\.0)\."), "layer."),
            (re.compile(r"^draft_id_to_target_id$"), "d2t"))
_LAYER = ("hidden_norm", "input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
          "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
          "mlp.up_proj", "mlp.down_proj")
REQUIRED = ("fc.weight", "norm.weight", "lm_head.weight", *(f"layer.{m}.weight" for m in _LAYER))
OPTIONAL = ("d2t", "t2d", "embed_tokens.weight")
_HUB_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model.bin"]


@dataclass(frozen=True)
class HeadConfig:
    """What config.json says about a head (before any weights are read)."""

    source: str  # folder or hub id, for messages
    layer: dict  # the decoder layer's (Llama) config
    draft_vocab_size: int
    vocab_size: int
    hidden_size: int
    target_hidden_size: int
    layer_ids: tuple[int, ...] | None  # None: the default 2, L//2, L-3
    verifier: str | None  # the target the head names, if any


def head_config(path: str) -> HeadConfig | None:
    """The head config of a folder or hub id, or None when `path` is not an EAGLE-3 head (an
    ordinary model, a GGUF file, ...). A hub id costs one small download (config.json)."""
    raw = _read_config(path)
    if raw is None or not _is_eagle3(raw):
        return None
    return parse_config(raw, path)


def _read_config(path: str) -> dict | None:
    if os.path.isdir(path):
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file):
            return None
    elif os.path.exists(path) or path.startswith((".", "/", "~")) or path.count("/") != 1:
        return None  # a file, or not a hub id
    else:
        from huggingface_hub import hf_hub_download

        try:
            file = hf_hub_download(path, "config.json")
        except Exception:  # no such repo or file, no network: the ordinary loader says it better
            return None
    with open(file) as f:
        return json.load(f)


def _is_eagle3(raw: dict) -> bool:
    archs = " ".join(raw.get("architectures") or []).lower()
    return raw.get("speculators_model_type") == "eagle3" or "eagle3" in archs or (
        "draft_vocab_size" in raw and "eagle" in archs)


def parse_config(raw: dict, source: str) -> HeadConfig:
    """A head's config.json in either layout; variants this backend does not implement are
    refused naming their config key."""
    speculators = raw.get("speculators_model_type") == "eagle3"
    layer = raw.get("transformer_layer_config", {}) if speculators else raw
    eagle = raw.get("eagle_config") or {}
    if raw.get("norm_before_residual") or layer.get("norm_before_residual"):
        raise ValueError(f"EAGLE-3 head {source!r}: config key norm_before_residual=true (the "
                         "residual taken after hidden_norm) is not implemented")
    for key in ("fc_norm", "use_fc_norm", "input_norm_fc"):
        if raw.get(key) or eagle.get(key):
            raise ValueError(f"EAGLE-3 head {source!r}: config key {key}=true (a norm on fc's "
                             "output) is not implemented")
    if eagle.get("use_aux_hidden_state") is False:
        raise ValueError(f"EAGLE-3 head {source!r}: config key eagle_config.use_aux_hidden_state="
                         "false (a head without the three-layer features) is not implemented")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"EAGLE-3 head {source!r}: config key num_hidden_layers="
                         f"{layer['num_hidden_layers']}; only one-layer heads are implemented")
    for key in ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads"):
        if key not in layer:
            raise ValueError(f"EAGLE-3 head {source!r}: config.json has no {key}")
    hidden = int(layer["hidden_size"])
    ids = raw.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    verifier = ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return HeadConfig(
        source=source,
        layer=dict(layer),
        draft_vocab_size=int(raw.get("draft_vocab_size") or layer["vocab_size"]),
        vocab_size=int(layer["vocab_size"]),
        hidden_size=hidden,
        target_hidden_size=int(raw.get("target_hidden_size") or layer.get("target_hidden_size")
                               or hidden),
        layer_ids=None if ids is None else tuple(int(i) for i in ids),
        verifier=verifier,
    )


def feature_layers_for(config: HeadConfig, target_config, target_name: str) -> tuple[int, ...]:
    """The target layers whose inputs the head reads, after checking the head fits the target
    (hidden size, vocabulary, layer ids): a mismatch names both models and the key."""
    who = f"EAGLE-3 head {config.source!r} and target {target_name!r}"
    target_hidden = int(target_config.hidden_size)
    if config.target_hidden_size != target_hidden:
        key = "target_hidden_size" if config.target_hidden_size != config.hidden_size else "hidden_size"
        raise ValueError(f"{who} do not fit: the head reads features of width "
                         f"{config.target_hidden_size} (its config key {key}), the target's "
                         f"hidden_size is {target_hidden}")
    target_vocab = int(target_config.vocab_size)
    if config.vocab_size != target_vocab:
        raise ValueError(f"{who} do not fit: the head's vocab_size is {config.vocab_size}, the "
                         f"target's vocab_size is {target_vocab} (the head embeds and maps "
                         "target token ids)")
    if config.draft_vocab_size > config.vocab_size:
        raise ValueError(f"EAGLE-3 head {config.source!r}: draft_vocab_size "
                         f"{config.draft_vocab_size} exceeds vocab_size {config.vocab_size}")
    n_layers = int(target_config.num_hidden_layers)
    ids = config.layer_ids or (2, n_layers // 2, n_layers - 3)
    if len(ids) != 3 or min(ids) < 0 or max(ids) >= n_layers:
        key = "eagle_aux_hidden_state_layer_ids" if config.layer_ids else "(default 2, L//2, L-3)"
        raise ValueError(f"{who} do not fit: feature layers {list(ids)} {key} must be three "
                         f"layer ids in 0..{n_layers - 1} (the target has num_hidden_layers "
                         f"{n_layers})")
    return tuple(ids)


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """The head's tensors under canonical names (``layer.*``, ``d2t``), from safetensors or a
    weights-only ``pytorch_model.bin``; unknown or missing tensors are refused by name."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    state: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for file in files:
            state.update(load_file(file))
    elif os.path.isfile(os.path.join(path, "pytorch_model.bin")):
        file = os.path.join(path, "pytorch_model.bin")
        try:  # the restricted unpickler: tensors and plain containers only, never code
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(f"{file}: not a weights-only checkpoint ({err}); targetrows never "
                             "unpickles arbitrary objects") from err
    else:
        raise ValueError(f"EAGLE-3 head folder {path!r} has no weights (*.safetensors or "
                         "pytorch_model.bin)")
    out = {}
    for name, tensor in state.items():
        canon = name.removeprefix("model.")
        for pattern, repl in _RENAMES:
            canon = pattern.sub(repl, canon)
        out[canon] = tensor
    unknown = sorted(set(out) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ValueError(f"EAGLE-3 head {path!r} has tensors this backend does not implement: "
                         f"{unknown[:5]} (a variant of the head)")
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise ValueError(f"EAGLE-3 head {path!r} lacks tensors {missing}")
    return out


def build_head(config: HeadConfig, weights: dict[str, torch.Tensor], n_features: int = 3) -> Eagle3Head:
    """The head module from its config and canonical weights; head_dim comes from q_proj's shape
    (Qwen3-4B heads: 32 heads x 128 while hidden_size is 2560)."""
    from transformers import LlamaConfig

    layer = config.layer
    n_heads = int(layer["num_attention_heads"])
    n_kv = int(layer.get("num_key_value_heads") or n_heads)
    q_out = int(weights["layer.self_attn.q_proj.weight"].shape[0])
    if q_out % n_heads:
        raise ValueError(f"EAGLE-3 head {config.source!r}: q_proj has {q_out} outputs, not a "
                         f"multiple of num_attention_heads {n_heads}")
    shape = Eagle3Shape(
        hidden_size=config.hidden_size, target_hidden_size=config.target_hidden_size,
        intermediate_size=int(layer["intermediate_size"]), num_heads=n_heads, num_kv_heads=n_kv,
        head_dim=q_out // n_heads, vocab_size=config.vocab_size,
        draft_vocab_size=config.draft_vocab_size, n_features=n_features,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        hidden_act=layer.get("hidden_act", "silu"),
    )
    rope_keys = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
                 "partial_rotary_factor")
    rope = LlamaConfig(hidden_size=shape.hidden_size, num_attention_heads=n_heads,
                       head_dim=shape.head_dim, **{k: layer[k] for k in rope_keys if k in layer})
    head = Eagle3Head(shape, rope)
    if "embed_tokens.weight" in weights:
        head.embed_tokens = torch.nn.Embedding(config.vocab_size, shape.hidden_size)
    params = {k: v for k, v in weights.items() if k != "t2d"}
    if "d2t" not in params:  # a full-vocabulary head
        if config.draft_vocab_size != config.vocab_size:
            raise ValueError(f"EAGLE-3 head {config.source!r}: draft_vocab_size "
                             f"{config.draft_vocab_size} < vocab_size but no d2t mapping")
        params["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    expected = head.state_dict()
    for name, tensor in params.items():
        want = expected[name] if name in expected else None
        if want is not None and tuple(tensor.shape) != tuple(want.shape):
            raise ValueError(f"EAGLE-3 head {config.source!r}: tensor {name} has shape "
                             f"{tuple(tensor.shape)}, its config implies {tuple(want.shape)}")
    params["d2t"] = params["d2t"].long()
    params.update({k: v for k, v in expected.items() if k.startswith("rotary.")})
    head.load_state_dict(params, strict=True)
    return head


def load_eagle3(path: str, target: HFModel, device: str | None = None,
                dtype: torch.dtype | None = None, target_name: str | None = None) -> Eagle3Draft:
    """An `Eagle3Draft` for the head at `path` (folder or hub id) bound to `target`, on `device`
    (default: the target's) in `dtype` (default: the target's). The config is checked against
    the target before any weights are read."""
    config = head_config(path)
    if config is None:
        raise ValueError(f"{path!r} is not an EAGLE-3 head (its config.json has no "
                         "draft_vocab_size / speculators_model_type eagle3)")
    ids = feature_layers_for(config, target.model.config, target_name or target.name)
    folder = path
    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        folder = snapshot_download(path, allow_patterns=_HUB_FILES)
    weights = read_weights(folder)
    target_hidden = int(target.model.config.hidden_size)
    if "embed_tokens.weight" not in weights and config.hidden_size != target_hidden:
        raise ValueError(f"EAGLE-3 head {path!r} has no embed_tokens.weight, so it embeds with "
                         f"target {target_name or target.name!r}'s table of width {target_hidden}, "
                         f"but its hidden_size is {config.hidden_size}")
    head = build_head(config, weights, len(ids)).to(device or target.device)
    for name, module in head.named_children():
        if name != "rotary":  # rotary frequencies stay float32, as in transformers' models
            module.to(dtype or target.dtype)
    return Eagle3Draft(head, target, ids, name=path)


def write_head(folder: str, tensors: dict[str, torch.Tensor], config: dict,
               layout: str = "eagle", safe: bool = True) -> None:
    """Write a head's canonical tensors (``layer.*``, ``d2t``, ...) and its config.json into
    `folder` under the names of `layout`: ``eagle`` (EAGLE, SpecForge; vLLM reads it too) or
    ``speculators`` (``layers.0.*``, ``draft_id_to_target_id``)."""
    if layout == "eagle":
        names = {k.replace("layer.", "midlayer.", 1): v for k, v in tensors.items()}
    elif layout == "speculators":
        names = {k.replace("layer.", "layers.0.", 1): v for k, v in tensors.items()}
        if "d2t" in names:
            names["draft_id_to_target_id"] = names.pop("d2t")
    else:
        raise ValueError(f"unknown head layout {layout!r}: eagle or speculators")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    names = {k: v.detach().contiguous() for k, v in names.items()}
    if safe:
        from safetensors.torch import save_file

        save_file(names, os.path.join(folder, "model.safetensors"))
    else:
        torch.save(names, os.path.join(folder, "pytorch_model.bin"))
