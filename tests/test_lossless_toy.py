"""Every decoder is lossless on the toy pair: the round loop of `targetrows.decoding.loop` is the same one
real models run, so this checks the algorithm itself (trees, rules, verification, commits)."""

import itertools

import numpy as np
import pytest
from rerankers import decode_config
from scipy import stats

from targetrows.core.pool import PoolShape
from targetrows.core.toy import ToyPair
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names

DECODERS = decoder_names()

PROMPT = [1, 2]
VOCAB = 6
SAMPLES = 20_000


def exact_first_three(pair):
    """The target's own distribution of its first 3 sampled tokens, from its rows."""
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=3):
        p = 1.0
        for i, tok in enumerate(seq):
            p *= pair.target_row(PROMPT + list(seq[:i]))[tok]
        probs[seq] = p
    return probs


@pytest.mark.slow
@pytest.mark.parametrize("decoder", DECODERS)
def test_sampling_matches_the_target(decoder):
    pair = ToyPair(VOCAB, seed=3, closeness=0.7, scale=1.5)
    config = dict(decoder=decoder, budget=5, temperature=1.0, max_new_tokens=3,
                  pool=PoolShape(top_k=3, depth=3))
    counts = {}
    for seed in range(SAMPLES):
        out = generate(pair.target, pair.draft, PROMPT, decode_config(**config, seed=seed)).tokens
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    probs = exact_first_three(pair)
    # chi-square over cells, pooling those expected below 5 into one
    seqs = sorted(probs, key=probs.get, reverse=True)
    expected = np.array([probs[s] * SAMPLES for s in seqs])
    observed = np.array([counts.get(s, 0) for s in seqs])
    big = expected >= 5
    exp = np.append(expected[big], expected[~big].sum())
    obs = np.append(observed[big], observed[~big].sum())
    p_value = stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
    assert sum(counts.values()) == SAMPLES
    assert p_value > 0.001, f"{decoder}: chi-square p = {p_value:.2g}"


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("budget", [1, 8, 59])
def test_greedy_equals_target_greedy(decoder, budget):
    pair = ToyPair(32, seed=5, closeness=0.8)
    context = [3, 1, 4, 1, 5]
    greedy = []
    for _ in range(40):  # the target alone, argmax by argmax
        tok = int(np.argmax(pair.target_row(context + greedy)))
        greedy.append(tok)
    cfg = decode_config(decoder, budget=budget, max_new_tokens=40, pool=PoolShape(top_k=4, depth=4))
    result = generate(pair.target, pair.draft, context, cfg)
    assert result.tokens == greedy
    assert sum(r.committed for r in result.rounds) == 40
    if decoder != "ar":
        assert max(r.nodes for r in result.rounds) <= budget


def test_stop_tokens_end_decoding_exactly():
    pair = ToyPair(16, seed=0, closeness=0.9)
    free = generate(pair.target, pair.draft, [1, 2, 3], DecodeConfig("ar", max_new_tokens=30)).tokens
    stop = free[7]
    first = free.index(stop)
    for decoder in DECODERS:
        cfg = decode_config(decoder, budget=16, max_new_tokens=30,
                           stop_ids=frozenset({stop}), pool=PoolShape(top_k=4, depth=4))
        result = generate(pair.target, pair.draft, [1, 2, 3], cfg)
        assert result.tokens == free[: first + 1], decoder
        assert result.stop_reason == "stop"


@pytest.mark.parametrize("max_new", [1, 2, 5, 17])
def test_max_new_tokens_is_exact(max_new):
    pair = ToyPair(16, seed=0, closeness=1.0)  # a perfect draft: rounds commit many tokens
    for decoder in DECODERS:
        cfg = decode_config(decoder, budget=20, max_new_tokens=max_new, pool=PoolShape(top_k=4, depth=5))
        assert len(generate(pair.target, pair.draft, [1], cfg).tokens) == max_new


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(budget=0), "budget"),
        (dict(temperature=-1.0), "temperature"),
        (dict(decoder="medusa"), "unknown decoder 'medusa'"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**kwargs)


def test_empty_prompt_and_missing_draft():
    pair = ToyPair(8)
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(pair.target, pair.draft, [], DecodeConfig("ar"))
    with pytest.raises(ValueError, match="needs a draft"):
        generate(pair.target, None, [1], DecodeConfig("fts"))


def test_drafting_stops_at_the_budgets_depth():
    """A tree of B nodes is at most B deep: with B < depth the round loop drafts B levels (B + 1
    for fts, whose tree hangs from a first-level node)."""
    pair = ToyPair(vocab_size=16, seed=1, closeness=0.8)
    for decoder, passes in (("draft_rank", {2}), ("rerank", {2}), ("pearl", {2}), ("fts", {3}),
                            ("fts_redraft", {3, 5})):  # guesses' level + 2, and 2 more on a miss
        config = decode_config(decoder, budget=2, max_new_tokens=30, pool=PoolShape(top_k=3, depth=5))
        result = generate(pair.target, pair.draft, [1, 2, 3], config)
        assert {r.draft_passes for r in result.rounds} <= passes, decoder
        assert max(r.nodes for r in result.rounds) <= 2
