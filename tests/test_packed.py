"""Linear layers with prepacked weights (`targetrows.hf.packed`): the same products as
`nn.Linear` up to float rounding, never a stale weight, gradients through the plain path, and
decoders on packed models as lossless as on plain ones."""

import copy
import itertools

import pytest
from needs import cpu_feature, needs

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rerankers import decode_config
from tiny_models import reference_logits, save_tiny, tiny_model

from targetrows.core.pool import PoolShape
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names
from targetrows.hf.loading import load_model
from targetrows.hf.model import HFModel
from targetrows.hf.packed import (
    PackedLinear,
    pack_linears,
    packed_product,
    packing_works,
)

pytestmark = needs(not packing_works(), "this torch has no oneDNN packing")


def packed_copy(linear: torch.nn.Linear) -> PackedLinear:
    out = copy.deepcopy(linear)
    assert pack_linears(out) == 1
    return out


@pytest.mark.parametrize("rows,bias", list(itertools.product([1, 3, 9, 17, 65], [False, True])))
def test_products_equal_plain_linear(rows, bias):
    torch.manual_seed(rows)
    plain = torch.nn.Linear(96, 160, bias=bias)
    packed = packed_copy(plain)
    x = torch.randn(2, rows, 96)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed(x[0, :1]), plain(x[0, :1]), rtol=1e-5, atol=1e-5)


def test_a_changed_weight_is_packed_again():
    """In-place updates (an optimiser step) and replaced tensors (load_state_dict) are seen."""
    torch.manual_seed(0)
    layer = packed_copy(torch.nn.Linear(64, 32))
    x = torch.randn(4, 64)
    with torch.no_grad():
        first = layer(x)
        layer.weight.mul_(2)
        torch.testing.assert_close(layer(x) - layer.bias, 2 * (first - layer.bias), rtol=1e-5,
                                   atol=1e-5)
        other = torch.nn.Linear(64, 32)
        layer.load_state_dict(other.state_dict())
        torch.testing.assert_close(layer(x), other(x), rtol=1e-5, atol=1e-5)


def test_weights_made_under_inference_mode():
    """Inference tensors have no version counter (a model loaded inside inference_mode)."""
    torch.manual_seed(0)
    with torch.inference_mode():
        plain = torch.nn.Linear(32, 16)
        layer = packed_copy(plain)
        assert layer.weight.is_inference()
        x = torch.randn(3, 32)
        torch.testing.assert_close(layer(x), plain(x), rtol=1e-5, atol=1e-5)


def test_training_takes_the_plain_path():
    """With gradients the layer is an nn.Linear: same gradients, and it still learns."""
    torch.manual_seed(0)
    plain = torch.nn.Linear(48, 24)
    packed = packed_copy(plain)
    x = torch.randn(5, 48)
    with torch.no_grad():
        packed(x)  # a packed copy exists before training starts
    for layer in (plain, packed):
        layer(x).square().sum().backward()
    torch.testing.assert_close(packed.weight.grad, plain.weight.grad)
    with torch.no_grad():
        packed.weight -= 0.1 * packed.weight.grad
        torch.testing.assert_close(packed(x), torch.nn.functional.linear(x, packed.weight,
                                                                         packed.bias))


