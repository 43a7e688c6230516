"""The lean forward against Hugging Face's own forward of the same model: the same rows, cache
entries and captured features, with the products fused and prepacked or not; used only where it
reproduces the model. (tests/test_hf_model.py checks HFModel, lean by default, against plain
uncached forwards.)"""

from __future__ import annotations

import numpy as np
import pytest
from needs import cpu_feature

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import ARCHS, TOKENIZER_SIZE, random_tree, tiny_model

from targetrows.core.tree import Tree
from targetrows.hf.lean_forward import lean_forward
from targetrows.hf.model import HFModel
from targetrows.hf.packed import pack_linears, packing_works

V = TOKENIZER_SIZE
PROMPT = [5, 77, 130, 9, 201, 44, 3, 250, 18, 61, 99]


def run(model, lean: bool, features=(0, 1)):
    """Rows of every kind of pass HFModel makes (a prompt's first pass, one-token steps, a tree
    over a committed path, a chain after the prefix under a tree), with the cache and features."""
    hf = HFModel(model, vocab_size=V, name="tiny", feature_layers=features, lean=lean)
    assert (hf.engine.lean is not None) == lean
    hf.reset(0)
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
    layers = [(layer.keys.clone(), layer.values.clone()) for layer in hf.kv_cache.layers]
    return rows, feats, layers


def assert_same(a, b, atol):
    for x, y in zip(a, b, strict=True):
        if isinstance(x, (list, tuple)):
            assert_same(x, y, atol)
        else:
            torch.testing.assert_close(x, y, atol=atol, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_lean_equals_hugging_face_to_the_bit(arch):
    """Every pass kind, every architecture (Qwen2's q/k/v biases, Qwen3's per-head norms), with
    plain products: rows, KV entries and layer inputs equal to the bit."""
    model = tiny_model(arch, dtype=torch.float64)
    assert_same(run(model, lean=True), run(model, lean=False), atol=0.0)


BF16_PACKED = cpu_feature(packing_works(torch.bfloat16),
                          "oneDNN bfloat16 products (AVX512-BF16 or AMX)")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=BF16_PACKED)])
def test_fused_prepacked_products_are_hugging_faces_to_the_bit(arch, dtype):
    """Prepacked float32 and bfloat16 (the CPU default): one product for q|k|v (with Qwen2's
    biases) and one for gate|up give every pass's rows, KV entries and features to the bit."""
    model = tiny_model(arch, dtype=dtype)
    assert pack_linears(model) > 0
    lean = lean_forward(model)
    assert lean.layers[0]["qkv"].packed and lean.layers[0]["gate_up"].packed
    assert_same(run(model, lean=True), run(model, lean=False), atol=0.0)


def test_weight_changes_reach_the_fused_products():
    """A weight changed in place (an optimiser step, a load) reaches the fused prepacked
    products from the next reset on."""
    model = tiny_model("llama", dtype=torch.float32)
    pack_linears(model)
    hf = HFModel(model, vocab_size=V, lean=True)
    before = hf.logits(PROMPT, Tree.root_only(PROMPT[-1]), [0])
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(-1.5)
        model.model.layers[1].mlp.up_proj.weight.add_(0.1)
    hf.reset(0)
    after = hf.logits(PROMPT, Tree.root_only(PROMPT[-1]), [0])
    ref = HFModel(model, vocab_size=V, lean=False).logits(PROMPT, Tree.root_only(PROMPT[-1]), [0])
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, ref, atol=0.0, rtol=0)


def test_only_where_it_reproduces_the_model():
    """Eager attention (its own softmax) keeps Hugging Face's forward; sdpa takes the lean one."""
    assert lean_forward(tiny_model("llama", attn="eager")) is None
    assert lean_forward(tiny_model("qwen3")) is not None
    assert HFModel(tiny_model("llama", attn="eager"), vocab_size=V).engine.lean is None
