"""Tiny random-weight EAGLE-3 heads written as checkpoints, in both layouts, for tests,
examples and the GPU check (`tiny_models` makes their targets).

``save_tiny_head(folder, target_config, layout="eagle")`` writes what a published head folder
holds: config.json plus the tensors under the EAGLE/SpecForge names (``midlayer.*``, ``d2t``,
``t2d``) or the vLLM/speculators ones (``layers.0.*``, ``draft_id_to_target_id``, a speculators
config), as safetensors or a pickle ``pytorch_model.bin``.
"""

from __future__ import annotations

import os

import torch

from targetrows.heads.checkpoint import write_head

LAYER_TENSORS = {  # name -> shape, given hidden H, q width Q, kv width K, intermediate M
    "hidden_norm.weight": lambda H, Q, K, M: (H,),
    "input_layernorm.weight": lambda H, Q, K, M: (H,),
    "post_attention_layernorm.weight": lambda H, Q, K, M: (H,),
    "self_attn.q_proj.weight": lambda H, Q, K, M: (Q, 2 * H),
    "self_attn.k_proj.weight": lambda H, Q, K, M: (K, 2 * H),
    "self_attn.v_proj.weight": lambda H, Q, K, M: (K, 2 * H),
    "self_attn.o_proj.weight": lambda H, Q, K, M: (H, Q),
    "mlp.gate_proj.weight": lambda H, Q, K, M: (M, H),
    "mlp.up_proj.weight": lambda H, Q, K, M: (M, H),
    "mlp.down_proj.weight": lambda H, Q, K, M: (H, M),
}


def draft_vocab(vocab_size: int, draft_vocab_size: int, seed: int = 0) -> torch.Tensor:
    """Sorted target ids of a reduced draft vocabulary (the first ids up to 8, then random)."""
    if draft_vocab_size >= vocab_size:
        return torch.arange(vocab_size)
    first = min(8, draft_vocab_size - 1)
    gen = torch.Generator().manual_seed(seed + 7)
    rest = torch.randperm(vocab_size - first, generator=gen)[: draft_vocab_size - first] + first
    return torch.cat([torch.arange(first), rest.sort().values])


def tiny_head_tensors(target_config, hidden: int | None = None, n_heads: int = 4, n_kv: int = 2,
                      head_dim: int = 20, intermediate: int = 96, draft_vocab_size: int | None = None,
                      seed: int = 0, scale: float = 0.3, embed: bool = False) -> dict:
    """Random canonical tensors of a head for `target_config` (head_dim * n_heads != hidden on
    purpose, like Qwen3-4B heads). A head of another `hidden` size needs ``embed=True``."""
    V, T = int(target_config.vocab_size), int(target_config.hidden_size)
    hidden = T if hidden is None else hidden  # without its own embedding: the target's width
    dv = V if draft_vocab_size is None else draft_vocab_size
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen) * scale

    Q, K = n_heads * head_dim, n_kv * head_dim
    out = {f"layer.{name}": rand(*shape(hidden, Q, K, intermediate))
           for name, shape in LAYER_TENSORS.items()}
    for name in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        out[f"layer.{name}.weight"] += 1.0
    out["fc.weight"] = rand(hidden, 3 * T)
    out["norm.weight"] = 1.0 + rand(hidden)
    out["lm_head.weight"] = rand(dv, hidden) * 4
    ids = draft_vocab(V, dv, seed)
    out["d2t"] = ids - torch.arange(dv)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    out["t2d"] = t2d
    if embed:
        out["embed_tokens.weight"] = rand(V, hidden) * 3
    return out


def save_tiny_head(folder, target_config, layout: str = "eagle", safe: bool = True,
                   layer_ids=None, config_overrides: dict | None = None, **sizes) -> str:
    """Write a tiny head folder for a target with `target_config`; returns the folder.
    `layer_ids`: the target layers (inputs) it reads, written in the layout's own convention
    (``eagle_config`` ids are layer outputs, a speculators config's top-level ids inputs)."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    tensors = tiny_head_tensors(target_config, **sizes)
    hidden = tensors["fc.weight"].shape[0]
    n_heads = sizes.get("n_heads", 4)
    layer = dict(
        model_type="llama", hidden_size=hidden,
        intermediate_size=tensors["layer.mlp.up_proj.weight"].shape[0],
        num_attention_heads=n_heads, num_key_value_heads=sizes.get("n_kv", 2), num_hidden_layers=1,
        vocab_size=int(target_config.vocab_size), rms_norm_eps=1e-6, hidden_act="silu",
        max_position_embeddings=2048, rope_theta=10000.0,
    )
    dv = tensors["lm_head.weight"].shape[0]
    if layout == "eagle":
        config = dict(layer, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=dv,
                      target_hidden_size=int(target_config.hidden_size))
        if layer_ids is not None:  # SGLang and SpecForge name layer outputs
            if min(layer_ids) < 1:
                raise ValueError("the embedding (input 0) is no layer's output: use the "
                                 "speculators layout")
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids":
                                      [i - 1 for i in layer_ids], "use_aux_hidden_state": True}
    elif layout == "speculators":
        config = dict(speculators_model_type="eagle3", architectures=["Eagle3Speculator"],
                      transformer_layer_config=layer, draft_vocab_size=dv, norm_before_residual=False,
                      target_hidden_size=int(target_config.hidden_size),
                      speculators_config={"algorithm": "eagle3",
                                          "verifier": {"name_or_path": "tiny-target"}})
        if layer_ids is not None:  # vLLM and speculators name layer inputs
            config["eagle_aux_hidden_state_layer_ids"] = list(layer_ids)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    config.update(config_overrides or {})
    write_head(folder, tensors, config, layout, safe)
    return folder
