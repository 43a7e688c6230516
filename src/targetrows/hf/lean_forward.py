"""A lean forward pass for Llama-family targets on the CPU: the same operations as Hugging Face's
forward, in the same order and dtypes, without its per-layer Python and with the products that
read one input fused.

Why. On a 2-core CPU a one-token step of a 135M-parameter model spends about a quarter of its
time outside the kernels: module calls, keyword plumbing, mask and cache bookkeeping, three
small query/key/value products and two gate/up products per layer where one each would do.
`LeanForward` runs the decoder layers as plain functions over the model's own weights, with
Hugging Face's RMSNorm, rotary and attention operations, and where the linear layers are
prepacked for oneDNN (`targetrows.hf.packed`, the CPU default) one product for q|k|v and one for
gate|up per layer (oneDNN's sums do not depend on the matrix's width: the same outputs to the
bit). The result: every row, KV entry and feature equal to Hugging Face's forward to the bit
(the tests check all pass kinds on tiny Llama, Qwen2 and Qwen3 models, in float64, float32 and
bfloat16), in less time (`benchmarks/step_profile.py`; docs/measurements.md).

`lean_forward(model)` returns None where the model is not one it reproduces exactly (another
architecture or a GPU: Hugging Face's forward is used there). `refresh()` rebuilds the fused
weights of any weight changed since (an optimiser step, a `load_state_dict`); `HFModel` calls it
whenever it empties its cache, the one time a weight may change (cached keys and values would
be stale too), not on every pass, where checking 270 weights costs a millisecond.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .batched_attention import grouped_attention
from .packed import BATCH_HINT, PackedLinear

# architectures whose decoder layer is exactly: RMSNorm, attention (q/k/v, optional per-head
# q/k RMSNorm as in Qwen3, rotary, grouped-query SDPA, o), residual, RMSNorm, gated MLP, residual
SUPPORTED = ("llama", "qwen2", "qwen3")
PACKABLE = (torch.float32, torch.bfloat16)  # dtypes oneDNN's prepacked products take


def lean_forward(model, anywhere: bool = False) -> LeanForward | None:
    """A `LeanForward` over `model` (a Hugging Face causal LM), or None where it would not
    reproduce the model's own forward: another architecture, weights off the CPU, sliding or
    custom attention. `anywhere`: on any device too (the static-shape passes of
    `targetrows.hf.static_pass`, which a CUDA graph captures)."""
    config = model.config
    if getattr(config, "model_type", None) not in SUPPORTED:
        return None
    if not anywhere and any(p.device.type != "cpu" for p in model.parameters()):
        return None
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "sdpa_gqa"):
        return None  # eager attention takes its own softmax: not the same numbers
    decoder = model.get_decoder()
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        if (getattr(attn, "sliding_window", None) is not None
                or not all(hasattr(n, "variance_epsilon") for n in norms)
                or not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))):
            return None
    return LeanForward(model)


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm, operation for operation (float32 inside)."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * xf.to(x.dtype)


class _Linear:
    """The products of one or more `nn.Linear` modules that read the same input. Prepacked for
    oneDNN (the modules' dtype allows it): one product with their weights stacked on the output
    dim, which gives each module's outputs to the bit. Otherwise each module's own `F.linear`
    (MKL's sums depend on the matrix's width: fusing would change the rounding)."""

    def __init__(self, modules):
        self.modules = list(modules)
        self.sizes = [int(m.weight.shape[0]) for m in self.modules]
        self._key = None
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the fused or shared weight if a module's weight changed since the last call."""
        key = tuple((m.weight.data_ptr(), None if m.weight.is_inference() else m.weight._version)
                    for m in self.modules)
        if key != self._key:
            self._build()
            self._key = key

    def _build(self) -> None:
        first = self.modules[0]
        self.packed = first.weight.dtype in PACKABLE and all(
            isinstance(m, PackedLinear) and m.packed_dtype == m.weight.dtype for m in self.modules)
        if not self.packed:
            return
        if len(self.modules) == 1:
            self._weight = first._packed_weight()  # shared with the module: no second copy
        else:
            weight = torch.cat([m.weight.detach() for m in self.modules], dim=0)
            self._weight = torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
        biases = [m.bias for m in self.modules]
        self._bias = None if all(b is None for b in biases) else torch.cat([
            b.detach() if b is not None else first.weight.new_zeros(n)
            for b, n in zip(biases, self.sizes, strict=True)
        ])

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each module's output for input `x`."""
        if not self.packed:
            return tuple(F.linear(x, m.weight, m.bias) for m in self.modules)
        out = torch.ops.mkldnn._linear_pointwise(x, self._weight, self._bias, "none", [], "")
        return out.split(self.sizes, dim=-1) if len(self.sizes) > 1 else (out,)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.parts(x)[0]


class LeanForward:
    """Hugging Face's forward of a Llama/Qwen2/Qwen3 causal LM at batch 1 (or over a batch of
    lanes, `targetrows.hf.lanes`), over the model's own weights and a `targetrows.hf.cache`
    cache (see the module docstring)."""

    def __init__(self, model):
        decoder = model.get_decoder()
        self.embed = decoder.embed_tokens
        self.rotary = decoder.rotary_emb
        self.norm = decoder.norm
        self.head = _Linear([model.get_output_embeddings()])
        self.layers = []
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(dict(
                norm1=layer.input_layernorm, norm2=layer.post_attention_layernorm,
                qkv=_Linear([attn.q_proj, attn.k_proj, attn.v_proj]), o=_Linear([attn.o_proj]),
                q_norm=getattr(attn, "q_norm", None), k_norm=getattr(attn, "k_norm", None),
                head_dim=int(attn.head_dim), scaling=float(attn.scaling),
                gate_up=_Linear([mlp.gate_proj, mlp.up_proj]), down=_Linear([mlp.down_proj]),
                act=mlp.act_fn,
            ))

    def refresh(self) -> None:
        """Rebuild the products whose weights changed since the last refresh (or construction)."""
        self.head.refresh()
        for layer in self.layers:
            for product in layer.values():
                if isinstance(product, _Linear):
                    product.refresh()

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                 cache, keep: torch.Tensor, capture: dict[int, torch.Tensor] | None = None
                 ) -> torch.Tensor:
        """Logits [b, len(keep), V] of one pass over `ids` [b, q] at `positions` [b, q], after
        the entries `cache` holds. `mask`: None (a causal chain, batch 1) or a 4D additive
        float mask [b, 1, q, past + q] (the batched passes of `targetrows.hf.lanes`).
        `capture`, if given, receives each layer's input, as Hugging Face's
        ``hidden_states[i]``."""
        q_len = ids.shape[1]
        past = cache.get_seq_length()
        x = self.embed(ids)
        cos, sin = self.rotary(x, positions)
        causal = False
        if mask is None and q_len > 1:
            if past:  # Hugging Face's sdpa mask: a boolean one (True = attend)
                rows = torch.arange(q_len, device=ids.device)[:, None] + past
                mask = torch.arange(past + q_len, device=ids.device)[None, :] <= rows
                mask = mask[None, None]
            else:  # the first pass of a prompt: Hugging Face passes is_causal
                causal = True
        for i, layer in enumerate(self.layers):
            if capture is not None:
                capture[i] = x
            x = x + self._attention(i, layer, _rms_norm(x, layer["norm1"]), cos, sin, mask,
                                    causal, cache)
            h = _rms_norm(x, layer["norm2"])
            gate, up = layer["gate_up"].parts(h)
            x = x + layer["down"](layer["act"](gate) * up)
        x = _rms_norm(x[:, keep], self.norm)
        return self.head(x)

    def _attention(self, i: int, layer: dict, h: torch.Tensor, cos, sin, mask, causal: bool,
                   cache) -> torch.Tensor:
        batch, q_len, dim = h.shape[0], h.shape[1], layer["head_dim"]
        q, k, v = layer["qkv"].parts(h)
        q, k, v = (t.view(batch, q_len, -1, dim) for t in (q, k, v))
        if layer["q_norm"] is not None:  # Qwen3: RMSNorm over each head, before rotary
            q, k = _rms_norm(q, layer["q_norm"]), _rms_norm(k, layer["k_norm"])
        q, k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        keys, values = cache.layers[i].update(k, v.transpose(1, 2))
        if batch > 1 and q_len == 1 and q.shape[1] % keys.shape[1] == 0 and q.is_cpu:
            # one query per lane of a batch: two products, several times faster on the CPU than
            # torch's kernel, which works per (row, head) (`batched_attention`)
            out = grouped_attention(q, keys, values, layer["scaling"], mask)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                 is_causal=causal, scale=layer["scaling"],
                                                 enable_gqa=True)
        return layer["o"](out.transpose(1, 2).reshape(batch, q_len, -1))
