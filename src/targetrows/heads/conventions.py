"""How each engine reads an EAGLE-3 head, in one place: which layout a checkpoint is in, which
target layers its features come from and what the numbers in its config mean, which variants
of the head it declares, and how its embedding is found. The engines' own source is the
specification (docs/eagle3.md cites file and function for every rule below).

Feature layers are counted here as Hugging Face ``hidden_states`` indices, i.e. layer *inputs*:
id j is the residual stream entering layer j (0 = the embedding). Published configs name them
two ways, and the key says which:

    top-level ``eagle_aux_hidden_state_layer_ids``     layer inputs (vLLM, speculators: the
                                                       target keeps ``hidden_states[j]``)
    ``eagle_config.eagle_aux_hidden_state_layer_ids``  layer outputs (SGLang captures id + 1,
                                                       SpecForge trains on layer outputs)
    neither                                            inputs 2, L//2, L-3 (every engine's
                                                       default; EAGLE hard-codes them)

Both keys present must name the same layers, or the head is refused naming both readings.
Features are always concatenated in ascending layer order, whatever order a list has. A head
written by an earlier targetrows (before this convention) kept its layer inputs under
``eagle_config``; its training report beside the config tells it apart (`legacy_inputs`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

REPORT = "train_eagle3_report.json"  # what train-eagle3 writes beside a head


@dataclass(frozen=True)
class Layout:
    name: str
    engine: str  # whose code defines how it is read
    # where the head's own embedding comes from: "target" (SGLang: the target's whenever the
    # widths match, even over a checkpoint's own table), "own" (vLLM, speculators, EAGLE: the
    # checkpoint's table when it has one, else the target's)
    embedding: str
    # what `norm_output: true` means: "fed_back" (speculators, vLLM: the normed output goes
    # back into deeper levels, EAGLE-3.1), "before_head" (SpecForge: the final norm comes
    # before lm_head, its default; the output fed back stays unnormed), "ignored" (EAGLE)
    norm_output: str
    # `norm_before_residual` when the config has no such key: vLLM reads a speculators config
    # through its converter, which sets it true (transformers_utils/configs/speculators/algos.py
    # `update_eagle3`); vLLM's own Eagle3 layer and every other engine default to false
    norm_before_residual: bool = False


LAYOUTS = {
    "eagle": Layout("eagle", "EAGLE reference (SafeAILab/EAGLE, EaModel)", "own", "ignored"),
    "specforge": Layout("specforge", "SpecForge / SGLang (LlamaForCausalLMEagle3)", "target",
                        "before_head"),
    "speculators": Layout("speculators", "speculators / vLLM (Eagle3Speculator)", "own",
                          "fed_back", norm_before_residual=True),
    "vllm": Layout("vllm", "vLLM (Eagle3LlamaForCausalLM)", "own", "fed_back"),
}


def is_eagle3(raw: dict) -> bool:
    """A head's config.json, in any layout (an ordinary model's is not)."""
    archs = " ".join(raw.get("architectures") or []).lower()
    return raw.get("speculators_model_type") == "eagle3" or "eagle3" in archs or (
        "draft_vocab_size" in raw and ("eagle" in archs or "llamaforcausallm" in archs))


def detect(raw: dict) -> Layout:
    """The layout of a head's config.json: speculators (``speculators_model_type``), vLLM's own
    (``Eagle3LlamaForCausalLM``), the EAGLE/SpecForge ``LlamaForCausalLMEagle3`` config (or any
    with ``eagle_config``), else EAGLE's reference config (a Llama config with
    ``draft_vocab_size``)."""
    if raw.get("speculators_model_type") == "eagle3":
        return LAYOUTS["speculators"]
    archs = " ".join(raw.get("architectures") or []).lower()
    if "eagle3llama" in archs or "eagle3qwen" in archs:  # vLLM's own class names
        return LAYOUTS["vllm"]
    if "eagle3" in archs or "eagle_config" in raw:
        return LAYOUTS["specforge"]
    return LAYOUTS["eagle"]


@dataclass(frozen=True)
class FeatureLayers:
    inputs: tuple[int, ...]  # Hugging Face hidden_states indices, ascending
    source: str  # where they came from, for messages and `inspect-head`


def default_inputs(n_layers: int) -> tuple[int, ...]:
    return (2, n_layers // 2, n_layers - 3)


def feature_layers(raw: dict, n_layers: int, source: str, legacy: bool = False) -> FeatureLayers:
    """The target layers (as inputs, ascending) the head reads, for a target of `n_layers`
    layers; `legacy`: nested ids are an earlier targetrows head's inputs (`legacy_inputs`).
    Ids that the target does not have, or keys that disagree, are refused by name."""
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    readings = []
    if top:
        readings.append((tuple(sorted(int(i) for i in top)),
                         f"eagle_aux_hidden_state_layer_ids {list(top)} (layer inputs)"))
    if nested:
        shift = 0 if legacy else 1
        meaning = ("layer inputs: a head written by an earlier targetrows" if legacy
                   else "layer outputs, read as the inputs of the next layers")
        readings.append((tuple(sorted(int(i) + shift for i in nested)),
                         f"eagle_config.eagle_aux_hidden_state_layer_ids {list(nested)} "
                         f"({meaning})"))
    if len(readings) == 2 and readings[0][0] != readings[1][0]:
        raise ValueError(
            f"EAGLE-3 head {source!r}: its config names two sets of feature layers: "
            f"{readings[0][1]} = inputs {list(readings[0][0])}, and {readings[1][1]} = inputs "
            f"{list(readings[1][0])}; engines disagree on such a head (vLLM reads the first, "
            "SGLang the second): fix its config.json to one of them")
    if readings:
        inputs, where = readings[0]
    else:
        inputs, where = default_inputs(n_layers), "default: inputs of layers 2, L//2, L-3"
    if min(inputs) < 0 or max(inputs) >= n_layers:  # (a target under 8 layers repeats one)
        raise ValueError(f"EAGLE-3 head {source!r}: feature layers {list(inputs)} (from {where}) "
                         f"must be layer inputs in 0..{n_layers - 1} of a target with "
                         f"{n_layers} layers")
    return FeatureLayers(inputs, where)


def legacy_inputs(folder: str | None, raw: dict) -> bool:
    """Whether `folder` holds a head an earlier targetrows wrote, whose ``eagle_config`` ids are
    layer inputs: its training report names the same layers and the config has no top-level
    ids (heads written now keep their ids in each engine's own convention)."""
    if folder is None or not os.path.isfile(os.path.join(folder, REPORT)):
        return False
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not nested or raw.get("eagle_aux_hidden_state_layer_ids"):
        return False
    try:
        with open(os.path.join(folder, REPORT), encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError):
        return False
    return list(report.get("feature_layers") or []) == list(nested)


# Config keys a head may carry: its layer's (a Llama or Qwen config), and the keys the engines
# read for heads. Any other key is refused by name: it may change how the head computes, and a
# head read otherwise than its engine reads it drafts silently worse.
LAYER_KEYS = frozenset({
    "_name_or_path", "architectures", "attention_bias", "attention_dropout", "bos_token_id",
    "chunk_size_feed_forward", "dtype", "eos_token_id", "head_dim", "hidden_act", "hidden_size",
    "id2label", "initializer_range", "intermediate_size", "is_encoder_decoder", "label2id",
    "layer_types", "max_position_embeddings", "max_window_layers", "mlp_bias", "model_type",
    "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "output_attentions",
    "output_hidden_states", "pad_token_id", "pretraining_tp", "problem_type", "return_dict",
    "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta", "sliding_window",
    "tie_word_embeddings", "transformers_version", "use_cache", "use_sliding_window",
    "vocab_size", "torch_dtype", "bias", "partial_rotary_factor",
})
HEAD_KEYS = frozenset({
    "draft_vocab_size", "target_hidden_size", "eagle_config", "eagle_aux_hidden_state_layer_ids",
    "norm_output", "norm_before_residual", "norm_before_fc", "fc_norm", "use_aux_norm",
    "num_aux_hidden_states", "embed_requires_grad",
    # speculators
    "speculators_model_type", "speculators_version", "speculators_config",
    "transformer_layer_config", "auto_map",
})
EAGLE_CONFIG_KEYS = frozenset({"eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state",
                               "norm_before_fc"})


def check_keys(raw: dict, source: str) -> None:
    """Refuse a config key no engine's reading of an EAGLE-3 head explains."""
    layer = raw.get("transformer_layer_config") or {}
    unknown = sorted(set(raw) - LAYER_KEYS - HEAD_KEYS)
    unknown += [f"transformer_layer_config.{k}" for k in sorted(set(layer) - LAYER_KEYS)]
    unknown += [f"eagle_config.{k}" for k in sorted(set(raw.get("eagle_config") or {})
                                                    - EAGLE_CONFIG_KEYS)]
    if unknown:
        raise ValueError(f"EAGLE-3 head {source!r}: config keys {unknown} are unknown to this "
                         "backend (a variant of the head it cannot read as its engine does); "
                         "see `targetrows inspect-head` and docs/eagle3.md")


@dataclass(frozen=True)
class Variants:
    """The head's variants beyond EAGLE-3's plain layer (each False is the plain one)."""

    norm_output: bool = False  # the normed output is fed back to deeper levels (EAGLE-3.1)
    norm_before_residual: bool = False  # the residual is hidden_norm(h), not h
    norm_before_fc: bool = False  # one RMSNorm over the concatenated features (input_norm)
    fc_norm: bool = False  # one RMSNorm per feature before fc (fc_norm.{i})
    qk_norm: bool = False  # per-head RMSNorms of queries and keys (a Qwen3 layer)

    def names(self) -> list[str]:
        return [k for k, v in vars(self).items() if v]


def variants(raw: dict, layout: Layout, source: str) -> Variants:
    """The variants a config declares, read as its layout's engine reads them; a variant this
    backend does not implement is refused by its key."""
    layer = raw.get("transformer_layer_config") or raw
    eagle = raw.get("eagle_config") or {}

    def flag(key: str, default=False, nested: bool = False) -> bool:
        value = raw.get(key, eagle.get(key, default) if nested else default)
        return bool(value)

    model_type = str(layer.get("model_type", "llama"))
    if model_type not in ("llama", "qwen3"):
        raise ValueError(f"EAGLE-3 head {source!r}: layer model_type {model_type!r} is not "
                         "implemented (llama and qwen3 layers are)")
    if eagle.get("use_aux_hidden_state") is False:
        raise ValueError(f"EAGLE-3 head {source!r}: config key eagle_config.use_aux_hidden_state="
                         "false (a head without the target's layer features) is not implemented")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"EAGLE-3 head {source!r}: config key num_hidden_layers="
                         f"{layer['num_hidden_layers']}; only one-layer heads are implemented")
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        raise ValueError(f"EAGLE-3 head {source!r}: biases (config key attention_bias or "
                         "mlp_bias) are not implemented")
    if layout.name == "eagle":
        declared = [k for k in ("fc_norm", "norm_before_fc", "norm_before_residual",
                                "norm_output", "use_aux_norm") if raw.get(k)]
        if declared:  # EAGLE's loader ignores these keys: which engine was it made for?
            raise ValueError(f"EAGLE-3 head {source!r}: config keys {declared} in an EAGLE "
                             "reference config (architectures LlamaForCausalLM), whose loader "
                             "ignores them; name the head's layout with its architectures")
        return Variants()
    norm_output = False
    if layout.norm_output == "fed_back":
        norm_output = flag("norm_output")
    elif raw.get("norm_output", True) is False:  # SpecForge: logits lm_head(g), no final norm
        raise ValueError(f"EAGLE-3 head {source!r}: config key norm_output=false (SpecForge: no "
                         "final norm before lm_head) is not implemented")
    out = Variants(
        norm_output=norm_output,
        norm_before_residual=flag("norm_before_residual", layout.norm_before_residual),
        norm_before_fc=flag("norm_before_fc", nested=True),
        fc_norm=flag("fc_norm") or flag("use_aux_norm"),
        qk_norm=model_type == "qwen3",
    )
    if out.fc_norm and out.norm_before_fc:
        raise ValueError(f"EAGLE-3 head {source!r}: config keys fc_norm and norm_before_fc are "
                         "both set; speculators refuses that pair, and so does this backend")
    return out
