"""train-eagle3 on tiny random-weight models: the unrolled training forward is the backend's tree
pass, the loss is autograd's, the draft vocabulary, the reply features, and the whole command
(reproducible, loadable, lossless as a draft)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file
from tiny_models import save_tiny, tiny_model
from transformers import AutoModelForCausalLM

from targetrows import cli
from targetrows.core.tree import Tree
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.heads.checkpoint import write_head
from targetrows.hf.loading import load_eagle3
from targetrows.hf.model import HFModel
from targetrows.train import eagle3_init as ei
from targetrows.train import eagle3_step as es
from targetrows.train import eagle3_train as et
from targetrows.train.optimise import batch_order
from targetrows.train.replies import TeacherData
from targetrows.train.reply_generation import generate_batch

N_LAYERS = 6  # feature layers 2, 3, 3
LAYERS = (2, 3, 3)


def exact_data(target, sequences, prompt_lens) -> TeacherData:
    """Replies data from plain fp32 full forwards (no batching, no fp16): the ground truth."""
    feats, hidden, top = [], [], []
    for seq, p in zip(sequences, prompt_lens, strict=True):
        with torch.no_grad():
            hs = target(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
            final = target.model(input_ids=torch.tensor([seq])).last_hidden_state[0]
        feats.append(torch.cat([hs[i][0] for i in LAYERS], -1)[:-1])
        hidden.append(final[p - 1 : -1])
        top.append((final[p - 1 : -1] @ target.lm_head.weight.T).topk(4).indices.int())
    return TeacherData(sequences, prompt_lens, torch.cat(hidden), torch.cat(top),
                       torch.cat(feats), LAYERS)


def test_the_unrolled_training_forward_is_the_backends_tree_pass(tmp_path):
    target_hf = tiny_model(n_layers=N_LAYERS)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (9, 14)]
    data = exact_data(target_hf, seqs, [4, 6])
    draft_ids = torch.tensor(sorted(set(range(0, 260, 3)) | set(sum(seqs, []))))
    head, config = ei.new_head(target_hf, draft_ids, LAYERS, init_from_target=True, seed=0)
    with torch.no_grad():  # a random head, far from its initialisation, so every part matters
        for p in head.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    write_head(str(tmp_path / "head"), ei.head_tensors(head, target_hf.config.vocab_size), config)
    target = HFModel(target_hf, name="target")
    draft = load_eagle3(str(tmp_path / "head"), target)

    depth = 3
    f_off, h_off = es.offsets(data)
    batch = es.make_batch(data, [0, 1], depth, f_off, h_off)
    assert batch.lo == 4 - 2 and batch.roots.tolist() == [2, 4]
    with torch.no_grad():
        steps = [g for _, g in es.unrolled(head, target_hf.get_input_embeddings(), batch, depth)]
    checked = 0
    for b, seq in enumerate(seqs):
        for t in range(batch.lo, len(seq) - 1 - depth):  # roots from the shortest prompt's on
            ctx = seq[: t + 2]  # the root is entry t: feature t with token t + 1
            path = seq[t + 2 : t + 2 + depth - 1]
            tree = Tree([ctx[-1], *path], [-1, *range(len(path))])
            rows = draft.logits(ctx, tree, np.arange(len(tree)))[:, draft_ids]
            want = torch.stack([head.draft_logits(steps[k][b, t - batch.lo])
                                for k in range(depth)])
            assert torch.allclose(rows, want, atol=2e-4), (b, t)
            checked += 1
    assert checked > 10


def test_a_head_started_from_the_target_layer_is_that_layer_on_its_feature():
    target_hf = tiny_model(n_layers=N_LAYERS)
    seq = torch.randint(0, 200, (11,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hs = target_hf(input_ids=seq[None], output_hidden_states=True).hidden_states
    head, _ = ei.new_head(target_hf, torch.arange(50), LAYERS, init_from_target=True, seed=0,
                          init_layer=True)
    h = head.shape.hidden_size
    with torch.no_grad():
        assert not torch.equal(head.fc.weight[:, : 2 * h], torch.zeros(h, 2 * h))
        ei.copy_target_layer(head, target_hf, LAYERS[-1], fc_scale=0.0)
        for name in ("q_proj", "k_proj", "v_proj"):  # silence the token embedding's half
            getattr(head.layer.self_attn, name).weight[:, :h] = 0
        features = torch.cat([hs[i][0] for i in LAYERS], -1)
        n, s = len(seq), head.shape
        empty = torch.zeros(s.num_kv_heads, 0, s.head_dim)
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        g, _, _ = head.step(head.fc(features), torch.randn(n, h), torch.arange(n), empty, empty,
                            causal)
    # the target's layer LAYERS[-1] turns hidden_states[LAYERS[-1]] into the next ones
    want = hs[LAYERS[-1] + 1][0]
    assert torch.allclose(g, want, atol=1e-5 * want.abs().max().item())


def test_reply_rows_line_up_with_the_positions_they_predict():
    target_hf = tiny_model(n_layers=N_LAYERS)
    seqs, plens = [[5, 6, 7, 8, 9, 10], [1, 2, 3, 4]], [3, 2]
    data = exact_data(target_hf, seqs, plens)
    f_off, h_off = es.offsets(data)
    batch = es.make_batch(data, [0, 1], 2, f_off, h_off)
    assert batch.lo == 0
    for k in range(2):
        mask, rows = es.step_rows(batch, k)
        # step k at index t predicts token t + 2 + k of a tree rooted at entry t (a context of
        # t + 2 tokens, at least the prompt)
        want = [[t for t in range(len(s) - 1) if t + 2 >= p and t + 2 + k <= len(s) - 1]
                for s, p in zip(seqs, plens, strict=True)]
        for b in range(len(seqs)):
            assert mask[b].nonzero()[:, 0].tolist() == want[b]
        assert batch.greedy[rows].tolist() == [seqs[b][t + 2 + k] for b in range(len(seqs))
                                               for t in want[b]]


def test_the_out_of_vocabulary_mask_drops_the_positions_whose_argmax_the_head_cannot_draft():
    """With mask_outside_vocab (EAGLE's and SpecForge's loss mask), a position counts only when
    the target's argmax there is a draft token; each step's loss is the soft cross-entropy over
    the positions kept, computed here from plain formulas."""
    target_hf = tiny_model(n_layers=N_LAYERS)
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in (10, 13)]
    data = exact_data(target_hf, seqs, [3, 5])
    best = data.top[:, 0].long().unique()
    draft_ids = torch.tensor(sorted(set(range(0, 260, 2)) | set(best[::2].tolist())))
    head, _ = ei.new_head(target_hf, draft_ids, LAYERS, init_from_target=True, seed=0)
    embed = target_hf.get_input_embeddings()
    target_w = target_hf.lm_head.weight[draft_ids].detach()
    f_off, h_off = es.offsets(data)
    batch = es.make_batch(data, [0, 1], 2, f_off, h_off)
    config = et.Eagle3TrainConfig(ttt_steps=2, mask_outside_vocab=True)
    with torch.no_grad():
        got = et.batch_loss(head, embed, batch, config, target_w)
        want, kept, dropped = 0.0, 0, 0
        for k, g in es.unrolled(head, embed, batch, 2):
            mask, rows = es.step_rows(batch, k)
            keep = torch.isin(batch.best[rows], draft_ids)
            kept, dropped = kept + int(keep.sum()), dropped + int((~keep).sum())
            z = head.lm_head(head.norm(g[mask][keep]))
            p = torch.softmax(batch.hidden[rows[keep]] @ target_w.T, -1)
            want += 0.8 ** k * (z.logsumexp(-1) - (p * z).sum(-1)).mean()
    assert kept and dropped
    torch.testing.assert_close(got, torch.as_tensor(want, dtype=got.dtype), rtol=1e-5, atol=1e-5)


def test_batched_replies_keep_the_features_of_every_position_fed():
    target = tiny_model(n_layers=N_LAYERS)
    prompts = [[5, 17, 42, 7], [200, 3, 9, 9, 31, 8, 2], [64, 1]]
    out = generate_batch(target, prompts, 6, stop={17}, top_k=4, feature_layers=LAYERS)
    for prompt, (reply, _, _, feats) in zip(prompts, out, strict=True):
        seq = prompt + reply.tolist()
        with torch.no_grad():
            hs = target(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
        want = torch.cat([hs[i][0] for i in LAYERS], -1)[:-1]
        assert feats.shape == want.shape  # every position but the last, prompt included
        assert torch.allclose(feats.float(), want, atol=2e-3 * want.abs().max().item())


def test_the_chunked_soft_cross_entropy_is_autograds_in_value_and_gradient():
    gen = torch.Generator().manual_seed(0)
    target_p = torch.randn(9, 11, generator=gen, dtype=torch.float64).softmax(-1)
    rows = torch.tensor([8, 0, 3, 3, 5, 1, 7])  # gathered, repeated, out of order
    z = torch.randn(len(rows), 11, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(len(rows), 11, generator=gen, dtype=torch.float64)
    want = -(target_p[rows] * z.log_softmax(-1)).sum(-1).mean()
    (want_grad,) = torch.autograd.grad((want * 3.0) + (z * weight).sum(), z)
    for chunk in (1, 3, 7, 64):  # chunks that split the rows unevenly, and one that does not
        for own in (False, True):  # owning: the gradient overwrites an intermediate copy of z
            logits = z * 1.0 if own else z
            got = es.SoftCrossEntropy.apply(logits, target_p, rows, chunk, own)
            (grad,) = torch.autograd.grad((got * 3.0) + (z * weight).sum(), z)
            assert torch.allclose(got, want, rtol=1e-12)
            assert torch.allclose(grad, want_grad, rtol=1e-10, atol=1e-14)


def test_the_head_logits_are_exact_and_their_gradients_close_in_bfloat16():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(37, 24, generator=gen, requires_grad=True)
    w = torch.randn(53, 24, generator=gen, requires_grad=True)
    weight = torch.randn(37, 53, generator=gen)
    want = x @ w.T
    want_dx, want_dw = torch.autograd.grad((want * weight).sum(), (x, w))
    for grad_dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        z = es.HeadLogits.apply(x, w, grad_dtype)
        assert z.dtype == torch.float32
        assert torch.allclose(z, want, rtol=1e-5, atol=1e-5)  # the logits stay float32
        dx, dw = torch.autograd.grad((z * weight).sum(), (x, w))
        assert dx.dtype == dw.dtype == torch.float32
        for got, ref in ((dx, want_dx), (dw, want_dw)):
            assert (got - ref).abs().max() <= tol * ref.abs().max()
    frozen = w.detach()  # a frozen lm_head gets no gradient
    (dx,) = torch.autograd.grad(es.HeadLogits.apply(x, frozen, torch.bfloat16).sum(), (x,))
    assert dx.shape == x.shape


def test_sampled_replies_follow_the_targets_distribution_and_keep_its_rows():
    """A sampled reply is seeded (the same seed, the same reply), and at every position its
    kept top-k ids and hidden state are the target's own at that context, whatever token was
    drawn: the labels stay the target's distributions."""
    target = tiny_model(n_layers=N_LAYERS)
    prompts = [[5, 17, 42, 7], [200, 3, 9, 9, 31, 8, 2]]

    def sampled(seed):
        return generate_batch(target, prompts, 8, stop=set(), top_k=4, feature_layers=LAYERS,
                              sampler=torch.Generator().manual_seed(seed))

    first, again, other = sampled(0), sampled(0), sampled(1)
    greedy = generate_batch(target, prompts, 8, stop=set(), top_k=4)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(first, other, strict=True))
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(first, greedy, strict=True))
    for prompt, (reply, hidden, top, _) in zip(prompts, first, strict=True):
        seq = prompt + reply.tolist()
        with torch.no_grad():
            logits = target(input_ids=torch.tensor([seq])).logits[0, len(prompt) - 1 : -1]
        assert torch.equal(top[:, 0].long(), logits.argmax(-1))
        torch.testing.assert_close(hidden.float() @ target.lm_head.weight.T, logits,
                                   rtol=0, atol=2e-2 * logits.abs().max().item())


