"""HFModel against plain full forwards of tiny random-weight Llama / Qwen2 / Qwen3 models.

Models are float64 so cached tree passes and plain forwards agree to ~1e-12 under SDPA (eager
attention runs its softmax in float32, hence the looser tolerance there).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import ARCHS, TOKENIZER_SIZE, random_tree, reference_logits, tiny_model
from transformers import DynamicCache

from targetrows.core.pool import PoolShape
from targetrows.core.tree import Tree
from targetrows.hf.hf_forward import cache_kwargs
from targetrows.hf.model import HFModel
from targetrows.hf.torch_rows import topk_sorted

V = TOKENIZER_SIZE
TOL = {"sdpa": 1e-9, "eager": 1e-5}


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    return request.param, tiny_model(request.param, dtype=torch.float64)


def wrap(model, seed=0):
    hf = HFModel(model, vocab_size=V, name="tiny")
    hf.reset(seed)
    return hf


def expected_rows(model, context, tree, nodes):
    return torch.stack(
        [reference_logits(model, list(context) + tree.path_tokens(int(v)))[-1, :V] for v in nodes]
    )


def assert_rows(rows, model, context, tree, nodes, atol=TOL["sdpa"]):
    assert rows.shape == (len(nodes), V)
    torch.testing.assert_close(rows, expected_rows(model, context, tree, nodes), atol=atol, rtol=0)


def cache_len(hf) -> int:
    """The entries `hf`'s row holds: its committed prefix, then the fed tree nodes."""
    return hf.kv_entries()[0][0][0].shape[1]


def assert_cache_is_prefill(hf, model, atol=TOL["sdpa"]):
    """The cache equals a fresh prefill of the tokens it claims to hold."""
    tokens = hf.cached_tokens
    fresh = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.from_numpy(tokens)[None], use_cache=True, **cache_kwargs(model, fresh))
    layers, _ = hf.kv_entries()
    assert cache_len(hf) == len(tokens)
    for (keys, values), ref in zip(layers, fresh.layers, strict=True):
        torch.testing.assert_close(keys, ref.keys[0], atol=atol, rtol=0)
        torch.testing.assert_close(values, ref.values[0], atol=atol, rtol=0)


def test_tree_rows_equal_full_forwards(arch_model):
    _, model = arch_model
    rng = np.random.default_rng(1)
    hf = wrap(model)
    context = rng.integers(V, size=9).tolist()
    tree = random_tree(rng, context[-1], 16)
    nodes = rng.permutation(len(tree))[:11]  # any order, not all nodes
    assert_rows(hf.logits(context, tree, nodes), model, context, tree, nodes)
    # fed entries: the tail (8 tokens) + requested nodes and their ancestors, nothing else
    needed = tree.ancestor_mask()[nodes].any(axis=0).sum()
    assert cache_len(hf) == 8 + needed
    # asking again for fed nodes (and unfed ones) gives the same rows
    again = np.arange(len(tree))[::-1]
    assert_rows(hf.logits(context, tree, again), model, context, tree, again)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_implementations(attn):
    model = tiny_model("llama", seed=3, dtype=torch.float64, attn=attn)
    rng = np.random.default_rng(2)
    hf = wrap(model)
    context = rng.integers(V, size=5).tolist()
    tree = random_tree(rng, context[-1], 12)
    nodes = np.arange(len(tree))
    assert_rows(hf.logits(context, tree, nodes), model, context, tree, nodes, atol=TOL[attn])


def test_level_by_level_equals_one_shot(arch_model):
    _, model = arch_model
    rng = np.random.default_rng(3)
    context = rng.integers(V, size=6).tolist()
    # a pool-like tree: levels of growing size, numbered level by level
    tokens, parents, level = [context[-1]], [-1], [0]
    levels = [[0]]
    for _ in range(3):
        nxt = []
        for p in level:
            for t in rng.choice(V, size=2, replace=False).tolist():
                nxt.append(len(tokens))
                tokens.append(t)
                parents.append(p)
        levels.append(nxt)
        level = nxt
    full = Tree(tokens, parents)
    one_shot = wrap(model).logits(context, full, np.arange(len(full)))

    for same_object in (True, False):
        hf = wrap(model)
        rows = []
        for lv in levels:
            # pool expansion: either one tree object, or a new Tree per level extending the last
            size = max(lv) + 1
            tree = full if same_object else Tree(tokens[:size], parents[:size])
            rows.append(hf.logits(context, tree, lv))
        torch.testing.assert_close(torch.cat(rows), one_shot, atol=TOL["sdpa"], rtol=0)
        assert cache_len(hf) == len(context) - 1 + len(full)  # nothing re-fed


