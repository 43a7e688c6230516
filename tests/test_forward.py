"""The lean forward (`targetrows.hf.forward`) against Hugging Face's own forward of the same
model over the same cache (`targetrows.hf.hf_forward`): the same rows, cache entries and
captured features for every kind of pass; its fused products, norms and rotary are Hugging
Face's operations to the bit; and Hugging Face's forward serves an architecture the lean one
does not cover. (tests/test_hf_model.py checks HFModel against plain uncached forwards.)"""

from __future__ import annotations

import numpy as np
import pytest
from needs import cpu_feature

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import ARCHS, TOKENIZER_SIZE, random_tree, tiny_model  # noqa: E402

from targetrows.core.tree import Tree  # noqa: E402
from targetrows.hf.forward import LeanForward, Product, lean_supported, rms_norm, rotate  # noqa: E402
from targetrows.hf.hf_forward import HFForward  # noqa: E402
from targetrows.hf.model import HFModel  # noqa: E402
from targetrows.hf.packed import pack_linears, packing_works  # noqa: E402

V = TOKENIZER_SIZE
PROMPT = [5, 77, 130, 9, 201, 44, 3, 250, 18, 61, 99]


def run(model, hf_forward: bool = False, features=(0, 1)):
    """Rows of every kind of pass an HFModel makes (a prompt's first pass, one-token steps, a
    tree over a committed path, a chain after the prefix under a tree), with the cache and
    features; through Hugging Face's forward with `hf_forward`."""
    hf = HFModel(model, vocab_size=V, name="tiny", feature_layers=features)
    if hf_forward:
        hf.engine.forward = HFForward(model)
    assert isinstance(hf.engine.forward, HFForward if hf_forward else LeanForward)
    rng = np.random.default_rng(3)
    ctx = list(PROMPT)
    rows = [hf.logits(ctx, Tree.root_only(ctx[-1]), [0])]
    hf.commit(ctx)
    for _ in range(3):
        ctx.append(int(rows[-1][-1].argmax()))
        rows.append(hf.logits(ctx, Tree.root_only(ctx[-1]), [0]))
        hf.commit(ctx)
    tree = random_tree(rng, ctx[-1], 9)
    rows.append(hf.logits(ctx, tree, list(range(len(tree)))))
    path = tree.path_tokens(int(np.flatnonzero(tree.depth == tree.depth.max())[0]))
    hf.commit(ctx + path)
    ctx = ctx + path + [7, 8, 9]  # an uncached tail: a chain after the prefix, then a tree
    tree = random_tree(rng, ctx[-1], 6)
    rows.append(hf.logits(ctx, tree, list(range(len(tree)))))
    feats = hf.features(ctx, 0, len(ctx) - 1)
    layers, _ = hf.kv_entries()
    return rows, feats, [(k.clone(), v.clone()) for k, v in layers]


def assert_same(a, b, atol):
    for x, y in zip(a, b, strict=True):
        if isinstance(x, (list, tuple)):
            assert_same(x, y, atol)
        else:
            torch.testing.assert_close(x, y, atol=atol, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_lean_equals_hugging_faces_forward(arch):
    """Every pass kind, every architecture (Qwen2's q/k/v biases, Qwen3's per-head norms), in
    float64: rows, KV entries and layer inputs those of Hugging Face's forward."""
    model = tiny_model(arch, dtype=torch.float64)
    assert_same(run(model), run(model, hf_forward=True), atol=1e-10)


BF16_PACKED = cpu_feature(packing_works(torch.bfloat16),
                          "oneDNN bfloat16 products (AVX512-BF16 or AMX)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64,
                                   pytest.param(torch.bfloat16, marks=BF16_PACKED)])
