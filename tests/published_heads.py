"""The paper's three published EAGLE-3 heads and one speculators-format head, as their
checkpoints are laid out, scaled down: the exact config.json key sets and tensor names, every
size shrunk so a tiny target reads them (hidden 64; the draft vocabulary 120 of 272).

The hub cannot be reached from the machines this is developed on, so each layout is taken from
the code that wrote the head, named beside it, and from the engines' tests that rebuild it:

- yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: EAGLE's training config (eagle/traineagle3/config.json;
  the same keys in SpecForge's configs/llama3-8B-eagle3.json, and in TensorRT-LLM's tests of
  this head) under the LlamaForCausalLMEagle3 architecture; weights in pytorch_model.bin
  without the frozen embedding (EAGLE's trainer saves with exclude_frozen_parameters).
- Tengyunw/qwen3_8b_eagle3 and WhiFlash/Qwen3-4B-EAGLE3: SpecForge's configs/qwen3-8b-eagle3.json
  and configs/qwen3-4b-eagle3.json (Qwen3-4B's heads are 32 x 128 wide over a hidden size of
  2560: head_dim times heads is not the hidden size), safetensors without the embedding
  (SpecForge's export drops it).
- a speculators head (RedHatAI's *-speculator.eagle3 are written by speculators): the keys and
  tensors speculators 0.9.0's save_pretrained writes.
"""

LAYER = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=272)
DRAFT_VOCAB = 120

HEADS = {
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": dict(
        file="pytorch_model.bin", prefix="midlayer.", d2t="d2t",
        config={"architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 1,
                "eos_token_id": 2, "hidden_act": "silu", "initializer_range": 0.02,
                "max_position_embeddings": 2048, "model_type": "llama", "num_hidden_layers": 1,
                "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
                "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True,
                "draft_vocab_size": DRAFT_VOCAB, **LAYER},
        tensors=("layer", "fc", "norm", "lm_head", "d2t", "t2d"), head_dim=16),
    "Tengyunw/qwen3_8b_eagle3": dict(
        file="model.safetensors", prefix="midlayer.", d2t="d2t",
        config={"architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False,
                "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 16,
                "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 40960,
                "max_window_layers": 36, "model_type": "llama", "num_hidden_layers": 1,
                "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
                "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
                "draft_vocab_size": DRAFT_VOCAB, **LAYER},
        tensors=("layer", "fc", "norm", "lm_head", "d2t", "t2d"), head_dim=16),
    "WhiFlash/Qwen3-4B-EAGLE3": dict(
        file="model.safetensors", prefix="midlayer.", d2t="d2t",
        config={"architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False,
                "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 32,
                "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 40960,
                "max_window_layers": 36, "model_type": "llama", "num_hidden_layers": 1,
                "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
                "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
                "draft_vocab_size": DRAFT_VOCAB, **LAYER},
        tensors=("layer", "fc", "norm", "lm_head", "d2t", "t2d"), head_dim=32),
    "speculators (RedHatAI/*-speculator.eagle3)": dict(
        file="model.safetensors", prefix="layers.0.", d2t="d2t",
        config={"architectures": ["Eagle3DraftModel"],
                "auto_map": {"": "eagle3.Eagle3SpeculatorConfig"},
                "draft_vocab_size": DRAFT_VOCAB, "dtype": "bfloat16",
                "eagle_aux_hidden_state_layer_ids": [1, 4, 6], "embed_requires_grad": False,
                "fc_norm": False, "norm_before_fc": False, "norm_before_residual": False,
                "norm_output": False,
                "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                       "proposal_methods": [{"proposal_type": "greedy",
                                                             "speculative_tokens": 3}],
                                       "verifier": {"architectures": ["LlamaForCausalLM"],
                                                    "name_or_path": "org/target"}},
                "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
                "target_hidden_size": 64, "tie_word_embeddings": False,
                "transformer_layer_config": {
                    "attention_bias": False, "attention_dropout": 0.0, "head_dim": 16,
                    "hidden_act": "silu", "initializer_range": 0.02,
                    "max_position_embeddings": 1024, "mlp_bias": False, "model_type": "llama",
                    "num_hidden_layers": 1, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
                    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
                    "tie_word_embeddings": False, "use_cache": True, **LAYER},
                "transformers_version": "5.19.0"},
        tensors=("layer", "fc", "norm", "lm_head", "d2t", "t2d", "embed_tokens"), head_dim=16),
}


def write(folder, name: str, seed: int = 0, extra_tensor: str | None = None,
          config_overrides: dict | None = None) -> str:
    """One head of `HEADS`, with random weights, into `folder`; returns the folder."""
    import json
    import os

    import torch

    spec = HEADS[name]
    h, k = LAYER["hidden_size"], spec["head_dim"]
    q, kv, m = LAYER["num_attention_heads"] * k, LAYER["num_key_value_heads"] * k, 96
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(shape, generator=gen) * 0.3

    layer = {"self_attn.q_proj.weight": rand(q, 2 * h), "self_attn.k_proj.weight": rand(kv, 2 * h),
             "self_attn.v_proj.weight": rand(kv, 2 * h), "self_attn.o_proj.weight": rand(h, q),
             "mlp.gate_proj.weight": rand(m, h), "mlp.up_proj.weight": rand(m, h),
             "mlp.down_proj.weight": rand(h, m)}
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        layer[f"{norm}.weight"] = 1.0 + rand(h)
    tensors = {spec["prefix"] + name: t for name, t in layer.items()}
    vocab = LAYER["vocab_size"]
    keep = torch.randperm(vocab, generator=gen)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    tensors.update({"fc.weight": rand(h, 3 * h), "norm.weight": 1.0 + rand(h),
                    "lm_head.weight": rand(DRAFT_VOCAB, h) * 4,
                    spec["d2t"]: keep - torch.arange(DRAFT_VOCAB), "t2d": t2d})
    if "embed_tokens" in spec["tensors"]:
        tensors["embed_tokens.weight"] = rand(vocab, h) * 3
    if extra_tensor:
        tensors[extra_tensor] = torch.ones(h)
    os.makedirs(folder, exist_ok=True)
    config = dict(spec["config"], **(config_overrides or {}))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    if spec["file"] == "pytorch_model.bin":
        torch.save(tensors, os.path.join(folder, "pytorch_model.bin"))
    else:
        from safetensors.torch import save_file

        save_file({n: t.contiguous() for n, t in tensors.items()},
                  os.path.join(folder, "model.safetensors"))
    return str(folder)
