"""Linear layers that multiply by a copy of their weight prepacked for oneDNN, on the CPU:
what `torch.compile`'s CPU freezing does to a model's linear layers, without compiling.

Why. A transformer pass over a few tokens is almost all `nn.Linear`, and the default CPU path
(`F.linear`, an MKL sgemm on the weight as stored) rearranges the weight into its own blocked
layout on every call, and a verify pass over a small token tree pays that on every layer. With
the weight packed once, in the blocked layout oneDNN's kernels read directly, small passes get
much cheaper, a few-token tree pass most (`benchmarks/linear_kernels.py` measures both paths).
Rows differ from `F.linear`'s by float rounding only (another summation order).

`pack_linears(model)` turns a model's `nn.Linear` modules into `PackedLinear` in place: the same
parameters, names and state dict (tied weights stay tied), so Hugging Face `generate`, copies
and checkpoints work as before. A module is packed for the dtype its weight has then: float32,
or bfloat16 where oneDNN supports it (an EAGLE-3 head's few-entry passes gain from both).
Converted to another dtype later, it takes plain `F.linear`: the replies' bfloat16 request
writer, a copy of the float32 target, stays on torch's own layers, where packing gains nothing
at large batches. The packed copy is made on the first pass without
gradients and made again when the weight changes; passes that need gradients and other devices
take plain `F.linear` too, so a packed model still trains.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

# oneDNN's layout is chosen for a batch size; 16 serves 1..64 rows about equally.
BATCH_HINT = 16


class PackedLinear(nn.Linear):
    """An `nn.Linear` that, on the CPU in the dtype it was packed for and without gradients,
    multiplies by a copy of its weight prepacked for oneDNN (as much memory as the weight)."""

    packed_dtype: torch.dtype = torch.float32  # set per module by `pack_linears`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (w.device.type != "cpu" or w.dtype != self.packed_dtype or x.dtype != w.dtype
                or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            return F.linear(x, w, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight(), self.bias,
                                                  "none", [], "")

    def _packed_weight(self) -> torch.Tensor:
        # keyed by the weight's storage and version counter: an optimiser step, a load_state_dict
        # or a .to() makes a new copy. A weight made under inference_mode has no version counter;
        # it cannot be changed in place outside inference_mode, and is not changed inside it.
        w = self.weight
        key = (w.data_ptr(), None if w.is_inference() else w._version)
        held = self.__dict__.get("_packed")
        if held is None or held[0] != key:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), BATCH_HINT)
            held = self.__dict__["_packed"] = (key, packed)
        return held[1]

    def __getstate__(self):
        # copy.deepcopy and pickle: oneDNN's opaque tensors have no storage to copy; the copy
        # packs its own weight on first use
        state = self.__dict__.copy()
        state.pop("_packed", None)
        return state


@functools.cache
def packing_works(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build and CPU have oneDNN's packed linear ops for `dtype` (float32 or
    bfloat16) and they agree with `F.linear` (checked once per dtype, on a small random layer,
    with and without bias)."""
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        if not (hasattr(ops, "_is_mkldnn_bf16_supported") and ops._is_mkldnn_bf16_supported()):
            return False
    elif dtype != torch.float32:
        return False
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 40, generator=gen), torch.randn(48, generator=gen)
    x = torch.randn(3, 5, 40, generator=gen)
    w, b, x = w.to(dtype), b.to(dtype), x.to(dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2  # bfloat16 rounds each product's output
    try:
        packed = ops._reorder_linear_weight(w, BATCH_HINT)
        outs = [ops._linear_pointwise(x, packed, bias, "none", [], "") for bias in (None, b)]
    except RuntimeError:
        return False
    return all(torch.allclose(out.float(), F.linear(x, w, bias).float(), rtol=tol, atol=tol)
               for out, bias in zip(outs, (None, b), strict=True))


def pack_linears(model: nn.Module) -> int:
    """Make every plain `nn.Linear` of `model` a `PackedLinear` for its weight's dtype, in place;
    the count made (0 when the model is not on the CPU, or `packing_works` is false for that
    dtype)."""
    params = list(model.parameters())
    if not params or any(p.device.type != "cpu" for p in params):
        return 0
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear and packing_works(module.weight.dtype):
            module.__class__ = PackedLinear
            module.packed_dtype = module.weight.dtype
            count += 1
    return count


def packed_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` without gradients, through a copy of `w` packed now: for one large product
    (training's vocabulary-wide logits), where packing costs far less than it saves. Elsewhere,
    or when packing does not work, `x @ w.T`."""
    w = w.detach()
    if x.device.type != "cpu" or x.dtype != w.dtype or not packing_works(w.dtype):
        return x @ w.T
    packed = torch.ops.mkldnn._reorder_linear_weight(w, BATCH_HINT)
    return torch.ops.mkldnn._linear_pointwise(x.detach(), packed, None, "none", [], "")


def packed_copy(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A copy of `model` with packed linear layers and its parameters in `dtype` (default: as
    they are; buffers such as rotary frequencies stay as they are), `model` left as it is: how
    a cost report times a freshly trained draft as the decoders will run it (`load_pair` packs
    it, in `loading.draft_dtype_for`'s dtype)."""
    model = copy.deepcopy(model)
    if dtype is not None:
        for param in model.parameters():
            param.data = param.data.to(dtype)
    pack_linears(model)
    return model
