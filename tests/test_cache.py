"""The growing KV cache against Hugging Face's DynamicCache: the same passes give the same
logits to the bit, through growth past its capacity, crops and batch selections."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from tiny_models import ARCHS, tiny_model
from transformers import DynamicCache

from targetrows.hf.hf_forward import cache_kwargs
from targetrows.train.growing_cache import growing_cache


def run(model, cache, steps):
    """Apply `steps` to `cache`: ("feed", ids [B, n]) returns logits; ("crop", k), ("keep",
    rows) change the cache."""
    out = []
    with torch.inference_mode():
        for kind, arg in steps:
            if kind == "feed":
                out.append(model(input_ids=arg, use_cache=True, **cache_kwargs(model, cache)).logits)
            elif kind == "crop":
                cache.crop(-arg)
            else:
                cache.reorder_cache(arg)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_growing_cache_gives_dynamic_caches_logits(arch):
    model = tiny_model(arch, n_layers=2)
    gen = torch.Generator().manual_seed(0)

    def ids(b, n):
        return torch.randint(0, 200, (b, n), generator=gen)

    steps = [("feed", ids(4, 5)), *[("feed", ids(4, 1)) for _ in range(4)],  # past capacity 8
             ("crop", 3), ("feed", ids(4, 2)), ("keep", torch.tensor([3, 0, 2])),
             ("feed", ids(3, 6)), ("keep", torch.tensor([1])), ("feed", ids(1, 1))]
    ours = growing_cache(model.config, capacity=8)
    want = run(model, DynamicCache(config=model.config), steps)
    got = run(model, ours, steps)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert ours.get_seq_length() == 5 + 4 - 3 + 2 + 6 + 1
    assert ours.layers[0].keys.shape[0] == 1


def test_growing_cache_refuses_sliding_windows():
    model = tiny_model("qwen2", n_layers=2, sliding_window=4, use_sliding_window=True,
                       max_window_layers=0, layer_types=["sliding_attention"] * 2)
    with pytest.raises(ValueError, match="sliding-window"):
        growing_cache(model.config)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_cache_reaches_the_model_under_this_transformers_name(arch):
    """transformers 5.24 renamed `past_key_values` to `cache`; a cache under the name a release
    does not know is dropped in `**kwargs` without a word. The pass must fill the cache given,
    and the next pass must read it (its logits equal a pass over the whole sequence)."""
    # float64: a cached step and a whole pass sum in other orders, which float32 rounds apart
    # by more than assert_close's 1e-5 on some CPUs; a dropped cache is off by far more
    model = tiny_model(arch, n_layers=2).double()
    ids = torch.randint(0, 200, (1, 7), generator=torch.Generator().manual_seed(1))
    cache = growing_cache(model.config)
    with torch.inference_mode():
        model(input_ids=ids[:, :6], use_cache=True, **cache_kwargs(model, cache))
        assert cache.get_seq_length() == 6
        step = model(input_ids=ids[:, 6:], position_ids=torch.tensor([[6]]), use_cache=True,
                     **cache_kwargs(model, cache)).logits[0, -1]
        whole = model(input_ids=ids, use_cache=False).logits[0, -1]
    assert cache.get_seq_length() == 7
    torch.testing.assert_close(step, whole)