def test_new_tree_drops_old_entries(arch_model):
    _, model = arch_model
    rng = np.random.default_rng(4)
    hf = wrap(model)
    context = rng.integers(V, size=5).tolist()
    first = random_tree(rng, context[-1], 10)
    hf.logits(context, first, np.arange(10))
    second = random_tree(rng, context[-1], 7)
    assert_rows(hf.logits(context, second, [6, 2]), model, context, second, [6, 2])
    needed = second.ancestor_mask()[[6, 2]].any(axis=0).sum()
    assert cache_len(hf) == len(context) - 1 + needed


def test_commit_rounds_keep_a_prefill_equal_cache(arch_model):
    _, model = arch_model
    rng = np.random.default_rng(5)
    hf = wrap(model)
    context = rng.integers(V, size=4).tolist()
    for round_ in range(8):
        if round_ % 3 == 1:  # a root pass, committed before the tree (first-token sampling)
            root = Tree.root_only(context[-1])
            assert_rows(hf.logits(context, root, [0]), model, context, root, [0])
            hf.commit(context)
            assert len(hf.cached_tokens) == len(context)
            context = context + [int(rng.integers(V))]
        tree = random_tree(rng, context[-1], int(rng.integers(1, 14)))
        nodes = np.arange(len(tree))
        assert_rows(hf.logits(context, tree, nodes), model, context, tree, nodes)
        node = int(rng.integers(len(tree)))  # accepted path to a random node, then a bonus
        context = context + tree.path_tokens(node) + [int(rng.integers(V))]
        hf.commit(context)
        # everything up to the bonus is cached: the accepted path was kept, not re-fed
        assert hf.cached_tokens.tolist() == context[:-1]
        assert_cache_is_prefill(hf, model)


def test_commit_keeps_only_fed_nodes_and_handles_shorter_contexts(arch_model):
    _, model = arch_model
    rng = np.random.default_rng(6)
    hf = wrap(model)
    context = rng.integers(V, size=5).tolist()
    tree = Tree([context[-1], 10, 11, 12], [-1, 0, 1, 2])
    hf.logits(context, tree, [1])  # feeds root and node 1 only
    hf.commit(context + [10, 11, 12])
    assert hf.cached_tokens.tolist() == context + [10]
    assert_cache_is_prefill(hf, model)
    hf.commit(context[:3])  # a shorter context (a new sequence sharing a prefix)
    assert hf.cached_tokens.tolist() == context[:3]
    assert_cache_is_prefill(hf, model)
    other = [7] + context[1:]  # differs at the first token: nothing reusable
    root = Tree.root_only(other[-1])
    assert_rows(hf.logits(other, root, [0]), model, other, root, [0])


def test_root_already_in_committed_prefix(arch_model):
    _, model = arch_model
    rng = np.random.default_rng(7)
    hf = wrap(model)
    context = rng.integers(V, size=6).tolist()
    hf.logits(context, Tree.root_only(context[-1]), [0])
    hf.commit(context)  # the root's KV is now committed prefix
    tree = random_tree(rng, context[-1], 9)
    assert_rows(hf.logits(context, tree, [4, 0, 8]), model, context, tree, [4, 0, 8])
    hf.commit(context + tree.path_tokens(8))
    assert hf.cached_tokens.tolist() == context + tree.path_tokens(8)
    assert_cache_is_prefill(hf, model)


def test_rows_are_cut_to_the_vocabulary():
    model = tiny_model("qwen2", dtype=torch.float64)
    assert model.get_output_embeddings().weight.shape[0] > V
    rows = wrap(model).logits([1, 2, 3], Tree.root_only(3), [0])
    assert rows.shape == (1, V)
    with pytest.raises(ValueError, match="vocab_size"):
        HFModel(model, vocab_size=10_000)