def test_models_copy_save_and_keep_tied_weights():
    model = tiny_model("llama", seed=0, n_layers=2, dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    keys = list(model.state_dict())
    assert pack_linears(model) == sum(isinstance(m, PackedLinear) for m in model.modules()) > 0
    ids = [5, 17, 42, 7]
    model(torch.tensor([ids]))  # packs
    assert list(model.state_dict()) == keys
    assert model.lm_head.weight is model.model.embed_tokens.weight
    twin = copy.deepcopy(model)  # the packed copies are not copied; the twin packs its own
    torch.testing.assert_close(reference_logits(twin, ids), reference_logits(model, ids))
    assert pack_linears(tiny_model("llama", seed=0, dtype=torch.float64)) == 0  # float32 only


def test_packed_target_logits_match_plain():
    plain = tiny_model("qwen3", seed=0, n_layers=2, dtype=torch.float32)
    packed = copy.deepcopy(plain)
    pack_linears(packed)
    ids = list(range(3, 40))
    torch.testing.assert_close(reference_logits(packed, ids), reference_logits(plain, ids),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decoders_on_packed_models_are_lossless(arch):
    """Every decoder commits the tokens of `ar` on the same packed float32 target, and `ar`
    those of Hugging Face greedy generation on it, with a draft that gets trees accepted."""
    target_hf = tiny_model(arch, seed=0, n_layers=2, dtype=torch.float32)
    draft_hf = copy.deepcopy(target_hf)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in draft_hf.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    for model in (target_hf, draft_hf):
        pack_linears(model)
    target, draft = HFModel(target_hf, name="target"), HFModel(draft_hf, name="draft")
    for prompt in ([5, 17, 42], [100, 101, 102, 103]):
        ar = generate(target, None, prompt, DecodeConfig("ar", max_new_tokens=32)).tokens
        hf = target_hf.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32,
                                do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ar == hf[0, len(prompt):].tolist()
        for decoder, budget in itertools.product(decoder_names()[1:], (4, 24)):
            config = decode_config(decoder, budget=budget, max_new_tokens=32,
                                   pool=PoolShape(top_k=4, depth=4))
            result = generate(target, draft, prompt, config)
            assert result.tokens == ar, (arch, decoder, budget, prompt)
            assert sum(r.accepted for r in result.rounds) > 0


def test_load_model_packs_cpu_models(tmp_path):
    path = save_tiny(tmp_path / "m", "llama", seed=0)

    def packed(model) -> bool:
        return any(isinstance(m, PackedLinear) for m in model.model.modules())

    assert packed(load_model(path, "cpu")[0])
    assert not packed(load_model(path, "cpu", packed=False)[0])
    assert packed(load_model(path, "cpu", "bfloat16")[0]) == packing_works(torch.bfloat16)
    assert not packed(load_model(path, "cpu", "float64")[0])


@cpu_feature(packing_works(torch.bfloat16), "oneDNN bfloat16 products (AVX512-BF16 or AMX)")
def test_a_bfloat16_packed_head_on_a_float32_target_is_lossless(tmp_path):
    """`load_pair(..., draft_dtype="bfloat16")`: the head packed in bfloat16, the target in
    float32; every decoder still commits ar's tokens, and trees do get accepted."""
    from tiny_heads import save_tiny_head

    from targetrows.hf.loading import load_pair

    target_dir = save_tiny(tmp_path / "t", "llama", seed=0, n_layers=6)
    config = tiny_model("llama", seed=0, n_layers=6).config
    head_dir = save_tiny_head(tmp_path / "h", config, draft_vocab_size=120)
    target, head, _ = load_pair(target_dir, head_dir, "cpu", dtype="float32",
                                draft_dtype="bfloat16")
    linears = [m for m in head.head.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, PackedLinear) and m.packed_dtype == torch.bfloat16
                           for m in linears)
    assert target.dtype == torch.float32 and head.dtype == torch.bfloat16
    for prompt in ([5, 17, 42], [200, 3, 9, 9, 31]):
        ar = generate(target, None, prompt, DecodeConfig("ar", max_new_tokens=24)).tokens
        for decoder in decoder_names()[1:]:
            config = decode_config(decoder, budget=8, max_new_tokens=24, pool=PoolShape(top_k=4, depth=4))
            assert generate(target, head, prompt, config).tokens == ar, (decoder, prompt)


@pytest.mark.parametrize("rows", [1, 40, 700])
def test_one_off_packed_products_equal_the_plain_product(rows):
    gen = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 72, generator=gen), torch.randn(301, 72, generator=gen)
    torch.testing.assert_close(packed_product(x, w), x @ w.T, rtol=1e-5, atol=1e-4)
    w_grad = w.clone().requires_grad_()  # no graph through it: the caller owns the backward
    assert not packed_product(x, w_grad).requires_grad
    x64, w64 = x.double(), w.double()  # a dtype oneDNN does not pack: the plain product
    torch.testing.assert_close(packed_product(x64, w64), x64 @ w64.T)
