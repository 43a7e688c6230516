"""The forward pass of Llama, Qwen2 and Qwen3 models over the one cache (`LeanForward`): every
pass of a target or standalone draft, on every device and at every batch size, eager or
captured as a CUDA graph.

It runs the decoder layers as plain functions over the model's own weights, with Hugging
Face's arithmetic (RMSNorm in float32, rotary, grouped-query attention, gated MLP), written
for few kernels a layer, since a GPU's eager pass and a CPU's small one are bound by their
operations' count, not their work (`benchmarks/layer_ops.py` counts them):

- one product for q|k|v and one for gate|up (prepacked for oneDNN on the CPU, where its sums
  do not depend on the matrix's width; elsewhere the modules' weights become views of one
  matrix, no second copy);
- RMSNorm as torch's fused `rms_norm` (the same numbers as Hugging Face's, float64 aside,
  which Hugging Face normalises in float32 and so do we);
- rotary from a table of cos and sin made once per cache size, gathered once a pass; q and k
  rotated together, as x cos + roll(x) sin (Hugging Face's rotate_half, to the bit);
- attention reads the grouped key/value heads as they are: the query heads that share one are
  folded into its query rows ([rows, kv_heads, groups x width, dim]), so one attention call
  with a mask serves them, with no copy of the cache per group, and on a GPU a fused kernel
  that takes a mask applies. It reads only the pass's span of entries (`PassInputs.span`).

`make_forward(model)` gives this forward where it reproduces the model, and Hugging Face's
own forward over the same cache elsewhere (`targetrows.hf.hf_forward`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .packed import BATCH_HINT, PackedLinear

# architectures whose decoder layer is exactly: RMSNorm, attention (q/k/v, optional per-head
# q/k RMSNorm as in Qwen3, rotary, grouped-query attention, o), residual, RMSNorm, gated MLP,
# residual
SUPPORTED = ("llama", "qwen2", "qwen3")
PACKABLE = (torch.float32, torch.bfloat16)  # dtypes oneDNN's prepacked products take


def make_forward(model):
    """The forward of `model`'s passes: `LeanForward` where it reproduces the model, else
    Hugging Face's own (`targetrows.hf.hf_forward.HFForward`)."""
    if lean_supported(model):
        return LeanForward(model)
    from .hf_forward import HFForward

    return HFForward(model)


def lean_supported(model) -> bool:
    """Whether `LeanForward` reproduces `model`: a Llama, Qwen2 or Qwen3 decoder, every layer
    with full attention and Llama's norms and MLP."""
    if getattr(model.config, "model_type", None) not in SUPPORTED:
        return False
    for layer in model.get_decoder().layers:
        attn, mlp = layer.self_attn, layer.mlp
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        if (getattr(attn, "sliding_window", None) is not None
                or not all(hasattr(n, "variance_epsilon") for n in norms)
                or not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))):
            return False
    return True


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm to the bit: normalised in float32 (float64 too), cast
    back, then scaled in the weights' dtype."""
    if x.dtype == torch.float64:
        out = F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
    else:  # float32 inside for lower precisions too: torch's kernel normalises in it
        out = F.rms_norm(x, (x.shape[-1],), None, eps)
    return out if weight is None else weight * out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [..., heads, dim] at cos, sin [..., 1, dim]: x cos +
    rotate_half(x) sin, with rotate_half(x) sin = roll(x) (sin with its first half negated)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


