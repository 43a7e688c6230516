"""Self-written training prompts: the template prefix, the batched sampler against a one-row
reference, and the replies that use them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import reference_logits, tiny_model, tiny_tokenizer

from targetrows.specbench.chat import encode_prompt
from targetrows.train.replies import RepliesConfig, generate_replies
from targetrows.train.self_prompts import (
    sample_rows,
    sample_turns,
    self_prompts,
    user_turn_prefix,
)

STOP = set(range(0, 259, 19))  # stop tokens enough for about half the turns to end in 12 tokens


def test_the_prefix_is_what_a_prompt_starts_with():
    tok = tiny_tokenizer()
    prefix = user_turn_prefix(tok)
    for text in ["hello", "What is 2 + 2?", "<|im_end|> odd"]:
        ids = encode_prompt(tok, text)
        assert ids[: len(prefix)] == prefix and len(ids) > len(prefix)
    tok.chat_template = None
    with pytest.raises(ValueError, match="need a chat template.*--self-prompts 0"):
        user_turn_prefix(tok)


def test_sample_rows_draws_each_rows_distribution():
    """Frequencies over many draws match each row's probabilities (a chi-square bound far in
    the tail), and a token of probability zero, wherever it sits, is never drawn."""
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0],
                          [0.0, 0.1, 0.0, 0.0, 0.9],
                          [0.0, 0.0, 0.0, 0.0, 1.0],
                          [0.25, 0.25, 0.25, 0.25, 0.0]])
    n, gen = 40_000, torch.Generator().manual_seed(0)
    draws = torch.stack([sample_rows(probs, gen) for _ in range(n)])  # [n, rows]
    for row in range(len(probs)):
        counts = torch.bincount(draws[:, row], minlength=probs.shape[1]).double()
        assert counts[probs[row] == 0].sum() == 0
        p = probs[row][probs[row] > 0].double()
        seen = counts[probs[row] > 0]
        chi2 = ((seen - n * p) ** 2 / (n * p)).sum().item()
        assert chi2 < 25.0, (row, chi2)  # 3 degrees of freedom at most: p < 1e-4 to fail
    again = torch.stack([sample_rows(probs, torch.Generator().manual_seed(0)) for _ in range(2)])
    assert torch.equal(again[0], draws[0]) and torch.equal(again[1], again[0])


def test_batched_sampling_draws_what_one_row_at_a_time_draws():
    """The batch (one KV cache, rows leaving as they end) samples each row from its own
    distribution: replaying the same generator over full uncached forwards gives the same
    tokens."""
    model = tiny_model(n_layers=2, dtype=torch.float64)
    prefix = user_turn_prefix(tiny_tokenizer())
    n, max_tokens = 8, 12
    got = sample_turns(model, prefix, n, max_tokens, STOP, torch.Generator().manual_seed(4))

    gen = torch.Generator().manual_seed(4)
    seqs, alive, ended = [[] for _ in range(n)], list(range(n)), set()
    for _ in range(max_tokens):
        logits = torch.stack([reference_logits(model, prefix + seqs[r])[-1] for r in alive])
        nxt = sample_rows(torch.softmax(logits.float(), -1), gen)
        for r, t in zip(alive, nxt.tolist(), strict=True):
            (ended.add(r) if t in STOP else seqs[r].append(t))
        alive = [r for r in alive if r not in ended]
        if not alive:
            break
    want = [seqs[r] if r in ended else None for r in range(n)]
    assert got == want
    assert any(w is None for w in want) and sum(w is not None for w in want) >= 2


def test_self_prompts_are_distinct_new_and_seeded():
    model, tok = tiny_model(n_layers=2), tiny_tokenizer()
    first = self_prompts(model, tok, 5, seed=1, stop=STOP, max_tokens=12, batch=4)
    assert len(first) == len(set(first)) == 5 and all(first)
    assert self_prompts(model, tok, 5, seed=1, stop=STOP, max_tokens=12, batch=4) == first
    assert self_prompts(model, tok, 5, seed=2, stop=STOP, max_tokens=12, batch=4) != first
    rest = self_prompts(model, tok, 3, seed=1, stop=STOP, max_tokens=12, batch=4,
                        exclude=set(first[:2]))
    assert not set(rest) & set(first[:2])
    with pytest.raises(ValueError, match="lower --self-prompts"):
        self_prompts(model, tok, 5, seed=1, stop=set(), max_tokens=3, batch=4)  # never ends


def test_replies_answer_template_and_self_written_prompts():
    model, tok = tiny_model(n_layers=2), tiny_tokenizer()
    config = RepliesConfig(prompts=3, self_prompts=2, sampled=3, heldout=2, max_new_tokens=4,
                           gen_batch=8, top_k=4, features=False)
    train, held, summary = generate_replies(model, tok, config)
    # five greedy replies, then three sampled ones to prompts spread over them (0, 1 and 3)
    assert len(train.sequences) == 8 and len(held.sequences) == 2
    from targetrows.specbench.chat import encode_prompt
    from targetrows.train.chat_prompts import training_prompts

    asked = [encode_prompt(tok, p) for p in training_prompts(3, 0) + summary["self_prompt_examples"]]
    for sampled, i in zip(train.sequences[5:], [0, 1, 3], strict=True):
        assert sampled[: len(asked[i])] == asked[i] == train.sequences[i][: len(asked[i])]
    written = summary["self_prompt_examples"]
    assert len(written) == 2
    texts = [tok.decode(s) for s in train.sequences]
    assert all(any(w in t for t in texts) for w in written)
    # the training data is labelled from the chat header on, the held-out data from the reply on
    assert len(set(train.prompt_lens)) == 1 and held.prompt_lens[0] > train.prompt_lens[0]
