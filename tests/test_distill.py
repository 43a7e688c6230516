"""distill on tiny random-weight models: the cut, the teacher data, the loss, the whole command."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from needs import held_below_cpu
from safetensors.torch import load_file
from tiny_models import reference_logits, save_tiny, tiny_model, tiny_tokenizer

from targetrows import cli
from targetrows.specbench.chat import encode_prompt
from targetrows.train import chat_prompts, distill
from targetrows.train.replies import (
    RepliesConfig,
    generate_replies,
    shared_prefix,
    teacher_data,
)
from targetrows.train.reply_generation import generate_batch

SMALL = dict(steps=12, batch_size=4, warmup=2, n_random=64, compile=False)
DATA = RepliesConfig(prompts=24, self_prompts=0, sampled=0, heldout=4, max_new_tokens=8,
                     heldout_max_new_tokens=8, gen_batch=8, top_k=8, features=False)


@pytest.mark.parametrize("tied", [False, True])
def test_the_draft_is_the_targets_first_layers(tied):
    target = tiny_model(n_layers=4, tie_word_embeddings=tied)
    draft = distill.make_draft(target, 2)
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4
    ids = torch.tensor([[5, 17, 99, 3, 42, 7]])
    with torch.no_grad():
        states = target(input_ids=ids, output_hidden_states=True).hidden_states
        want = target.model.norm(states[2])  # after layer 1, through the final norm
        got = draft.model(input_ids=ids).last_hidden_state
    assert torch.allclose(got, want, atol=1e-5)
    assert not draft.get_input_embeddings().weight.requires_grad
    assert not draft.get_output_embeddings().weight.requires_grad
    trainable = {n for n, p in draft.named_parameters() if p.requires_grad}
    assert "model.norm.weight" in trainable and any(".layers.1." in n for n in trainable)
    assert (draft.get_output_embeddings().weight is draft.get_input_embeddings().weight) == tied
    with pytest.raises(ValueError, match="--layers 4"):
        distill.make_draft(target, 4)


def test_batched_replies_are_each_prompts_own_greedy_reply():
    target = tiny_model(n_layers=2)
    tok = tiny_tokenizer()
    prompts = [encode_prompt(tok, p) for p in ["hi", "a much longer prompt here", "mid size"]]
    out = generate_batch(target, prompts, 10, stop=set(), top_k=5)
    for prompt, (reply, hidden, top, _) in zip(prompts, out, strict=True):
        seq = prompt + reply.tolist()
        logits = reference_logits(target, seq)[len(prompt) - 1 : -1]
        assert len(reply) == 10
        assert torch.equal(logits.argmax(-1), reply)  # greedy, unaffected by left padding
        assert torch.equal(top[:, 0].long(), reply)
        head = target.get_output_embeddings().weight
        assert torch.allclose(hidden.float() @ head.T, logits, atol=0.05)  # fp16 hidden state
    # a stop token ends a reply (kept as its last token) and the others go on
    first = out[0][0].tolist()
    stop = first[3]
    again = generate_batch(target, prompts, 10, stop={stop}, top_k=5)
    assert again[0][0].tolist() == first[: first.index(stop) + 1]
    for (old, *_), (new, *_) in zip(out[1:], again[1:], strict=True):
        cut = old.tolist().index(stop) + 1 if stop in old.tolist() else 10
        assert new.tolist() == old.tolist()[:cut]



def test_learning_prompts_labels_their_text_after_the_shared_header():
    target, tok = tiny_model(n_layers=2), tiny_tokenizer()
    texts = ["hi", "a much longer prompt here", "mid size"]
    prompts = [encode_prompt(tok, p) for p in texts]
    header = shared_prefix(prompts)
    assert 0 < header < min(len(p) for p in prompts)
    assert all(p[:header] == prompts[0][:header] for p in prompts)
    weight = target.get_output_embeddings().weight
    config = RepliesConfig(prompts=3, self_prompts=0, sampled=0, heldout=1, max_new_tokens=5,
                           gen_batch=2,
                           top_k=4, features=False)
    plain = teacher_data(target, prompts, config, set(), "replies")
    data = teacher_data(target, prompts, config, set(), "replies", learn_prompts=True)
    assert data.sequences == plain.sequences  # the same replies, more of them labelled
    assert data.prompt_lens == [header] * 3
    assert len(data.hidden) == sum(len(s) - header for s in data.sequences)
    start = 0
    for seq, p in zip(data.sequences, data.prompt_lens, strict=True):
        logits = reference_logits(target, seq)[p - 1 : -1]  # positions header - 1 .. len - 2
        rows = slice(start, start + len(seq) - p)
        assert torch.allclose(data.hidden[rows].float() @ weight.T, logits, atol=0.05)
        assert torch.equal(data.top[rows, 0].long(), logits.argmax(-1))
        start += len(seq) - p
    # the reply rows are the plain data's, bit for bit
    ends = torch.tensor([len(s) - header for s in data.sequences]).cumsum(0).tolist()
    tail = torch.cat([data.hidden[end - (len(s) - len(q)) : end]
                      for s, q, end in zip(data.sequences, prompts, ends, strict=True)])
    assert torch.equal(tail, plain.hidden)

def test_bfloat16_training_replies_leave_the_target_and_the_heldout_replies_float32():
    target, tok = tiny_model(n_layers=2), tiny_tokenizer()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    config = RepliesConfig(prompts=6, self_prompts=0, sampled=0, heldout=3, max_new_tokens=6,
                           gen_batch=6,
                           top_k=4, features=False, dtype="float32")
    _, held32, s32 = generate_replies(target, tok, config)
    train16, held, s16 = generate_replies(target, tok, RepliesConfig(**{**config.__dict__,
                                                                        "dtype": "bfloat16"}))
    assert (s32["train_dtype"], s16["train_dtype"]) == ("float32", "bfloat16")
    # generated by a bfloat16 copy: the caller's target is untouched, bit for bit
    assert target.dtype == torch.float32
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    assert held.sequences == held32.sequences and torch.equal(held.hidden, held32.hidden)
    assert len(train16.sequences) == 6


def test_subset_kl_is_the_full_kl_when_the_subset_is_everything():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 8, generator=gen)
    h_t, h_s = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    top = (h_t @ weight.T).topk(5).indices
    everything = torch.arange(50)  # every top token is also "random": each must count once
    got = distill.subset_kl(h_s, h_t, weight, top, everything)
    log_t, log_s = (h_t @ weight.T).log_softmax(-1), (h_s @ weight.T).log_softmax(-1)
    want = (log_t.exp() * (log_t - log_s)).sum(-1).mean()
    assert torch.allclose(got, want, atol=1e-5)
    assert distill.subset_kl(h_t, h_t, weight, top, torch.tensor([1, 7, 30])) < 1e-6


def test_distill_builds_a_reproducible_draft(tmp_path, capsys):
    target = save_tiny(tmp_path / "target", n_layers=4)
    config = distill.DistillConfig(**SMALL)
    first = distill.distill(target, tmp_path / "models" / "draft", config, data=DATA)
    weights = load_file(tmp_path / "models" / "draft" / "model.safetensors")
    assert {p.name for p in (tmp_path / "models").iterdir()} == {"draft"}  # no temp folders

    from transformers import AutoModelForCausalLM, AutoTokenizer

    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "models" / "draft")
    assert draft.config.num_hidden_layers == 2
    assert len(AutoTokenizer.from_pretrained(tmp_path / "models" / "draft")) == len(
        tiny_tokenizer())
    report = json.loads((tmp_path / "models" / "draft" / "distill_report.json").read_text())
    assert report["heldout_top1_agreement"] == first["heldout_top1_agreement"]
    assert report["train_prompts"] == 24 and report["heldout_positions"] == 4 * 8
    assert report["steps_done"] == 12 and report["loss_last"] < report["loss_first"]
    assert 0 < report["forward_cost"]["decode_step_ratio"]

    # same seed, same draft; the CLI refuses to overwrite without --force
    argv = ["distill", "--target", target, "--out", str(tmp_path / "models" / "draft")]
    for key, value in SMALL.items():
        if key != "compile":
            argv += [f"--{key.replace('_', '-')}", str(value)]
    argv.append("--no-compile")
    assert cli.main(argv) == 2
    assert "already exists" in capsys.readouterr().err
    data_args = ["--prompts", "24", "--self-prompts", "0", "--sampled", "0", "--heldout", "4",
                 "--max-new-tokens",
                 "8", "--heldout-max-new-tokens", "8", "--gen-batch", "8", "--top-k", "8"]
    assert cli.main([*argv, *data_args, "--force"]) == 0
    again = load_file(tmp_path / "models" / "draft" / "model.safetensors")
    assert weights.keys() == again.keys()
    assert all(torch.equal(weights[k], again[k]) for k in weights)
    # the same draft from a replies folder (what the pipeline does: one replies job, two trainings)
    assert cli.main(["replies", "--target", target, "--out", str(tmp_path / "replies"),
                     *data_args]) == 0
    assert cli.main([*argv, "--replies", str(tmp_path / "replies"), "--force"]) == 0
    from_folder = load_file(tmp_path / "models" / "draft" / "model.safetensors")
    assert all(torch.equal(weights[k], from_folder[k]) for k in weights)


def test_training_moves_the_draft_towards_the_target(tmp_path):
    target = tiny_model(n_layers=4)
    tok = tiny_tokenizer()
    prompts = [encode_prompt(tok, p) for p in chat_prompts.training_prompts(16)]
    config = distill.DistillConfig(**{**SMALL, "steps": 30, "lr": 5e-3})
    data = teacher_data(target, prompts, DATA, stop=set(), desc="test")
    draft = distill.make_draft(target, 1)
    before, n = distill.top1_agreement(draft, data)
    losses = distill.fit_draft(draft, data, config, vocab=len(tok))
    after, _ = distill.top1_agreement(draft, data)
    assert n == 16 * 8 and len(losses) == 30
    assert sum(losses[-5:]) < sum(losses[:5]) and after > before


def test_prompt_sets_are_distinct_and_disjoint():
    train = chat_prompts.training_prompts(5000, seed=3)
    assert len(set(train)) == 5000
    assert chat_prompts.training_prompts(100, seed=3) == train[:100]
    assert not set(chat_prompts.HELDOUT_PROMPTS) & chat_prompts.all_training_prompts(seed=3)
    assert len(set(chat_prompts.HELDOUT_PROMPTS)) == len(chat_prompts.HELDOUT_PROMPTS)
    with pytest.raises(ValueError, match="lower --prompts"):
        chat_prompts.training_prompts(10**6)


@pytest.mark.slow
@pytest.mark.skipif(held_below_cpu(), reason="ATEN_CPU_CAPABILITY holds ATen below this CPU, "
                    "and torch.compile's generated kernels then train to NaN here; a CPU that "
                    "has AVX2 only runs this test")
def test_compiled_training_matches_eager(tmp_path):
    target = tiny_model(n_layers=3)
    tok = tiny_tokenizer()
    prompts = [encode_prompt(tok, p) for p in chat_prompts.training_prompts(8)]
    config = distill.DistillConfig(**{**SMALL, "steps": 4})
    data = teacher_data(target, prompts, DATA, stop=set(), desc="test")
    eager = distill.fit_draft(distill.make_draft(target, 2), data, config, vocab=len(tok))
    compiled = distill.fit_draft(distill.make_draft(target, 2), data,
                             distill.DistillConfig(**{**SMALL, "steps": 4, "compile": True}),
                             vocab=len(tok))
    assert compiled == pytest.approx(eager, rel=1e-3)