def test_draw_topk_logprobs_probs(arch_model):
    _, model = arch_model
    rng = np.random.default_rng(8)
    hf = wrap(model)
    context = rng.integers(V, size=5).tolist()
    tree = random_tree(rng, context[-1], 10)
    nodes = np.arange(len(tree))
    rows = hf.logits(context, tree, nodes)
    ref = expected_rows(model, context, tree, nodes)
    np.testing.assert_array_equal(hf.draw(rows, 0.0), ref.argmax(-1).numpy())
    lp = torch.log_softmax(ref, -1).numpy()
    tokens, values = hf.topk(rows, 5)
    np.testing.assert_array_equal(tokens, np.argsort(-lp, axis=-1, kind="stable")[:, :5])
    np.testing.assert_allclose(values, np.take_along_axis(lp, tokens, -1), atol=1e-9)
    picks = rng.integers(V, size=(len(tree), 3))
    np.testing.assert_allclose(
        hf.logprobs(rows, picks, 0.0), np.take_along_axis(lp, picks, -1), atol=1e-9
    )
    np.testing.assert_allclose(
        hf.logprobs(rows, picks, 2.0),
        np.take_along_axis(torch.log_softmax(ref / 2.0, -1).numpy(), picks, -1),
        atol=1e-9,
    )
    probs = hf.probs(rows, 0.7)
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, torch.softmax(ref / 0.7, -1).numpy(), atol=1e-12)
    greedy = hf.probs(rows, 0.0)
    np.testing.assert_array_equal(greedy.argmax(-1), ref.argmax(-1).numpy())
    np.testing.assert_array_equal(greedy.sum(-1), 1.0)


def test_topk_ties_go_to_the_lower_id():
    hf = wrap(tiny_model("llama", dtype=torch.float32))
    logits = torch.tensor([[1.0, 3.0, 0.0, 3.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0, 5.0, 5.0]])
    tokens, values = hf.topk(logits, 4)
    np.testing.assert_array_equal(tokens, [[1, 3, 5, 4], [0, 1, 2, 3]])
    assert values[0, 0] == values[0, 2] and values[0, 2] > values[0, 3]
    np.testing.assert_array_equal(hf.draw(logits, 0.0), [1, 0])


def test_topk_agrees_with_a_stable_sort_with_and_without_ties():
    """Few logit levels (ties everywhere, also at the k-th value) to many (no ties: the fast
    path), one row and several at a time (more than a CPU ranks together)."""
    hf = wrap(tiny_model("llama", dtype=torch.float32))
    rng = np.random.default_rng(3)
    for levels in (2, 3, 10, 10**6):
        logits = torch.from_numpy(rng.integers(levels, size=(37, 50)).astype(np.float32))
        lp = torch.log_softmax(logits, -1).numpy()
        for k in (1, 4, 17, 50):
            ref = np.argsort(-lp, axis=-1, kind="stable")[:, :k]
            for rows in (slice(None), slice(0, 1)):
                tokens, values = hf.topk(logits[rows], k)
                np.testing.assert_array_equal(tokens, ref[rows])
                np.testing.assert_array_equal(values, np.take_along_axis(lp[rows], ref[rows], -1))
                # the GPU's ranking (one stable sort, no host read), run here on the CPU
                ids, vals = topk_sorted(torch.from_numpy(lp[rows]), k)
                np.testing.assert_array_equal(ids.numpy(), ref[rows])
                np.testing.assert_array_equal(vals.numpy(), values)


def test_sampling_is_seeded_and_follows_the_softmax():
    hf = wrap(tiny_model("llama", dtype=torch.float32), seed=11)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(20_000, 1)
    first = hf.draw(logits, 1.5)
    hf.reset(11)
    np.testing.assert_array_equal(hf.draw(logits, 1.5), first)
    hf.reset(12)
    assert not np.array_equal(hf.draw(logits, 1.5), first)
    freq = np.bincount(first, minlength=4) / len(first)
    np.testing.assert_allclose(freq, torch.softmax(logits[0] / 1.5, -1).numpy(), atol=0.015)


def test_row_blocks_drawn_as_one_give_the_tokens_drawn_block_by_block():
    """`draw((a, b))` is one read for the root row and a pass's rows (`decoding.loop._verify`):
    the same tokens as drawing a, then b, from the same seed, for the torch and toy backends."""
    from targetrows.core.toy import ToyPair

    hf = wrap(tiny_model("llama", dtype=torch.float32), seed=3)
    a, b = torch.randn(1, 50, generator=torch.Generator().manual_seed(0)), torch.randn(
        6, 50, generator=torch.Generator().manual_seed(1))
    for temperature in (0.0, 0.7):
        hf.reset(3)
        apart = np.concatenate([hf.draw(a, temperature), hf.draw(b, temperature)])
        hf.reset(3)
        np.testing.assert_array_equal(hf.draw((a, b), temperature), apart)
    toy = ToyPair(50, seed=0).target
    for temperature in (0.0, 0.7):
        toy.reset(3)
        apart = np.concatenate([toy.draw(a.numpy(), temperature), toy.draw(b.numpy(), temperature)])
        toy.reset(3)
        np.testing.assert_array_equal(toy.draw((a.numpy(), b.numpy()), temperature), apart)


