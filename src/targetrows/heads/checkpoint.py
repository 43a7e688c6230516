"""Loading and writing EAGLE-3 heads: every published layout, read as the engine that made it
reads it (`targetrows.heads.conventions`), checked against its target before weights load.

Layouts (the same tensors under two naming schemes):
- EAGLE reference and EAGLE/SpecForge ``LlamaForCausalLMEagle3``: ``midlayer.*``, ``fc.weight``,
  ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``, optional ``embed_tokens.weight``;
  config.json is a Llama config plus ``draft_vocab_size`` (optional ``target_hidden_size``,
  ``eagle_config``).
- speculators / vLLM: ``layers.0.*`` and ``draft_id_to_target_id`` (or ``d2t``); config.json
  either a Llama config or a speculators config (``speculators_model_type: eagle3``, the layer's
  config under ``transformer_layer_config``).
Variant tensors: ``input_norm.weight`` (norm_before_fc), ``fc_norm.{i}.weight`` (fc_norm; SGLang's
older ``aux_norm_low|mid|high``), ``*.self_attn.{q,k}_norm.weight`` (a Qwen3 layer). Weights load
from safetensors, or from ``pytorch_model.bin`` through torch's weights-only unpickler (tensors
only, no code runs).

Heads written here (`head_config_json`, `write_head`) load as they are in EAGLE's reference
loader, vLLM and SGLang: their feature layers are the default ones every engine assumes, so no
ids are written; a top-level ``rope_theta`` and ``rope_scaling: null`` sit beside transformers
5's ``rope_parameters``; ``target_hidden_size`` and the target's embedding table are in the
checkpoint, which EAGLE's loader needs for a target without a sharded index.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass

import torch

from . import conventions
from .module import Eagle3Head, Eagle3Shape

# canonical parameter name <- checkpoint name (after a leading "model." is dropped)
_RENAMES = ((re.compile(r"^(midlayer|layers\.0)\."), "layer."),
            (re.compile(r"^draft_id_to_target_id$"), "d2t"),
            (re.compile(r"^aux_norm_low\."), "fc_norm.0."),
            (re.compile(r"^aux_norm_mid\."), "fc_norm.1."),
            (re.compile(r"^aux_norm_high\."), "fc_norm.2."))
_LAYER = ("hidden_norm", "input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
          "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
          "mlp.up_proj", "mlp.down_proj")
REQUIRED = ("fc.weight", "norm.weight", *(f"layer.{m}.weight" for m in _LAYER))
OPTIONAL = ("lm_head.weight", "d2t", "t2d", "embed_tokens.weight")
_HUB_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", "pytorch_model.bin",
              conventions.REPORT]
_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
              "partial_rotary_factor")


@dataclass(frozen=True)
class HeadConfig:
    """What config.json says about a head (before any weights are read)."""

    source: str  # folder or hub id, for messages
    raw: dict  # the config.json as read
    layout: conventions.Layout
    layer: dict  # the decoder layer's (Llama) config
    draft_vocab_size: int
    vocab_size: int
    hidden_size: int
    target_hidden_size: int
    variants: conventions.Variants
    verifier: str | None  # the target the head names, if any
    legacy: bool = False  # written by an earlier targetrows (eagle_config ids are inputs)

    def feature_tensors(self, n_features: int) -> set[str]:
        """The variant tensors this config declares."""
        v, out = self.variants, set()
        if v.norm_before_fc:
            out.add("input_norm.weight")
        if v.fc_norm:
            out |= {f"fc_norm.{i}.weight" for i in range(n_features)}
        if v.qk_norm:
            out |= {"layer.self_attn.q_norm.weight", "layer.self_attn.k_norm.weight"}
        return out


def head_config(path: str) -> HeadConfig | None:
    """The head config of a folder or hub id, or None when `path` is not an EAGLE-3 head (an
    ordinary model, a GGUF file, ...). A hub id costs one small download (config.json)."""
    raw, folder = _read_config(path)
    if raw is None or not conventions.is_eagle3(raw):
        return None
    return parse_config(raw, path, folder)


def _read_config(path: str) -> tuple[dict | None, str | None]:
    """(config.json, the folder holding it) of a local folder or a hub id."""
    if os.path.isdir(path):
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file):
            return None, None
    elif os.path.exists(path) or path.startswith((".", "/", "~")) or path.count("/") != 1:
        return None, None  # a file, or not a hub id
    else:
        from huggingface_hub import hf_hub_download

        try:
            file = hf_hub_download(path, "config.json")
        except Exception:  # no such repo or file, no network: the ordinary loader says it better
            return None, None
        try:  # a head written by train-eagle3 carries its report (`conventions.legacy_inputs`)
            hf_hub_download(path, conventions.REPORT)
        except Exception:
            pass
    with open(file) as f:
        return json.load(f), os.path.dirname(file)


def parse_config(raw: dict, source: str, folder: str | None = None) -> HeadConfig:
    """A head's config.json in any layout; variants this backend does not implement are refused
    naming their config key. `folder`: where it was read from (an earlier targetrows head is
    told apart by its training report there)."""
    conventions.check_keys(raw, source)
    layout = conventions.detect(raw)
    layer = raw.get("transformer_layer_config") or raw
    variants = conventions.variants(raw, layout, source)
    if raw.get("tie_word_embeddings") or layer.get("tie_word_embeddings"):
        raise ValueError(f"EAGLE-3 head {source!r}: config key tie_word_embeddings=true (lm_head "
                         "shared with the embedding) is not implemented")
    for key in ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads"):
        if key not in layer:
            raise ValueError(f"EAGLE-3 head {source!r}: config.json has no {key}")
    hidden = int(layer["hidden_size"])
    verifier = ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return HeadConfig(
        source=source,
        raw=raw,
        layout=layout,
        layer=dict(layer),
        draft_vocab_size=int(raw.get("draft_vocab_size") or layer["vocab_size"]),
        vocab_size=int(layer["vocab_size"]),
        hidden_size=hidden,
        target_hidden_size=int(raw.get("target_hidden_size") or layer.get("target_hidden_size")
                               or hidden),
        variants=variants,
        verifier=verifier,
        legacy=conventions.legacy_inputs(folder, raw),
    )


def feature_layers_for(config: HeadConfig, target_config,
                       target_name: str) -> conventions.FeatureLayers:
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
    return conventions.feature_layers(config.raw, int(target_config.num_hidden_layers),
                                      config.source, config.legacy)


def read_weights(path: str, config: HeadConfig | None = None,
                 n_features: int = 3) -> dict[str, torch.Tensor]:
    """The head's tensors under canonical names (``layer.*``, ``d2t``, ``fc_norm.{i}``), from
    safetensors or a weights-only ``pytorch_model.bin``; unknown or missing tensors, and
    variant tensors the config does not declare (or declares and lacks), are refused by name."""
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
    declared = config.feature_tensors(n_features) if config is not None else set()
    variant_names = {k for k in out if k.startswith(("input_norm.", "fc_norm.")) or
                     k.endswith(("q_norm.weight", "k_norm.weight"))}
    unknown = sorted(set(out) - set(REQUIRED) - set(OPTIONAL) - declared - variant_names)
    if unknown:
        raise ValueError(f"EAGLE-3 head {path!r} has tensors this backend does not implement: "
                         f"{unknown[:5]} (a variant of the head)")
    undeclared = sorted(variant_names - declared)
    if undeclared:
        raise ValueError(f"EAGLE-3 head {path!r} has tensors {undeclared[:4]} that its "
                         "config.json does not declare (fc_norm, norm_before_fc, a qwen3 layer): "
                         "its config and weights do not belong together")
    missing = [k for k in (*REQUIRED, *sorted(declared)) if k not in out]
    if missing:
        raise ValueError(f"EAGLE-3 head {path!r} lacks tensors {missing}")
    return out


def build_head(config: HeadConfig, weights: dict[str, torch.Tensor], n_features: int = 3,
               own_embedding: bool | None = None) -> Eagle3Head:
    """The head module from its config and canonical weights; head_dim comes from q_proj's shape
    (a head may have head_dim * heads != hidden_size). `own_embedding`: use the checkpoint's
    ``embed_tokens.weight`` (default: when it has one)."""
    from transformers import LlamaConfig

    layer = config.layer
    n_heads = int(layer["num_attention_heads"])
    n_kv = int(layer.get("num_key_value_heads") or n_heads)
    q_out = int(weights["layer.self_attn.q_proj.weight"].shape[0])
    if q_out % n_heads:
        raise ValueError(f"EAGLE-3 head {config.source!r}: q_proj has {q_out} outputs, not a "
                         f"multiple of num_attention_heads {n_heads}")
    v = config.variants
    shape = Eagle3Shape(
        hidden_size=config.hidden_size, target_hidden_size=config.target_hidden_size,
        intermediate_size=int(layer["intermediate_size"]), num_heads=n_heads, num_kv_heads=n_kv,
        head_dim=q_out // n_heads, vocab_size=config.vocab_size,
        draft_vocab_size=config.draft_vocab_size, n_features=n_features,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        hidden_act=layer.get("hidden_act", "silu"), norm_output=v.norm_output,
        norm_before_residual=v.norm_before_residual, norm_before_fc=v.norm_before_fc,
        fc_norm=v.fc_norm, qk_norm=v.qk_norm,
    )
    rope_from = layer if any(k in layer for k in _ROPE_KEYS) else config.raw
    rope = LlamaConfig(hidden_size=shape.hidden_size, num_attention_heads=n_heads,
                       head_dim=shape.head_dim,
                       **{k: rope_from[k] for k in _ROPE_KEYS if k in rope_from})
    head = Eagle3Head(shape, rope)
    if own_embedding is None:
        own_embedding = "embed_tokens.weight" in weights
    params = {k: v for k, v in weights.items() if k != "t2d"}
    if own_embedding:
        head.embed_tokens = torch.nn.Embedding(config.vocab_size, shape.hidden_size)
    else:
        params.pop("embed_tokens.weight", None)
    if "d2t" not in params:  # a full-vocabulary head
        if config.draft_vocab_size != config.vocab_size:
            raise ValueError(f"EAGLE-3 head {config.source!r}: draft_vocab_size "
                             f"{config.draft_vocab_size} < vocab_size but no d2t mapping")
        params["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    _check_t2d(config, params["d2t"], weights.get("t2d"))
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


def _check_t2d(config: HeadConfig, d2t: torch.Tensor, t2d: torch.Tensor | None) -> None:
    """t2d (a mask over the target vocabulary) must mark exactly the tokens d2t maps to."""
    if t2d is None:
        return
    target_ids = torch.arange(len(d2t)) + d2t.long()
    mask = torch.zeros(len(t2d), dtype=torch.bool)
    mask[target_ids.clamp(0, len(t2d) - 1)] = True
    if len(t2d) != config.vocab_size or not torch.equal(mask, t2d.bool()):
        raise ValueError(f"EAGLE-3 head {config.source!r}: its t2d mask does not mark the tokens "
                         "its d2t offsets map to; the vocabulary mapping is inconsistent")


def load_head(path: str, target_model, device, dtype: torch.dtype,
              target_name: str) -> tuple[Eagle3Head, tuple[int, ...]]:
    """(the head at `path` (folder or hub id), the target layers whose inputs it reads) for
    `target_model` (a transformers model), on `device` in `dtype`. The config is checked
    against the target before any weights are read; the embedding is found as the head's layout
    says (`Layout.embedding`). `targetrows.hf.loading.load_eagle3` binds it to its target."""
    config = head_config(path)
    if config is None:
        raise ValueError(f"{path!r} is not an EAGLE-3 head (its config.json has no "
                         "draft_vocab_size / speculators_model_type eagle3)")
    name = target_name
    layers = feature_layers_for(config, target_model.config, name)
    folder = path
    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        folder = snapshot_download(path, allow_patterns=_HUB_FILES)
    n_features = len(layers.inputs)
    weights = read_weights(folder, config, n_features)
    target_hidden = int(target_model.config.hidden_size)
    same_width = config.hidden_size == target_hidden
    own = "embed_tokens.weight" in weights and not (config.layout.embedding == "target"
                                                      and same_width)
    if not own and not same_width:
        raise ValueError(f"EAGLE-3 head {path!r} has no embed_tokens.weight, so it embeds with "
                         f"target {name!r}'s table of width {target_hidden}, but its hidden_size "
                         f"is {config.hidden_size}")
    if "lm_head.weight" not in weights:  # vLLM and SGLang take the target's then
        if config.draft_vocab_size != config.vocab_size or not same_width:
            raise ValueError(f"EAGLE-3 head {path!r} lacks lm_head.weight; only a head over the "
                             "target's whole vocabulary, of the target's width, can share its "
                             "output head")
        weights["lm_head.weight"] = target_model.get_output_embeddings().weight.detach().cpu()
    head = build_head(config, weights, n_features, own).to(device)
    for child, module in head.named_children():
        if child != "rotary":  # rotary frequencies stay float32, as in transformers' models
            module.to(dtype)
    return head, layers.inputs


# -- writing -------------------------------------------------------------------------------------


def head_config_json(layer: dict, draft_vocab_size: int, target_config,
                     feature_layers=None) -> dict:
    """config.json for a head written here: EAGLE/SpecForge's ``LlamaForCausalLMEagle3`` layout
    that EAGLE's reference loader, SGLang and vLLM all read as they are (see the module
    docstring). `layer`: the head layer's Llama config keys; `feature_layers`: the target layers
    (inputs) it reads, written only when they are not every engine's default, then under each
    engine's own key in its own convention."""
    config = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", **layer,
                  num_hidden_layers=1, draft_vocab_size=int(draft_vocab_size),
                  target_hidden_size=int(target_config.hidden_size), tie_word_embeddings=False)
    n_layers = int(target_config.num_hidden_layers)
    inputs = sorted(int(i) for i in feature_layers or conventions.default_inputs(n_layers))
    if tuple(inputs) != conventions.default_inputs(n_layers):
        if min(inputs) < 1:  # SGLang would fall back to its default layers without a word
            raise ValueError(f"feature layers {inputs}: layer 0's input (the embedding) has no "
                             "name in SGLang's and SpecForge's convention (layer outputs); "
                             "choose layers 1 and above")
        config["eagle_aux_hidden_state_layer_ids"] = inputs  # vLLM, speculators: inputs
        # SGLang, SpecForge: the outputs of the layers before
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in inputs],
                                  "use_aux_hidden_state": True}
    rope = getattr(target_config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(target_config, "rope_theta", None))
    if rope.get("rope_type", "default") not in ("default", None):
        config["rope_parameters"] = dict(rope)  # scaled rotary: transformers 5 and vLLM read it
        config["rope_scaling"] = dict(rope)
    else:
        config["rope_scaling"] = None  # EAGLE's loader accepts no transformers-5 rope dict
        if theta is not None:
            config["rope_parameters"] = {"rope_theta": float(theta), "rope_type": "default"}
    if theta is not None:
        config["rope_theta"] = float(theta)
    return config


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
