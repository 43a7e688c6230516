"""EAGLE-3 heads as drafts (CPU, tiny random weights): target features, exact head rows against a
no-cache reference, every decoder lossless with heads in both checkpoint layouts, loading checks."""

import itertools
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cli_in_process import run_cli
from rerankers import decode_config
from sampling_check import assert_first_tokens_follow_the_target
from tiny_heads import save_tiny_head, tiny_head_tensors
from tiny_models import random_tree, save_tiny, tiny_model

from targetrows.core.pool import (
    PoolShape,
    expand_model,
)
from targetrows.core.tree import Tree
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names

DECODERS = decoder_names()
from targetrows.hf.lanes import Lanes
from targetrows.hf.loading import load_eagle3
from targetrows.hf.model import HFModel
from targetrows.hf.torch_rows import TorchRows

N_LAYERS = 6  # default feature layers 2, L//2, L-3 = 2, 3, 3
PROMPTS = [[5, 17, 42], [200, 3, 9, 9, 31], [64]]


def hidden_states(model, tokens):
    ids = torch.tensor([list(tokens)])
    with torch.no_grad():
        return model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states


def hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


# -- an independent reference of the head: plain formulas, no cache, one entry at a time --------

def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta=10000.0):
    """Rotary embedding with float32 angles, as transformers computes them for every dtype."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


def reference_rows(w, embed, feats, ctx, path, n_heads=4, n_kv=2):
    """Draft logits (over the draft vocabulary) after ctx + path: entries t = 0..n-2 from the
    target features, then the path's tokens each fed its predecessor's g."""
    n = len(ctx)
    hs, toks, pos = [], [], []
    keys, values, g = [], [], None
    steps = [(w["fc.weight"] @ feats[t], ctx[t + 1], t) for t in range(n - 1)]
    steps += [(None, tok, n - 2 + d + 1) for d, tok in enumerate(path)]
    for h, tok, p in steps:
        h = g if h is None else h
        x = torch.cat([_rms(embed[tok], w["layer.input_layernorm.weight"]),
                       _rms(h, w["layer.hidden_norm.weight"])])
        q = (w["layer.self_attn.q_proj.weight"] @ x).view(n_heads, -1)
        k = (w["layer.self_attn.k_proj.weight"] @ x).view(n_kv, -1)
        v = (w["layer.self_attn.v_proj.weight"] @ x).view(n_kv, -1)
        q, k = _rope(q, torch.tensor([p] * n_heads)), _rope(k, torch.tensor([p] * n_kv))
        keys.append(k)
        values.append(v)
        K, V = torch.stack(keys, 1), torch.stack(values, 1)  # [kv, S, d]
        K, V = K.repeat_interleave(n_heads // n_kv, 0), V.repeat_interleave(n_heads // n_kv, 0)
        att = torch.softmax((K @ q[:, :, None])[..., 0] / q.shape[-1] ** 0.5, -1)  # [heads, S]
        o = (att[:, :, None] * V).sum(1).reshape(-1)
        h = h + w["layer.self_attn.o_proj.weight"] @ o
        y = _rms(h, w["layer.post_attention_layernorm.weight"])
        act = torch.nn.functional.silu(w["layer.mlp.gate_proj.weight"] @ y)
        g = h + w["layer.mlp.down_proj.weight"] @ (act * (w["layer.mlp.up_proj.weight"] @ y))
        hs.append(h), toks.append(tok), pos.append(p)
    return w["lm_head.weight"] @ _rms(g, w["norm.weight"])


@pytest.fixture(scope="module")
def llama_target():
    return tiny_model("llama", seed=0, n_layers=N_LAYERS, dtype=torch.float64)


def _draft(target_hf, folder, **kw):
    target = HFModel(target_hf, name="target")
    draft = load_eagle3(str(folder), target, **kw)
    return target, draft


def test_target_features_follow_the_cache(llama_target, tmp_path):
    """After decoding rounds (trees fed, paths gathered, the rest cropped) the target's features
    at every cached position equal hidden_states[2], [3], [3] of a fresh pass."""
    folder = save_tiny_head(tmp_path / "h", llama_target.config)
    target, draft = _draft(llama_target, folder)
    assert target.feature_layers == (2, 3, 3)
    # the last run outgrows the feature buffer made at its prompt's pass (room for 398 rows)
    long_prompt = (PROMPTS[1] * 60)[:200]
    for decoder, prompt, n_new in (("draft_rank", PROMPTS[1], 20), ("fts", PROMPTS[1], 20),
                                   ("draft_rank", long_prompt, 220)):
        result = generate(target, draft, prompt, decode_config(decoder, budget=6,
                                                              max_new_tokens=n_new, pool=PoolShape(top_k=3)))
        cached = target.cached_tokens.tolist()
        assert cached == (prompt + result.tokens)[: len(cached)]
        feats = target.features(cached, 0, len(cached))
        hs = hidden_states(llama_target, cached)
        want = torch.cat([hs[2][0], hs[3][0], hs[3][0]], -1)
        torch.testing.assert_close(feats, want, rtol=1e-10, atol=1e-10)


def test_a_head_is_timed_one_pass_per_size_and_refeeds_what_a_round_committed(llama_target,
                                                                               tmp_path,
                                                                               monkeypatch):
    """The cost model's draft pass times are one head pass each (the timed nodes are one level),
    and the head declares that a round's committed tokens are fed again in its next first pass:
    the width of that pass is what the previous round committed."""
    from targetrows.cost import parttimes

    target, draft = _draft(llama_target, save_tiny_head(tmp_path / "h", llama_target.config))
    widths = []
    run_batch = Lanes.run_batch

    def recorded(passes, feeds):  # the widths of the head's passes
        if passes.name == draft.name:
            widths.extend(len(feed.ids) for feed in feeds)
        return run_batch(passes, feeds)

    monkeypatch.setattr(Lanes, "run_batch", recorded)
    parttimes.time_passes(draft, PROMPTS[1], [1, 3, 6], repeats=1)
    assert widths[-3:] == [1, 3, 6]  # the last repeat: one pass of each size
    assert draft.refeeds_committed
    result = generate(target, draft, PROMPTS[1],
                      decode_config("draft_rank", budget=6, max_new_tokens=12,
                                    pool=PoolShape(top_k=3, depth=2)))
    widths.clear()
    ctx = PROMPTS[1] + result.tokens
    draft.commit(ctx[:-3])  # three tokens committed since: fed again, in one pass
    draft.logits(ctx, Tree.root_only(ctx[-1]), [0])
    assert widths == [3]


@pytest.mark.parametrize("layout, written, inputs", [
    ("eagle", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 0, 1]}}, [1, 2, 4]),
    ("speculators", {"eagle_aux_hidden_state_layer_ids": [4, 0, 1]}, [0, 1, 4]),
])
def test_explicit_layer_ids_follow_each_keys_convention(llama_target, tmp_path, layout, written,
                                                        inputs):
    """SGLang and SpecForge's eagle_config ids are layer outputs (SGLang captures id + 1);
    vLLM and speculators' top-level ids are layer inputs (hidden_states[j]); features are
    concatenated in ascending layer order whatever order the list has."""
    folder = save_tiny_head(tmp_path / "h", llama_target.config, layout=layout,
                            config_overrides=written)
    target, draft = _draft(llama_target, folder)
    ctx = PROMPTS[1]
    feats = target.features(ctx, 0, len(ctx) - 1)
    hs = hidden_states(llama_target, ctx[:-1])
    torch.testing.assert_close(feats, torch.cat([hs[i][0] for i in inputs], -1))


@pytest.mark.parametrize("embed", [False, True])
def test_head_rows_match_a_no_cache_reference(llama_target, tmp_path, embed):
    """Rows of pool expansion (level by level), of random trees with nodes asked in any order,
    and after commits, equal the plain formulas; tokens outside the draft vocabulary are -inf."""
    sizes = dict(draft_vocab_size=90, embed=embed, hidden=40 if embed else None)
    folder = save_tiny_head(tmp_path / "h", llama_target.config, **sizes)
    w = tiny_head_tensors(llama_target.config, **sizes)
    w = {k: v.double() if v.is_floating_point() else v for k, v in w.items()}
    embed_table = w["embed_tokens.weight"] if embed else llama_target.model.embed_tokens.weight
    target_ids = torch.arange(90) + w["d2t"]
    target, draft = _draft(llama_target, folder)
    rng = np.random.default_rng(0)

    def check(ctx, tree, nodes, rows):
        hs = hidden_states(llama_target, ctx)
        feats = torch.cat([hs[2][0], hs[3][0], hs[3][0]], -1)
        assert torch.isinf(rows[:, ~torch.isin(torch.arange(rows.shape[1]), target_ids)]).all()
        for node, row in zip(nodes, rows, strict=True):
            path = []
            while node > 0:
                path.append(int(tree.tokens[node]))
                node = int(tree.parents[node])
            want = reference_rows(w, embed_table, feats, ctx, path[::-1])
            torch.testing.assert_close(row[target_ids], want, rtol=1e-9, atol=1e-9)

    ctx = list(PROMPTS[0])
    for _ in range(3):
        pool, _ = expand_model(draft, ctx, top_k=3, depth=3)  # fills the cache level by level
        nodes = rng.permutation(len(pool))[:7]
        check(ctx, pool, nodes, draft.logits(ctx, pool, nodes))  # rows of fed nodes again
        tree = random_tree(rng, ctx[-1], 9, 272)
        nodes = rng.permutation(9)[:5]
        check(ctx, tree, nodes, draft.logits(ctx, tree, nodes))
        ctx = ctx + [int(t) for t in rng.integers(0, 259, size=int(rng.integers(1, 4)))]
        target.logits(ctx, Tree.root_only(ctx[-1]), [0])  # the target moves on, as after a round
        target.commit(ctx)
        draft.commit(ctx)
    one = draft.logits([7], Tree([7, 8], [-1, 0]), [0, 1])  # a one-token context: h = 0
    assert torch.isfinite(one[:, target_ids]).all()


def test_the_heads_topk_over_its_vocabulary_is_the_topk_of_its_rows(llama_target, tmp_path):
    """The head's top-k reads only its draft vocabulary's columns: the same tokens, order and
    log-probs as over the full rows, ties at the k-th place included."""
    folder = save_tiny_head(tmp_path / "h", llama_target.config, draft_vocab_size=90)
    _, draft = _draft(llama_target, folder)
    ctx = list(PROMPTS[0])
    pool, _ = expand_model(draft, ctx, top_k=3, depth=2)
    rows = draft.logits(ctx, pool, range(len(pool)))
    tied = rows.clone()
    tied[:, draft.engine.target_cols[::3]] = 0.5  # 30 equal tokens, some of them at the k-th place
    for r in (rows, tied):
        for k in (1, 4, 35, 90, 120):  # 120 > the draft vocabulary: the full rows
            got, want = draft.topk(r, k), TorchRows.topk(draft, r, k)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_the_heads_topk_at_nodes_is_the_topk_of_their_rows(llama_target, tmp_path):
    """`topk_at` ranks the draft vocabulary's logits without widening them: the same tokens,
    order and log-probs as `topk(logits(...))`, on a fresh tree and on one grown from it."""
    folder = save_tiny_head(tmp_path / "h", llama_target.config, draft_vocab_size=90)
    _, draft = _draft(llama_target, folder)
    _, again = _draft(llama_target, folder)
    ctx = list(PROMPTS[0])
    pool, _ = expand_model(draft, ctx, top_k=3, depth=3)
    for nodes in ([0], [1, 2, 3], range(len(pool))):
        for k in (1, 3, 90, 120):
            got = draft.topk_at(ctx, pool, nodes, k)
            want = again.topk(again.logits(ctx, pool, nodes), k)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


@pytest.mark.parametrize("arch, layout, vocab", [("llama", "eagle", 272), ("qwen2", "speculators", 120),
                                                 ("qwen3", "eagle", 60)])
def test_every_decoder_matches_greedy(tmp_path, arch, layout, vocab):
    """Temperature 0: every decoder with the head reproduces ar and HF generate, token for token."""
    target_hf = tiny_model(arch, seed=0, n_layers=N_LAYERS, dtype=torch.float64)
    folder = save_tiny_head(tmp_path / "h", target_hf.config, layout=layout,
                            draft_vocab_size=vocab)
    target, draft = _draft(target_hf, folder)
    for prompt in PROMPTS:
        reference = hf_greedy(target_hf, prompt, 40)
        assert generate(target, None, prompt, DecodeConfig("ar", max_new_tokens=40)).tokens == reference
        for decoder, budget in itertools.product(DECODERS[1:], (1, 12)):
            cfg = decode_config(decoder, budget=budget, max_new_tokens=40, pool=PoolShape(top_k=4, depth=4))
            assert generate(target, draft, prompt, cfg).tokens == reference, (decoder, budget, prompt)


def test_drafting_alongside_the_root_pass(llama_target, tmp_path):
    """overlap=True: the head drafts while the target's root pass is queued on its side stream
    (the first round's feeds the prompt before the head's first read)."""
    folder = save_tiny_head(tmp_path / "h", llama_target.config, draft_vocab_size=150)
    target, draft = _draft(llama_target, folder)
    reference = hf_greedy(llama_target, PROMPTS[1], 30)
    for decoder in ("rerank", "fts", "pearl"):
        cfg = decode_config(decoder, budget=8, max_new_tokens=30, overlap=True,
                           pool=PoolShape(top_k=3, depth=3))
        assert generate(target, draft, PROMPTS[1], cfg).tokens == reference, decoder


def test_the_head_drafts_while_the_root_pass_is_queued(llama_target, tmp_path):
    """The head's draft at context c + [t] reads the target's features up to c, which the last
    round committed: it needs nothing from the root pass at c + [t], though that pass has been
    asked for and not yet run (as the scheduler leaves it beside drafting), and its rows are
    those of an undisturbed head."""
    folder = save_tiny_head(tmp_path / "h", llama_target.config, draft_vocab_size=150)
    target, draft = _draft(llama_target, folder)
    ctx, t = PROMPTS[1], 5
    target.logits(ctx, Tree.root_only(ctx[-1]), [0])
    target.commit(ctx)
    _, undisturbed = _draft(llama_target, folder)
    want = undisturbed.logits(ctx + [t], Tree.root_only(t), [0])

    root = target.logits_passes(ctx + [t], Tree.root_only(t), [0])
    pending = next(root)  # the root pass, asked for, not run
    head = draft.logits_passes(ctx + [t], Tree.root_only(t), [0])
    asked = []
    try:
        request = next(head)
        while True:
            asked.append(request.group)
            request = head.send(request.group.run_batch([request.item])[0])
    except StopIteration as done:
        drafted = done.value
    assert all(group.name == draft.name for group in asked), "the head asked for a target pass"
    torch.testing.assert_close(drafted, want, rtol=0, atol=0)
    with pytest.raises(StopIteration):  # the root pass then completes as asked
        root.send(pending.group.run_batch([pending.item])[0])


def test_sampling_is_lossless_with_a_reduced_vocabulary(tmp_path):
    """Temperature 1: each decoder's first 3 tokens follow the target's distribution, though the
    head can only propose 3 of the 5 tokens."""
    vocab, samples = 5, 400
    target_hf = tiny_model("qwen3", seed=3, n_layers=N_LAYERS, vocab_size=vocab, init_range=0.5,
                           dtype=torch.float64, eos_token_id=None, pad_token_id=None)
    folder = save_tiny_head(tmp_path / "h", target_hf.config, draft_vocab_size=3)
    target, draft = _draft(target_hf, folder)
    assert_first_tokens_follow_the_target(target_hf, target, draft, DECODERS[1:], [1, 2], vocab,
                                          samples)


def test_bin_and_both_layouts_load_the_same_head(llama_target, tmp_path):
    """The same tensors as EAGLE safetensors, speculators safetensors and a weights-only .bin
    give the same rows."""
    ctx = PROMPTS[1]
    tree = Tree([ctx[-1], 4, 9, 11], [-1, 0, 0, 1])
    rows = []
    for layout, safe in (("eagle", True), ("speculators", True), ("eagle", False)):
        folder = save_tiny_head(tmp_path / f"{layout}-{safe}", llama_target.config, layout=layout,
                                safe=safe, draft_vocab_size=100)
        _, draft = _draft(llama_target, folder)
        rows.append(draft.logits(ctx, tree, range(4)))
    for other in rows[1:]:
        assert torch.equal(rows[0], other)


@pytest.mark.parametrize("change, message", [
    (dict(target_hidden_size=32), "target_hidden_size"),
    (dict(vocab_size=300), "vocab_size"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 3, 6]}),
     "eagle_aux_hidden_state_layer_ids"),
    (dict(eagle_aux_hidden_state_layer_ids=[2, 3, 4],
          eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 3, 4]}), "two sets"),
    (dict(norm_output=False), "norm_output=false"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings"),
    (dict(num_hidden_layers=2), "num_hidden_layers"),
])
def test_a_mismatched_or_unknown_head_is_refused(llama_target, tmp_path, change, message):
    folder = save_tiny_head(tmp_path / "h", llama_target.config, config_overrides=change)
    with pytest.raises(ValueError, match=message) as err:
        _draft(llama_target, folder)
    assert str(folder) in str(err.value)
    if message in ("target_hidden_size", "vocab_size", "eagle_aux_hidden_state_layer_ids"):
        assert "target" in str(err.value)  # names both models


def test_unknown_tensors_and_unsafe_pickles_are_refused(llama_target, tmp_path):
    folder = save_tiny_head(tmp_path / "h", llama_target.config, safe=False)
    state = torch.load(folder + "/pytorch_model.bin", weights_only=True)
    torch.save(dict(state, **{"fc_norm.weight": torch.ones(64)}), folder + "/pytorch_model.bin")
    with pytest.raises(ValueError, match="fc_norm.weight"):
        _draft(llama_target, folder)

    class Evil:
        def __reduce__(self):
            return (print, ("unpickled code ran",))

    torch.save(dict(state, evil=Evil()), folder + "/pytorch_model.bin")
    with pytest.raises(ValueError, match="weights-only"):
        _draft(llama_target, folder)


@pytest.fixture(scope="module")
def saved_target_and_head(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = save_tiny(root / "target", "llama", n_layers=N_LAYERS)
    config = tiny_model("llama", n_layers=N_LAYERS).config
    return target, save_tiny_head(root / "head", config, layout="speculators", draft_vocab_size=200)


def test_compare_and_record_with_a_head(saved_target_and_head, tmp_path, capsys):
    target, head = saved_target_and_head
    out = tmp_path / "compare.json"
    proc = run_cli(capsys, "compare", "--target", target, "--draft", head, "--prompt",
                   "Tell me a story", "--budget", "8", "--max-new-tokens", "16", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "every decoder reproduced ar's tokens exactly" in proc.stdout
    rows = {r["decoder"]: r for r in json.loads(out.read_text())["decoders"]}
    assert set(rows) == set(decoder_names(learned=False))  # no --reranker: no learned ones
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["Hello"]}) + "\n")
    log = tmp_path / "rows.npz"
    proc = run_cli(capsys, "record", "--target", target, "--draft", head, "--prompts",
                   str(prompts), "--out", str(log), "--max-new-tokens", "6", "--quiet")
    assert proc.returncode == 0, proc.stderr
    from tiny_heads import draft_vocab

    from targetrows.rowlog.format import read

    rowlog = read(str(log))
    assert len(rowlog.rec_scored) >= 6 and rowlog.header["draft"] == head
    drafted = rowlog.pool_tokens[rowlog.pool_parents >= 0]  # pools hold draft-vocabulary tokens
    assert len(drafted) and np.isin(drafted, draft_vocab(272, 200).numpy()).all()


def test_compare_and_record_with_prompt_lookup_mixed_in(saved_target_and_head, tmp_path, capsys):
    from targetrows.cli import main
    from targetrows.rowlog.format import read

    target, head = saved_target_and_head
    assert main(["compare", "--target", target, "--draft", head, "--draft-lookup", "--prompt",
                 "say it again: the cat sat on the mat, the cat sat on the", "--budget", "8",
                 "--max-new-tokens", "16", "--dtype", "float32"]) == 0
    assert "every decoder reproduced ar's tokens exactly" in capsys.readouterr().out
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["Hi, hi"]}) + "\n")
    log = tmp_path / "rows.npz"
    assert main(["record", "--target", target, "--draft", head, "--draft-lookup", "--prompts",
                 str(prompts), "--out", str(log), "--max-new-tokens", "6", "--quiet"]) == 0
    assert read(str(log)).header["draft"] == f"{head} + prompt lookup"
    assert main(["compare", "--target", target, "--draft-lookup", "--decoders", "ar",
                 "--prompt", "Hi"]) == 2
    assert "--draft-lookup mixes prompt lookup into a draft" in capsys.readouterr().err


def test_prompt_lookup_guesses_outside_the_draft_vocabulary_stay_greedy(llama_target, tmp_path):
    """The head ranks 40 of 272 tokens; prompt lookup guesses the rest too, and the head
    expands them (its embedding is the target's): every decoder still reproduces greedy."""
    from targetrows.core.lookup import LookupDraft

    folder = save_tiny_head(tmp_path / "h", llama_target.config, draft_vocab_size=40)
    target, head = _draft(llama_target, folder)
    draft = LookupDraft(head)
    prompt = hf_greedy(llama_target, [7, 250, 99], 20)[:16] * 2  # copies to find
    # ar is the reference (HF generate would read the prompt's token 0 as padding)
    reference = generate(target, None, prompt, DecodeConfig("ar", max_new_tokens=30)).tokens
    for decoder in DECODERS[1:]:
        cfg = decode_config(decoder, budget=8, max_new_tokens=30, pool=PoolShape(top_k=3, depth=3))
        assert generate(target, draft, prompt, cfg).tokens == reference, decoder
    tokens, _ = draft.topk_at(prompt, Tree.root_only(prompt[-1]), [0], 3)
    guessed = int(tokens[0, 0])
    assert guessed == draft.index.guess(prompt)[0]
    assert guessed not in head.topk_at(prompt, Tree.root_only(prompt[-1]), [0], 40)[0][0]