def folded_mask(allowed: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask [rows, 1, groups x width, span] of `allowed` [rows, width, span] for
    attention with each key/value head's query groups folded into its rows (`attend`)."""
    rows, width, span = allowed.shape
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None, None].expand(rows, 1, groups, width, span).reshape(
        rows, 1, groups * width, span)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
           scale: float) -> torch.Tensor:
    """Grouped-query attention of q [rows, width, heads, dim] over keys and values [rows,
    kv_heads, span, dim] under a `folded_mask`: query head h reads key/value head
    h // groups (Hugging Face's repeat_kv), without repeating the cache. Returns [rows,
    width, heads x dim]."""
    rows, width, heads, dim = q.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    folded = q.view(rows, width, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(
        rows, kv_heads, groups * width, dim)
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
    return out.view(rows, kv_heads, groups, width, dim).permute(0, 3, 1, 2, 4).reshape(
        rows, width, heads * dim)


class Product:
    """The products of one or more `nn.Linear` modules that read the same input, as one:
    prepacked for oneDNN where the modules are (`targetrows.hf.packed`; each module's outputs
    to the bit), else through one matrix whose rows the modules' weights become views of."""

    def __init__(self, modules):
        self.modules = list(modules)
        self.sizes = [int(m.weight.shape[0]) for m in self.modules]
        self._key = None
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the product if a module's weight changed since the last call."""
        if self._key != self._weights():
            self._build()
            self._key = self._weights()  # after: the modules' weights may be views now

    def _weights(self) -> tuple:
        return tuple((m.weight.data_ptr(), None if m.weight.is_inference() else m.weight._version)
                     for m in self.modules)

    def _build(self) -> None:
        first = self.modules[0]
        biases = [m.bias for m in self.modules]
        self._bias = None if all(b is None for b in biases) else torch.cat([
            b.detach() if b is not None else first.weight.new_zeros(n)
            for b, n in zip(biases, self.sizes, strict=True)])
        self.packed = first.weight.dtype in PACKABLE and all(
            isinstance(m, PackedLinear) and m.packed_dtype == m.weight.dtype for m in self.modules)
        if self.packed and len(self.modules) == 1:
            self._weight = first._packed_weight()  # shared with the module: no second copy
        elif self.packed:
            weight = torch.cat([m.weight.detach() for m in self.modules], dim=0)
            self._weight = torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
        else:
            self._weight = one_matrix(self.modules)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Every module's outputs, side by side [..., sum of their widths]."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self._weight, self._bias, "none", [], "")
        return F.linear(x, self._weight, self._bias)


def one_matrix(modules) -> torch.Tensor:
    """The modules' weights as one matrix, their rows stacked: a view of them where they lie
    one after another in one storage already (as this function leaves them, so that every
    forward over the same modules shares one matrix), else a new matrix whose rows the
    modules' weights become views of (no second copy)."""
    weights = [m.weight.detach() for m in modules]
    first, rows = weights[0], sum(w.shape[0] for w in weights)
    at, adjacent = first.storage_offset(), True
    for w in weights:
        adjacent &= (w.is_contiguous() and w.storage_offset() == at
                     and w.untyped_storage().data_ptr() == first.untyped_storage().data_ptr())
        at += w.numel()
    if adjacent:
        return first.as_strided((rows, first.shape[1]), (first.shape[1], 1))
    matrix = torch.cat(weights, dim=0)
    at = 0
    for m, w in zip(modules, weights, strict=True):
        m.weight.data = matrix[at: at + w.shape[0]]
        at += w.shape[0]
    return matrix


class LeanForward:
    """The forward of a Llama/Qwen2/Qwen3 causal LM over a `KVCache` (see the module
    docstring)."""

    def __init__(self, model):
        decoder = model.get_decoder()
        config = model.config
        self.embed, self.rotary, self.norm = decoder.embed_tokens, decoder.rotary_emb, decoder.norm
        self.head = Product([model.get_output_embeddings()])
        self.layers = []
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            heads = int(config.num_attention_heads)
            self.layers.append(dict(
                device=attn.q_proj.weight.device, norm1=layer.input_layernorm,
                norm2=layer.post_attention_layernorm, heads=heads,
                kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
                qkv=Product([attn.q_proj, attn.k_proj, attn.v_proj]), o=Product([attn.o_proj]),
                qk_norm=_qk_norm(attn, heads, config), head_dim=int(attn.head_dim),
                scale=float(attn.scaling), gate_up=Product([mlp.gate_proj, mlp.up_proj]),
                down=Product([mlp.down_proj]), act=mlp.act_fn))
        self._tables: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def refresh(self) -> None:
        """Rebuild the products whose weights changed since the last refresh (a training
        step, a `load_state_dict`)."""
        self.head.refresh()
        for layer in self.layers:
            for product in ("qkv", "o", "gate_up", "down"):
                layer[product].refresh()

    @torch.inference_mode()
    def __call__(self, inputs, cache, feature_layers: tuple[int, ...] = ()) -> torch.Tensor:
        """Logits [kept queries, vocabulary] of the pass `inputs` holds (`PassInputs`), its
        keys and values written to `cache`, and the inputs of `feature_layers`, concatenated,
        to its features."""
        lo, hi = inputs.rows
        x = self.embed(inputs.ids)
        on = {}  # what the layers on each device read (`_placed`), made there once
        entries = cache.parts[0].shape[-2]
        captured = {}
        for i, layer in enumerate(self.layers):
            if x.device != layer["device"]:  # a model spread over devices
                x = x.to(layer["device"])
            if i in feature_layers:
                captured[i] = x
            if layer["device"] not in on:
                on[layer["device"]] = _placed(self, inputs, entries, x.dtype, layer["device"])
            x = x + self._attention(layer, rms_norm(x, layer["norm1"].weight,
                                                    layer["norm1"].variance_epsilon),
                                    cache.layer(i)[:, lo:hi], on[layer["device"]], inputs.span)
            h = rms_norm(x, layer["norm2"].weight, layer["norm2"].variance_epsilon)
            gate, up = layer["gate_up"](h).split(layer["gate_up"].sizes, dim=-1)
            x = x + layer["down"](layer["act"](gate) * up)
        if feature_layers:  # a layer listed twice is kept twice, as every engine does
            device = cache.features.device
            put = on[device] if device in on else _placed(self, inputs, entries, x.dtype, device)
            cache.features[lo:hi][put["rows"], put["at"]] = torch.cat(
                [captured[i].to(cache.features.device) for i in feature_layers], dim=-1)
        x = x.flatten(0, 1)
        if inputs.keep is not None:
            x = x.index_select(0, inputs.keep.to(x.device))
        return self.head(rms_norm(x, self.norm.weight, self.norm.variance_epsilon))

    def _attention(self, layer: dict, h: torch.Tensor, kv: torch.Tensor, on: dict,
                   span: int) -> torch.Tensor:
        rows, width = h.shape[:2]
        heads, kv_heads, dim = layer["heads"], layer["kv_heads"], layer["head_dim"]
        qkv = layer["qkv"](h).view(rows, width, heads + 2 * kv_heads, dim)
        qk, v = qkv[:, :, : heads + kv_heads], qkv[:, :, heads + kv_heads:]
        if layer["qk_norm"] is not None:  # Qwen3: RMSNorm over each head, before rotary
            weight, eps = layer["qk_norm"]
            qk = rms_norm(qk, None, eps) * weight
        qk = rotate(qk, on["cos"], on["sin"])
        kv[0][on["rows"], :, on["at"]] = qk[:, :, heads:]
        kv[1][on["rows"], :, on["at"]] = v
        out = attend(qk[:, :, :heads], kv[0, :, :, :span], kv[1, :, :, :span],
                     on["masks"][heads // kv_heads], layer["scale"])
        return layer["o"](out)

    def rotary_table(self, entries: int, device: torch.device, dtype: torch.dtype):
        """cos and sin (its first half negated) at positions 0..entries-1 [entries, dim], as
        the model's rotary embedding computes them: made once per cache size and device."""
        key = (torch.device(device), entries)
        if key not in self._tables:
            positions = torch.arange(entries, device=device)[None]
            probe = torch.zeros(1, dtype=dtype, device=device)
            cos, sin = (t[0] for t in self.rotary(probe, positions))
            half = sin.shape[-1] // 2
            self._tables = {k: v for k, v in self._tables.items() if k[0] != key[0]}
            self._tables[key] = (cos, torch.cat([-sin[:, :half], sin[:, half:]], dim=-1))
        return self._tables[key]


def _qk_norm(attn, heads: int, config):
    """Qwen3's per-head RMSNorms of q and k, as one weight [heads + kv_heads, dim] over the
    q|k heads side by side, and their epsilon; None for a layer without them."""
    if not hasattr(attn, "q_norm"):
        return None
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    weight = torch.cat([attn.q_norm.weight.detach()[None].expand(heads, -1),
                        attn.k_norm.weight.detach()[None].expand(kv_heads, -1)])
    return weight, attn.q_norm.variance_epsilon


def _placed(forward: LeanForward, inputs, entries: int, dtype, device) -> dict:
    """What every layer on `device` reads, made once per pass there: the rotary cos and sin at
    the pass's positions, the write slots and rows, and the folded masks (one per query-group
    count). A dict, which `torch.compile` traces (benchmarks/compile_cpu.py)."""
    cos, sin = forward.rotary_table(entries, device, dtype)
    positions = inputs.positions.to(device)
    at = inputs.at.to(device)
    allowed = inputs.allowed.to(device)
    groups = {layer["heads"] // layer["kv_heads"] for layer in forward.layers}
    return {"cos": cos[positions][:, :, None], "sin": sin[positions][:, :, None], "at": at,
            "rows": torch.arange(at.shape[0], device=device)[:, None],
            "masks": {g: folded_mask(allowed, g, dtype) for g in groups}}
