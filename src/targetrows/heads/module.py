"""The EAGLE-3 head's layer (as in the EAGLE reference code, SpecForge and vLLM's
``llama_eagle3.py``), written once: drafting (`targetrows.hf.eagle3.Eagle3Draft`), its static
steps and training (`targetrows.train.eagle3_train`) all run this module.

``fc`` projects the target's features (the residual stream entering three of its layers,
concatenated low | mid | high) to h; one decoder layer takes ``cat(input_layernorm(embed(x)),
hidden_norm(h))`` (width 2H, embedding first) into attention, adds h as the residual, then the
usual ``post_attention_layernorm`` and SwiGLU MLP; its output g is fed back as the next h; rows are
``lm_head(norm(g))`` over a reduced draft vocabulary, target id = d + d2t[d].

Variants (`Eagle3Shape`, read from a config by `targetrows.heads.conventions`): the normed
output norm(g) fed back instead of g (EAGLE-3.1, ``norm_output``), the residual taken after
hidden_norm (``norm_before_residual``), an RMSNorm over the concatenated features
(``norm_before_fc``) or one per feature (``fc_norm``) before fc, and per-head norms of queries
and keys before the rotation (a Qwen3 layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb


@dataclass(frozen=True)
class Eagle3Shape:
    """A head's sizes (from its config.json, head_dim from q_proj's shape)."""

    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target vocabulary the embedding and d2t refer to
    draft_vocab_size: int
    n_features: int  # target layers whose inputs fc reads (3)
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    norm_output: bool = False  # deeper levels read norm(g), not g (EAGLE-3.1)
    norm_before_residual: bool = False  # the layer's residual is hidden_norm(h)
    norm_before_fc: bool = False  # input_norm over the concatenated features
    fc_norm: bool = False  # fc_norm[i] over each feature
    qk_norm: bool = False  # q_norm, k_norm over each head (Qwen3's layer)


class RMSNorm(nn.Module):
    """Llama's RMSNorm: normalised in at least float32, scaled in the weights' dtype."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Eagle3Head(nn.Module):
    """The head's weights and its one-layer step. Parameter names are the canonical ones the
    checkpoint loader maps both layouts to (``layer.*`` for ``midlayer.*`` / ``layers.0.*``)."""

    def __init__(self, shape: Eagle3Shape, rope_config):
        super().__init__()
        s = shape
        h, q_width, kv_width = s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.shape = s
        self.fc = nn.Linear(s.n_features * s.target_hidden_size, h, bias=False)
        self.embed_tokens: nn.Embedding | None = None  # None: the target's embedding is used
        self.layer = nn.Module()
        self.layer.hidden_norm = RMSNorm(h, s.rms_norm_eps)
        self.layer.input_layernorm = RMSNorm(h, s.rms_norm_eps)
        self.layer.post_attention_layernorm = RMSNorm(h, s.rms_norm_eps)
        attn = self.layer.self_attn = nn.Module()
        attn.q_proj = nn.Linear(2 * h, q_width, bias=False)
        attn.k_proj = nn.Linear(2 * h, kv_width, bias=False)
        attn.v_proj = nn.Linear(2 * h, kv_width, bias=False)
        attn.o_proj = nn.Linear(q_width, h, bias=False)
        mlp = self.layer.mlp = nn.Module()
        mlp.gate_proj = nn.Linear(h, s.intermediate_size, bias=False)
        mlp.up_proj = nn.Linear(h, s.intermediate_size, bias=False)
        mlp.down_proj = nn.Linear(s.intermediate_size, h, bias=False)
        if s.qk_norm:
            attn.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
            attn.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        features = s.n_features * s.target_hidden_size
        if s.norm_before_fc:
            self.input_norm = RMSNorm(features, s.rms_norm_eps)
        if s.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(s.target_hidden_size, s.rms_norm_eps)
                                         for _ in range(s.n_features))
        self.act = ACT2FN[s.hidden_act]
        self.norm = RMSNorm(h, s.rms_norm_eps)
        self.lm_head = nn.Linear(h, s.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(s.draft_vocab_size, dtype=torch.long))
        self.rotary = LlamaRotaryEmbedding(rope_config)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's concatenated features [..., n_features * T] to h [..., H]."""
        s = self.shape
        if s.norm_before_fc:
            features = self.input_norm(features)
        elif s.fc_norm:
            parts = features.split(s.target_hidden_size, dim=-1)
            features = torch.cat([norm(x) for norm, x in zip(self.fc_norm, parts, strict=True)],
                                 dim=-1)
        return self.fc(features)

    def fed_back(self, g: torch.Tensor) -> torch.Tensor:
        """What a level hands the next as its h: g, or norm(g) for an EAGLE-3.1 head."""
        return self.norm(g) if self.shape.norm_output else g

    def step(self, h: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
             past_k: torch.Tensor, past_v: torch.Tensor, allowed: torch.Tensor):
        """One layer over q new entries of one sequence, after past keys and values, as
        plainly as it can be written (what training times; drafting runs the same halves
        over its cache, `targetrows.hf.eagle3`): h [q, H] (projected features or parents'
        g), embeds [q, H] of their tokens, positions [q]; past keys/values [kv_heads, S,
        head_dim]; `allowed` [1, 1, q, S + q] says which entries each query sees. Returns
        (g [q, H], keys, values): the past ones with the new entries appended."""
        q, k, v, residual = self.attention_inputs(h[None], embeds[None], positions[None])
        keys, values = torch.cat([past_k[None], k], dim=2), torch.cat([past_v[None], v], dim=2)
        s = self.shape
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed,
                                             enable_gqa=s.num_heads != s.num_kv_heads)
        g = self.layer_output(residual, out.transpose(1, 2).flatten(2))
        return g[0], keys[0], values[0]

    # The layer in two halves around its attention, which inference (over the cache of
    # `targetrows.hf.eagle3`) and training (`targetrows.train.eagle3_step.unrolled`, over the unrolled steps)
    # compute each its own way: everything else is written once, here.
    def attention_inputs(self, h: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor):
        """(queries, keys, values, residual) of q new entries per sequence: h and embeds
        [n, q, H], positions [n, q]; queries [n, heads, q, head_dim] and keys and values
        [n, kv_heads, q, head_dim], rotated to their positions."""
        s, layer, attn = self.shape, self.layer, self.layer.self_attn
        n, q_len = h.shape[:2]
        normed = layer.hidden_norm(h)
        residual = normed if s.norm_before_residual else h
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
        q = attn.q_proj(x).view(n, q_len, s.num_heads, s.head_dim)
        k = attn.k_proj(x).view(n, q_len, s.num_kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = attn.v_proj(x).view(n, q_len, s.num_kv_heads, s.head_dim).transpose(1, 2)
        cos, sin = self.rotary(x, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v, residual

    def layer_output(self, residual: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """g [n, q, H] from the residual and the attention's output [n, q, heads x head_dim]:
        the output projection, the residual, the MLP."""
        layer = self.layer
        h = residual + layer.self_attn.o_proj(attended)
        mlp = layer.mlp
        x = layer.post_attention_layernorm(h)
        return h + mlp.down_proj(self.act(mlp.gate_proj(x)) * mlp.up_proj(x))

    def draft_logits(self, g: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [rows, draft_vocab_size]."""
        return self.lm_head(self.norm(g))