def test_fused_products_are_each_modules_to_the_bit(dtype):
    """One product for q|k|v (with Qwen2's biases) and one for gate|up give each module's own
    outputs: to the bit prepacked for oneDNN (float32, bfloat16); to rounding through one
    matrix of the modules' weights (float64), which they become views of, and which a second
    forward over the same modules shares."""
    model = tiny_model("qwen2", dtype=dtype)
    packed = pack_linears(model) > 0
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    x = torch.randn(3, 5, 64, dtype=dtype)
    with torch.inference_mode():
        for modules in ([attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]):
            product = Product(modules)
            assert product.packed == packed
            want = torch.cat([m(x) for m in modules], dim=-1)
            if packed:  # oneDNN's sums do not depend on the matrix's width
                assert torch.equal(product(x), want)
            else:  # MKL's do: rounding apart
                torch.testing.assert_close(product(x), want, rtol=1e-12, atol=1e-12)
                again = Product(modules)
                assert again._weight.data_ptr() == product._weight.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_norms_and_rotary_are_hugging_faces_to_the_bit(dtype):
    """RMSNorm through torch's fused kernel (in float32 for float64 inputs, as Hugging Face
    computes it) and rotary as x cos + roll(x) sin: Hugging Face's numbers to the bit."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = tiny_model("llama", dtype=dtype)
    norm = model.model.layers[0].input_layernorm
    x = torch.randn(2, 7, 64, dtype=dtype) * 3
    with torch.inference_mode():
        assert torch.equal(rms_norm(x, norm.weight, norm.variance_epsilon), norm(x))
        q = torch.randn(2, 7, 4, 16, dtype=dtype)
        positions = torch.arange(7)[None].expand(2, 7)
        cos, sin = model.model.rotary_emb(q, positions)
        want, _ = apply_rotary_pos_emb(q.transpose(1, 2), q.transpose(1, 2), cos, sin)
        lean = LeanForward(model)
        table_cos, table_sin = lean.rotary_table(16, torch.device("cpu"), dtype)
        got = rotate(q, table_cos[positions][:, :, None], table_sin[positions][:, :, None])
        assert torch.equal(got, want.transpose(1, 2))


def test_weight_changes_reach_the_fused_products():
    """A weight changed in place (an optimiser step, a load) reaches the fused prepacked
    products from the next reset on."""
    model = tiny_model("llama", dtype=torch.float32)
    pack_linears(model)
    hf = HFModel(model, vocab_size=V)
    before = hf.logits(PROMPT, Tree.root_only(PROMPT[-1]), [0])
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(-1.5)
        model.model.layers[1].mlp.up_proj.weight.add_(0.1)
    hf.reset(0)
    after = hf.logits(PROMPT, Tree.root_only(PROMPT[-1]), [0])
    ref = HFModel(model, vocab_size=V).logits(PROMPT, Tree.root_only(PROMPT[-1]), [0])
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, ref, atol=0.0, rtol=0)


def test_hugging_faces_forward_serves_what_the_lean_one_does_not_cover():
    """A model the lean forward does not reproduce (Phi-3: one q|k|v module) runs through
    Hugging Face's own forward over the same cache: its rows those of plain forwards, at batch
    1 and as a lane."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "phi3", vocab_size=272, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, sliding_window=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = model.to(torch.float64).eval()
    assert not lean_supported(model) and lean_supported(tiny_model("qwen3"))
    ctx, tree = [5, 17, 42, 8, 9, 3], Tree([3, 4, 5, 6], [-1, 0, 0, 1])
    with torch.no_grad():
        want = torch.stack([model(torch.tensor([ctx + tree.path_tokens(i)])).logits[0, -1]
                            for i in range(len(tree))])
    for sequence in (HFModel(model, name="phi3"), HFModel(model, name="phi3").lanes(3)[1]):
        assert isinstance(sequence.engine.forward, HFForward)
        rows = sequence.logits(ctx, tree, range(len(tree)))
        torch.testing.assert_close(rows, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("q_len", [1, 5])
def test_grouped_attention_under_a_mask_equals_torchs_kernel(q_len):
    """float64, a mask per row and query: the query groups folded into their key/value head's
    rows (`attend`) give torch's grouped-query kernel's outputs, every group seeing its row's
    mask."""
    import torch.nn.functional as F

    from targetrows.hf.forward import attend, folded_mask

    gen = torch.Generator().manual_seed(4)
    q = torch.randn(3, q_len, 6, 8, dtype=torch.float64, generator=gen)
    k, v = (torch.randn(3, 2, 23, 8, dtype=torch.float64, generator=gen) for _ in range(2))
    allowed = torch.rand(3, q_len, 23, generator=gen) >= 0.4
    allowed[..., 0] = True  # every query sees one entry at least
    got = attend(q, k, v, folded_mask(allowed, 3, torch.float64), 0.25)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=allowed[:, None],
                                          scale=0.25, enable_gqa=True)
    torch.testing.assert_close(got, want.transpose(1, 2).flatten(2), rtol=1e-12, atol=1e-12)
