"""A new EAGLE-3 head for a target, before training: its draft vocabulary (from the target's top
tokens on its replies), its config.json in the EAGLE layout (the target's own layer shape and
rotary settings, one layer), its initial weights (`lm_head` from the target's output rows,
`norm` from its final norm, the layer from the target layer that reads the last feature layer),
and its tensors as `write_head` saves them."""

from __future__ import annotations

import torch

from targetrows.heads.module import Eagle3Head, Eagle3Shape

from .replies import TeacherData


# -- the draft vocabulary ----------------------------------------------------------------------
def draft_vocabulary(data: TeacherData, coverage: float, stop: set[int], vocab_size: int,
                     top_k: int = 1) -> torch.Tensor:
    """Sorted target ids: the smallest set of tokens covering `coverage` of the appearances of
    tokens among the target's `top_k` at the training reply positions (most frequent first,
    ties by lower id), plus `stop`. top_k = 1 counts the greedy reply tokens themselves; a
    larger top_k also counts the target's near-misses, which generalises to unseen replies."""
    if not 0 < coverage <= 1:
        raise ValueError(f"--coverage {coverage} must be in (0, 1]")
    if not 1 <= top_k <= data.top.shape[1]:
        raise ValueError(f"--vocab-top-k {top_k} must be between 1 and the {data.top.shape[1]} "
                         "top tokens the replies keep")
    seen = data.top[:, :top_k].reshape(-1).long()
    counts = torch.bincount(seen[seen < vocab_size], minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))[: int((counts > 0).sum())]
    cum = counts[order].cumsum(0).double() / max(1, int(counts.sum()))
    n = int(torch.searchsorted(cum, torch.tensor(coverage, dtype=torch.float64)).item()) + 1
    chosen = set(order[: min(n, len(order))]) | {s for s in stop if s < vocab_size}
    return torch.tensor(sorted(chosen))


def coverage_of(draft_ids: torch.Tensor, data: TeacherData) -> float:
    """Share of `data`'s reply tokens inside the draft vocabulary."""
    replies = torch.cat([torch.tensor(s[p:]) for s, p in zip(data.sequences, data.prompt_lens,
                                                                  strict=True)])
    return float(torch.isin(replies, draft_ids).float().mean())


# -- the head ----------------------------------------------------------------------------------
def layer_config(target_config) -> dict:
    """The head layer's Llama config keys: the target's own layer shape."""
    t = target_config
    return dict(
        hidden_size=int(t.hidden_size), intermediate_size=int(t.intermediate_size),
        num_attention_heads=int(t.num_attention_heads),
        num_key_value_heads=int(getattr(t, "num_key_value_heads", None) or t.num_attention_heads),
        head_dim=int(getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads),
        vocab_size=int(t.vocab_size), rms_norm_eps=float(getattr(t, "rms_norm_eps", 1e-6)),
        hidden_act=getattr(t, "hidden_act", "silu"),
        max_position_embeddings=int(t.max_position_embeddings), torch_dtype="float32",
    )


def new_head(target, draft_ids: torch.Tensor, feature_layers, init_from_target: bool,
             seed: int, init_layer: bool = False) -> tuple[Eagle3Head, dict]:
    """A fresh head for `target` (a transformers model) and its config.json; `init_layer`
    starts its layer as a copy of the target's (`copy_target_layer`)."""
    from transformers import LlamaConfig

    from targetrows.heads.checkpoint import head_config_json, parse_config

    config = head_config_json(layer_config(target.config), len(draft_ids), target.config,
                              feature_layers)
    parsed = parse_config(config, "train-eagle3")
    rope = LlamaConfig(hidden_size=parsed.hidden_size, num_attention_heads=config[
        "num_attention_heads"], head_dim=config["head_dim"],
        **{k: config[k] for k in ("rope_theta", "rope_scaling", "rope_parameters",
                                  "max_position_embeddings") if k in config})
    shape = Eagle3Shape(
        hidden_size=parsed.hidden_size, target_hidden_size=parsed.target_hidden_size,
        intermediate_size=config["intermediate_size"], num_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"], head_dim=config["head_dim"],
        vocab_size=parsed.vocab_size, draft_vocab_size=len(draft_ids),
        n_features=len(feature_layers), rms_norm_eps=config["rms_norm_eps"],
        hidden_act=config["hidden_act"])
    torch.manual_seed(seed)
    head = Eagle3Head(shape, rope)
    head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
    if init_from_target:
        with torch.no_grad():
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[draft_ids])
            final_norm = getattr(target.base_model, "norm", None)
            if final_norm is not None:
                head.norm.weight.copy_(final_norm.weight)
    if init_layer:
        copy_target_layer(head, target, feature_layers[-1])
    return head, config


@torch.no_grad()
def copy_target_layer(head: Eagle3Head, target, layer: int, fc_scale: float = 0.1) -> None:
    """Start the head's layer as the target's layer `layer` (the one that reads the last
    feature layer), and `fc` as a pass-through of that feature plus `fc_scale` x its random
    start. Then, with the embedding's half of q/k/v at zero, the head's first step is exactly
    that target layer on that feature (a test checks this); the embedding's half keeps its random
    start, to be learnt. What the head's layer has no place for is left out: attention biases
    (Qwen2) and the per-head norms of queries and keys (Qwen3); there the copy is a start near
    that layer, not the layer.

    A head started at random must learn to read the target's features from a few minutes of
    replies; one started as a target layer already reads them as the target does."""
    src, h = target.base_model.layers[layer], head.shape.hidden_size
    slot = head.shape.n_features - 1  # the last feature slot holds `layer`'s input
    head.fc.weight.mul_(fc_scale)
    head.fc.weight[:, slot * h : (slot + 1) * h] += torch.eye(h)
    mine, theirs = head.layer.self_attn, src.self_attn
    for name in ("q_proj", "k_proj", "v_proj"):  # inputs: [embedding, features]
        getattr(mine, name).weight[:, h:] = getattr(theirs, name).weight
    mine.o_proj.weight.copy_(theirs.o_proj.weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(head.layer.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
    head.layer.hidden_norm.weight.copy_(src.input_layernorm.weight)
    head.layer.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)


def head_tensors(head: Eagle3Head, vocab_size: int,
                 embedding: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The head's canonical tensors for `write_head`: weights, d2t, the t2d mask and, given the
    target's `embedding` table (which the head embeds with, frozen), that table as the head's
    own ``embed_tokens.weight`` (what EAGLE's reference loader needs; see
    `targetrows.heads.checkpoint`)."""
    tensors = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.arange(len(head.d2t)) + head.d2t] = True
    tensors["t2d"] = t2d
    if embedding is not None:
        tensors["embed_tokens.weight"] = embedding.detach()[:vocab_size].float().contiguous()
    return tensors


def target_rows(target, draft_ids: torch.Tensor) -> torch.Tensor:
    """The target's output rows of the draft vocabulary (soft labels come from these)."""
    return target.get_output_embeddings().weight[draft_ids].detach().float()