def test_feature_noise_scales_with_each_features_spread():
    gen = torch.Generator().manual_seed(0)
    spread = torch.tensor([0.1, 1.0, 30.0])
    data = SimpleNamespace(features=torch.randn(5000, 3, generator=gen) * spread + 7.0)
    assert torch.allclose(et.feature_std(data), spread, rtol=0.05)
    assert et.feature_std(data, sample=100).shape == (3,)


def test_length_sorted_batches_still_visit_every_sequence_once_an_epoch():
    n, batch, steps = 37, 4, 30  # 120 indices: three whole epochs and part of a fourth
    lengths = torch.randint(1, 200, (n,), generator=torch.Generator().manual_seed(1))
    plain = batch_order(n, steps, batch, torch.Generator().manual_seed(0))
    order = batch_order(n, steps, batch, torch.Generator().manual_seed(0), lengths, window=3)
    assert len(order) == len(plain) >= steps * batch
    for e in range(len(order) // n):  # each epoch is a permutation of all n, as without lengths
        epoch = order[e * n : (e + 1) * n]
        assert sorted(epoch.tolist()) == list(range(n))
        assert sorted(epoch.tolist()) == sorted(plain[e * n : (e + 1) * n].tolist())
        for w in epoch.split(3 * batch):  # each window of 3 batches runs shortest first
            assert torch.equal(lengths[w], lengths[w].sort().values)
    again = batch_order(n, steps, batch, torch.Generator().manual_seed(0), lengths, window=3)
    assert torch.equal(order, again)


def test_auto_precision_is_bfloat16_only_where_its_products_are_fast(monkeypatch):
    from targetrows.hf import loading
    from targetrows.hf.loading import resolve_dtype

    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("float32", "cuda") == torch.float32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert resolve_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    monkeypatch.setattr(loading, "kernels_take_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    monkeypatch.setattr(loading, "kernels_take_bf16", lambda: False)  # held to AVX2
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("bf17", "cpu")


def test_the_draft_vocabulary_is_the_smallest_covering_set_plus_stops():
    seqs = [[9, 9, 1, 1, 1, 1, 2, 2, 3], [9, 4, 1, 2]]  # replies after 1 token: see prompt_lens
    replies = [t for s in seqs for t in s[1:]]  # 9 1 1 1 1 2 2 3 | 4 1 2: 1: 5, 2: 3, 9, 3, 4: 1
    second = [7] * 6 + [8] * 5  # the target's runner-up at each reply position
    top = torch.tensor([replies, second]).T.int()
    data = TeacherData(seqs, [1, 1], torch.zeros(len(replies), 2), top)
    # top_k = 1: the reply tokens themselves
    assert ei.draft_vocabulary(data, 5 / 11, set(), 20).tolist() == [1]
    assert ei.draft_vocabulary(data, 8 / 11, set(), 20).tolist() == [1, 2]
    assert ei.draft_vocabulary(data, 0.8, {15}, 20).tolist() == [1, 2, 3, 15]  # ties: lower id
    assert ei.draft_vocabulary(data, 1.0, set(), 20).tolist() == [1, 2, 3, 4, 9]
    # top_k = 2 also counts the runners-up: 7 (6 times) comes before 1 (5 times)
    assert ei.draft_vocabulary(data, 6 / 22, set(), 20, top_k=2).tolist() == [7]
    assert ei.draft_vocabulary(data, 16 / 22, set(), 20, top_k=2).tolist() == [1, 7, 8]
    assert ei.draft_vocabulary(data, 19 / 22, set(), 20, top_k=2).tolist() == [1, 2, 7, 8]
    assert ei.coverage_of(torch.tensor([1, 2]), data) == pytest.approx(8 / 11)
    with pytest.raises(ValueError, match="--coverage"):
        ei.draft_vocabulary(data, 0.0, set(), 20)
    with pytest.raises(ValueError, match="--vocab-top-k 3"):
        ei.draft_vocabulary(data, 0.9, set(), 20, top_k=3)


def test_train_eagle3_builds_a_reproducible_lossless_head(tmp_path, capsys):
    target_dir = save_tiny(tmp_path / "target", n_layers=N_LAYERS)
    replies = tmp_path / "replies"
    assert cli.main(["replies", "--target", target_dir, "--out", str(replies), "--prompts", "14",
                     "--self-prompts", "2", "--sampled", "4", "--heldout", "3",
                     "--max-new-tokens", "8",
                     "--gen-batch", "8"]) == 0
    args = ["--target", target_dir, "--replies", str(replies), "--steps", "6",
            "--batch-size", "4", "--warmup", "2", "--eval-depth", "2", "--threads", "1"]
    assert cli.main(["train-eagle3", *args, "--out", str(tmp_path / "a")]) == 0
    assert cli.main(["train-eagle3", *args, "--out", str(tmp_path / "b")]) == 0
    a, b = (load_file(tmp_path / x / "model.safetensors") for x in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "midlayer.self_attn.q_proj.weight" in a
    # the target's table, frozen, as the head's own embedding (EAGLE's loader needs it)
    embedding = AutoModelForCausalLM.from_pretrained(target_dir).get_input_embeddings().weight
    assert torch.equal(a["embed_tokens.weight"], embedding.detach()[: len(a["t2d"])])
    report = json.loads((tmp_path / "a" / "train_eagle3_report.json").read_text())
    assert report["steps_done"] == 6 and report["feature_layers"] == list(LAYERS)
    assert 0 <= report["heldout_top1_agreement"] <= report["heldout_coverage"] + 1e-9
    chain = report["heldout_chain_acceptance_by_depth"]
    assert len(chain) == 2 and chain[1] <= chain[0]
    assert report["forward_cost"]["ratio"] > 0
    # the head is a draft like any other: every decoder reproduces greedy decoding
    target = HFModel(AutoModelForCausalLM.from_pretrained(target_dir), name="target")
    draft = load_eagle3(str(tmp_path / "a"), target)
    prompt = [5, 17, 42, 9]
    want = generate(target, None, prompt, DecodeConfig("ar", max_new_tokens=12)).tokens
    for name in ("draft_rank", "fts", "pearl"):
        got = generate(target, draft, prompt, DecodeConfig(name, budget=6, max_new_tokens=12))
        assert got.tokens == want, name
    # replies without features cannot train a head
    assert cli.main(["replies", "--target", target_dir, "--out", str(tmp_path / "nf"),
                     "--prompts", "4", "--self-prompts", "0", "--sampled", "0", "--heldout", "2",
                     "--max-new-tokens", "4",
                     "--no-features"]) == 0
    assert cli.main(["train-eagle3", "--target", target_dir, "--replies", str(tmp_path / "nf"),
                     "--out", str(tmp_path / "c")]) == 2
    assert "--no-features" in capsys.readouterr().err



def test_replies_written_by_a_copy_loaded_on_their_device_are_the_targets(tmp_path):
    """`targetrows replies --device`: the training replies and self prompts come from the target
    loaded onto that device in the replies' dtype, the held-out replies from the float32 target
    as loaded. Here, on the CPU in float32 (and the target unpacked, as the copy is), both ways
    write the same replies bit for bit; the copy is freed before the held-out replies. In
    bfloat16 the copy's weights are the cast target's (its rotary buffers stay float32, as
    every decoder loads a model)."""
    from targetrows.train.replies import (
        DeviceCopies,
        RepliesConfig,
        generate_replies,
        in_dtype,
        load_target,
    )

    target_dir = save_tiny(tmp_path / "target", n_layers=N_LAYERS)
    tokenizer, _ = load_target(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    config = RepliesConfig(prompts=6, self_prompts=2, sampled=3, heldout=2, max_new_tokens=6,
                           heldout_max_new_tokens=6, gen_batch=8, top_k=4, dtype="float32",
                           write_dtype="float32")
    plain = generate_replies(target, tokenizer, config)
    copies = DeviceCopies(target_dir, "cpu")
    moved = generate_replies(target, tokenizer, config, copies)
    assert moved[2]["device"] == "cpu" and "device" not in plain[2] and not copies.models
    assert moved[2]["self_prompt_examples"] == plain[2]["self_prompt_examples"]
    for got, want in zip(moved[:2], plain[:2], strict=True):
        assert got.sequences == want.sequences and got.prompt_lens == want.prompt_lens
        for name in ("hidden", "top", "features"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    cast = in_dtype(target, torch.bfloat16).state_dict()
    loaded = DeviceCopies(target_dir, "cpu").get(torch.bfloat16).state_dict()
    assert cast.keys() == loaded.keys() and all(torch.equal(cast[k], loaded[k]) for k in cast)
