"""The grouped-matmul attention of batched sampling: the same numbers as Hugging Face's sdpa path
(torch's own kernel), the passes it leaves to that path, and the switch that scopes it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import tiny_model
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from targetrows.hf.hf_forward import cache_kwargs
from targetrows.train import batched_attention as module
from targetrows.train.batched_attention import NAME, batched_attention, grouped_matmul_forward


class Layer(torch.nn.Module):
    """What the attention interface reads from a layer."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def qkv(batch: int, heads: int, kv_heads: int, q_len: int, keys: int, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, 16, generator=gen, dtype=torch.float64) * 2
    k = torch.randn(batch, kv_heads, keys, 16, generator=gen, dtype=torch.float64) * 2
    v = torch.randn(batch, kv_heads, keys, 16, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("heads, kv_heads, keys", [(6, 2, 1), (6, 2, 37), (4, 4, 20), (8, 1, 9)])
def test_one_token_passes_equal_torchs_kernel(heads, kv_heads, keys):
    """float64: the grouped products and torch's kernel agree to rounding, for grouped,
    multi-query and plain multi-head attention."""
    layer = Layer(heads // kv_heads)
    q, k, v = qkv(5, heads, kv_heads, 1, keys, torch.float64)
    ours, _ = grouped_matmul_forward(layer, q, k, v, None, scaling=0.3)
    ref, _ = sdpa_attention_forward(layer, q, k, v, None, scaling=0.3)
    assert ours.shape == ref.shape == (5, 1, heads, 16)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)


def test_bfloat16_is_as_close_to_exact_as_torchs_kernel():
    """In bfloat16 (how the prompts are written) the error against float64 stays within twice
    torch's own kernel's: scores and softmax in float32, as that kernel keeps them."""
    layer = Layer(3)
    q, k, v = qkv(64, 9, 3, 1, 80, torch.bfloat16, seed=1)
    exact, _ = sdpa_attention_forward(layer, q.double(), k.double(), v.double(), None)
    ours, _ = grouped_matmul_forward(layer, q, k, v, None)
    ref, _ = sdpa_attention_forward(layer, q, k, v, None)
    ours_err = (ours.double() - exact).abs().max().item()
    ref_err = (ref.double() - exact).abs().max().item()
    assert ours.dtype == torch.bfloat16
    assert ours_err <= 2 * ref_err + 1e-3, (ours_err, ref_err)


def test_other_passes_take_torchs_kernel_unchanged():
    """A masked pass and a pass over several new tokens are Hugging Face's sdpa path, to the bit."""
    layer = Layer(2)
    q, k, v = qkv(3, 4, 2, 1, 12, torch.float32)
    mask = torch.ones(3, 1, 1, 12, dtype=torch.bool)
    mask[0, ..., :4] = False
    assert torch.equal(grouped_matmul_forward(layer, q, k, v, mask)[0],
                       sdpa_attention_forward(layer, q, k, v, mask)[0])
    q, k, v = qkv(3, 4, 2, 12, 12, torch.float32)
    assert torch.equal(grouped_matmul_forward(layer, q, k, v, None)[0],
                       sdpa_attention_forward(layer, q, k, v, None)[0])


def test_a_model_decodes_the_same_rows_inside_the_switch_and_is_restored(monkeypatch):
    """A tiny grouped-query model's cached one-token logits are the same inside the switch as
    under sdpa (float64), and the model leaves the block, even by an error, as it entered."""
    model = tiny_model(n_layers=2, dtype=torch.float64)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    ids = torch.randint(3, 200, (4, 9), generator=torch.Generator().manual_seed(2))

    def last_logits():
        out = model(input_ids=ids[:, :-1], use_cache=True)
        return model(input_ids=ids[:, -1:], **cache_kwargs(model, out.past_key_values),
                     use_cache=True).logits[:, -1]

    calls = []  # query shapes of the passes that took the grouped products
    real = module.grouped_attention
    monkeypatch.setattr(module, "grouped_attention",
                        lambda q, *args: calls.append(q.shape) or real(q, *args))
    with torch.inference_mode():
        ref = last_logits()
        with batched_attention(model):
            assert model.config._attn_implementation == NAME
            ours = last_logits()
    assert calls == [(4, 4, 1, 16)] * 2  # the one-token pass, in each layer; not the prefill
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError), batched_attention(model):
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"
    eager = tiny_model(n_layers=1, attn="eager")
    with batched_attention(eager):
        assert eager.config._attn_implementation == "eager"