def test_row_blocks_read_as_one_give_the_log_probs_of_each_block():
    """`logprobs((root, stale), tokens)` is one read for a rule's two rows
    (`decoding.planners._rows_read`): each row's log-probs of the tokens, as read one by one,
    for the torch and toy backends, at T=0 (read as 1) and T>0."""
    from targetrows.core.toy import ToyPair

    hf = wrap(tiny_model("llama", dtype=torch.float32))
    toy = ToyPair(50, seed=0).target
    a, b = (torch.randn(1, 50, generator=torch.Generator().manual_seed(i)) for i in (0, 1))
    tokens = np.array([[3, 7, 41]])
    for temperature in (0.0, 0.7):
        for model, rows in ((hf, (a, b)), (toy, (a.numpy(), b.numpy()))):
            apart = [model.logprobs(row, tokens, temperature)[0] for row in rows]
            np.testing.assert_array_equal(model.logprobs(rows, tokens, temperature), apart)


def test_a_fetch_reads_every_dtype_exactly_into_arrays_of_its_own():
    """`_fetch` brings tensors of mixed dtypes (a pool's ids, flags and log-probs, a queued
    read's, a check's) in one copy: each comes back in its dtype and shape, every value
    exact (int64 ids past 2**53 too), in arrays that later writes to the tensors leave alone
    (the next replay of a CUDA graph's bucket overwrites its outputs)."""
    hf = wrap(tiny_model("llama", dtype=torch.float32))
    rng = np.random.default_rng(0)
    host = [rng.integers(-2**62, 2**62, size=(2, 3)), rng.random(5) < 0.5,
            rng.standard_normal((4, 1)), rng.standard_normal(3).astype(np.float32),
            rng.integers(-2**31, 2**31, size=7).astype(np.int32), np.zeros((0, 2))]
    tensors = [torch.from_numpy(a.copy()) for a in host]
    hf._defer_checks = True
    hf._check_finite(torch.tensor([[1.0, 2.0], [3.0, float("nan")]]), np.array([6, 9]))
    with pytest.raises(ValueError, match=r"position\(s\) \[9\]"):
        hf._fetch(*tensors)
    queued = []
    hf._read_later([tensors[0][:, ::2]], queued.extend)  # a strided view
    hf._check_finite(torch.ones(2, 3), np.arange(2))
    out = [*hf._fetch(*tensors), *hf._fetch(tensors[2])]  # many tensors, and one alone
    for tensor in tensors:
        tensor.zero_() if tensor.dtype != torch.bool else tensor.fill_(True)
    for got, want in zip([*out, *queued], [*host, host[2], host[0][:, ::2]], strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_non_finite_logits_name_the_position():
    model = tiny_model("llama", seed=4, dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight[42] = float("nan")
    hf = wrap(model)
    with pytest.raises(ValueError, match=r"position\(s\) \[3\]"):  # on a CPU: at once
        hf.logits([1, 2, 42, 5], Tree.root_only(5), [0])
    # as on a GPU: checked with the next read of the rows, which waits for the device anyway
    hf._defer_checks = True
    hf.reset(0)
    rows = hf.logits([1, 2, 42, 5], Tree.root_only(5), [0])
    with pytest.raises(ValueError, match=r"position\(s\) \[3\]"):
        hf.draw(rows, 0)
    hf.logits([1, 2, 42, 5], Tree.root_only(5), [0])
    hf.reset(0)  # a new sequence starts with no check pending
    rows = hf.logits([1, 2, 7, 5], Tree.root_only(5), [0])
    assert hf.draw(rows, 0).shape == (1,)
    # finite rows whose sums overflow pass (the check sums rows before it looks at entries)
    huge = torch.full((2, 8), 3e38)
    hf._check_finite(huge, np.arange(2))
    hf._fetch()
    huge[1, 3] = float("inf")
    hf._check_finite(huge, np.arange(2))
    with pytest.raises(ValueError, match=r"position\(s\) \[1\]"):
        hf.draw(huge, 0)
    # the check keeps what it needs when it is queued: rows overwritten before the read (as
    # the next replay of a CUDA graph's bucket overwrites its outputs) cannot hide a NaN
    rows = torch.zeros(2, 8)
    rows[1, 2] = float("nan")
    hf._check_finite(rows, np.arange(2))
    rows.zero_()
    with pytest.raises(ValueError, match=r"position\(s\) \[1\]"):
        hf._fetch()


def test_sliding_window_models_are_refused():
    model = tiny_model(
        "qwen2", dtype=torch.float32, use_sliding_window=True, sliding_window=8, max_window_layers=0
    )
    with pytest.raises(ValueError, match="sliding-window"):
        HFModel(model, name="tiny-sliding")


def test_tree_root_must_be_the_last_context_token():
    hf = wrap(tiny_model("llama"))
    with pytest.raises(ValueError, match="root token 9"):
        hf.logits([1, 2, 3], Tree.root_only(9), [0])


def test_pool_expansion_matches_full_forwards():
    from targetrows.core import pool

    model = tiny_model("qwen3", seed=9, dtype=torch.float64)
    context = [5, 17, 99, 3]
    got, logq = pool.expand_model(wrap(model), context, top_k=3, depth=3)

    def row(ctx):
        return torch.softmax(reference_logits(model, ctx)[-1, :V], -1).numpy()

    want, want_logq = pool.expand(row, context, top_k=3, depth=3)
    assert got == want
    np.testing.assert_allclose(logq, want_logq, atol=1e-9)


@pytest.mark.parametrize("decoder", ["ar", "draft_rank", "rerank", "fts", "pearl"])
def test_greedy_decoding_equals_plain_greedy(decoder):
    """The real round loop over HFModel: every decoder reproduces plain greedy decoding. The
    draft is a second view of the target (long accepted paths: many commits keep tree entries)
    or an unrelated model (mostly rejections)."""
    from targetrows.decoding.config import DecodeConfig
    from targetrows.decoding.loop import generate

    target = tiny_model("llama", seed=0, dtype=torch.float64)
    prompt, expected = [3, 1, 4, 1, 5], []
    for _ in range(14):
        expected.append(int(reference_logits(target, prompt + expected)[-1, :V].argmax()))
    config = DecodeConfig(decoder=decoder, budget=6, max_new_tokens=14, pool=PoolShape(top_k=3, depth=3))
    for draft in (target, tiny_model("llama", seed=1, n_layers=1, dtype=torch.float64)):
        result = generate(wrap(target), wrap(draft), prompt, config)
        assert result.tokens == expected


def test_sampled_decoding_is_reproducible():
    from targetrows.decoding.config import DecodeConfig
    from targetrows.decoding.loop import generate

    target = tiny_model("qwen2", seed=0, dtype=torch.float32)
    draft = tiny_model("qwen2", seed=1, n_layers=1, dtype=torch.float32)
    runs = [
        generate(
            wrap(target),
            wrap(draft),
            [7, 8, 9],
            DecodeConfig(
                decoder="fts",
                budget=5,
                temperature=1.0,
                max_new_tokens=10,
                seed=seed, pool=PoolShape(top_k=3, depth=2),
            ),
        ).tokens
        for seed in (3, 3, 4)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == 10
    assert runs[0] != runs[2]


def test_plain_decoding_writes_hugging_faces_tokens_and_rows():
    """ar through the one pass (a mask, a span of the cache, the fused products) writes Hugging
    Face generate()'s tokens in float32, its rows equal to generate()'s to float32 rounding."""
    from targetrows.decoding.config import DecodeConfig
    from targetrows.decoding.loop import generate

    model = tiny_model("llama", seed=6, dtype=torch.float32)
    hf = HFModel(model, name="tiny")
    prompt = [5, 17, 3, 99, 42, 7, 8]
    seen = []
    logits_passes = hf.logits_passes

    def recording(*args):
        rows = yield from logits_passes(*args)
        seen.append(rows[0].clone())
        return rows

    hf.logits_passes = recording
    result = generate(hf, None, prompt, DecodeConfig("ar", max_new_tokens=6))
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             return_dict_in_generate=True, output_logits=True)
    assert out.sequences[0, len(prompt):].tolist() == result.tokens
    for ours, theirs in zip(seen, out.logits, strict=True):
        torch.testing.assert_close(ours, theirs[0], rtol=1e-5, atol=1e-5)
