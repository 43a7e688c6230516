"""Grouped-query attention under a tree mask, done by torch's kernel instead of copying the cache.

Why. Hugging Face's "sdpa" attention hands grouped-query attention (fewer key/value heads than
query heads) to `scaled_dot_product_attention(enable_gqa=True)` only when there is no mask. A
pass with a custom 4D mask over more than one new token (every tree pass: verify passes and row
logs) first repeats the keys and values of the whole cache once per query group, a copy per
layer per pass. On the CPU, torch's own kernel takes the mask and the grouped heads together and
gives the same numbers (checked in the tests) without the copy.

`use_gqa_kernel(model)` switches a model that uses "sdpa" to this function ("sdpa_gqa"): the same
masks (Hugging Face's sdpa mask builder), the same function for every other pass. Elsewhere
(CUDA: torch's fused kernels take no mask with grouped heads) it keeps Hugging Face's own path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: torch.Tensor | None,
                     dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """`sdpa_attention_forward`, except a masked pass over several queries with grouped heads on
    the CPU: one `scaled_dot_product_attention(enable_gqa=True)` call, no repeated cache."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or attention_mask is None or query.shape[2] == 1
            or query.device.type != "cpu" or kwargs.get("position_bias") is not None
            or kwargs.get("softcap") is not None or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                         dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_gqa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_gqa_kernel(model) -> None:
    """Switch `model` (a Hugging Face model using "sdpa") to "sdpa_gqa", in place."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
