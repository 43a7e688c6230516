"""Attention for batched sampling on the CPU: two matrix products per layer where torch's fused
kernel is slow.

Why. The self-written prompts (`targetrows.train.self_prompts`) are sampled 128 rows at a time
from one shared prefix, so the rows need no padding mask. For an unmasked pass over one new
token, Hugging Face's sdpa path hands grouped-query attention to torch's kernel with
`enable_gqa`, and on the CPU that kernel does a small piece of work per (row, head), several
times slower than the two products here at the batches the prompts are sampled in. With a
padding mask
(the replies' batches), Hugging Face already folds the query groups into one query per key/value
head, and that path is as fast as this one: those passes, a batch-1 decoder's, and every pass
with more than one new token keep torch's kernel.

How. The query heads that share a key/value head are stacked into one matrix (query head h reads
key/value head h // groups, as Hugging Face's `repeat_kv` has it), so each layer is one batched
product for the scores and one for the output. Scores and softmax are in float32, as torch's
kernel keeps them for bfloat16 inputs (float64 inputs stay float64).

`batched_attention(model)` switches a Hugging Face model to this function ("grouped_matmul")
for the duration of a block and back afterwards.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "grouped_matmul"


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      scaling: float) -> torch.Tensor:
    """softmax(q k^T * scaling) v with grouped heads: query [B, H, L, D], key and value
    [B, KV, T, D] (KV divides H). Returns [B, H, L, D] in value's dtype."""
    b, h, q_len, d = query.shape
    kv = key.shape[1]
    groups = h // kv
    wide = torch.promote_types(query.dtype, torch.float32)  # float32, or float64 if given
    scores = query.reshape(b, kv, groups * q_len, d).to(wide) @ key.to(wide).transpose(-1, -2)
    scores.mul_(scaling)
    probs = scores.softmax(-1).to(value.dtype)
    return (probs @ value).view(b, h, q_len, -1)


def grouped_matmul_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: torch.Tensor | None,
                           dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """Hugging Face's attention interface: `grouped_attention` for an unmasked one-token pass
    on the CPU, Hugging Face's sdpa path for every other."""
    if (attention_mask is not None or query.shape[2] != 1 or query.device.type != "cpu"
            or dropout or query.shape[1] % key.shape[1]
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return grouped_attention(query, key, value, scale).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_matmul_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def batched_attention(model):
    """Within the block, `model` (a Hugging Face model using sdpa) runs its attention through
    `grouped_matmul_forward`; other implementations (eager) are left as they are."""
    before = getattr(model.config, "_attn_implementation", None)
    if before != "sdpa":
        yield model
        return
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)
