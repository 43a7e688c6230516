"""Prompt lookup mixed into a draft: the n-gram index against brute force, the mix against the
full mixed distribution, and every decoder lossless with the mixed draft (the toy pair, and an
EAGLE-3 head whose guesses fall outside its draft vocabulary)."""

import itertools

import numpy as np
import pytest
from rerankers import decode_config

from targetrows.core.lookup import LookupDraft, NgramIndex, mix_guess
from targetrows.core.pool import PoolShape
from targetrows.core.rows import log_softmax
from targetrows.core.toy import ToyPair
from targetrows.core.tree import Tree
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import decoder_names

DECODERS = decoder_names()


def brute_force_guess(seq, max_ngram):
    """What followed the last n tokens of seq at their earliest earlier occurrence, for the
    longest n that has one (n <= max_ngram), as (token, n)."""
    j = len(seq)
    for n in range(min(max_ngram, j), 0, -1):
        tail = seq[j - n:]
        for i in range(j - n):
            if seq[i:i + n] == tail:
                return seq[i + n], n
    return None


@pytest.mark.parametrize("max_ngram", [1, 2, 3])
def test_the_index_guesses_as_brute_force_at_every_length(max_ngram):
    rng = np.random.default_rng(max_ngram)
    for _ in range(5):
        seq = rng.integers(0, 4, size=80).tolist()
        index = NgramIndex(max_ngram)
        for j in range(1, len(seq) + 1):
            index.extend(seq[:j])  # grows one token at a time, as a decode commits
            assert index.guess(seq[:j]) == brute_force_guess(seq[:j], max_ngram), (seq[:j])


def test_the_index_guesses_for_a_tail_that_runs_past_it_and_starts_over_on_a_new_sequence():
    index = NgramIndex(2)
    index.extend([1, 2, 3, 9, 2, 3, 4])
    assert index.guess([7, 2, 3]) == (9, 2)  # (2, 3) first seen at 1: then 9
    assert index.guess([7, 8, 4]) is None  # 4 ends the sequence: nothing after it yet
    assert index.guess([7, 8, 3]) == (9, 1)
    index.extend([5, 6, 7])  # a new sequence
    assert index.guess([6]) == (7, 1)
    assert index.guess([2, 3]) is None
    index.extend([5, 8, 7, 1, 2])  # another, longer one
    assert index.guess([6]) is None
    assert index.guess([9, 7]) == (1, 1)


@pytest.mark.parametrize("weight", [0.05, 0.3, 0.9])
@pytest.mark.parametrize("k", [1, 4])
def test_the_mix_is_the_top_k_of_the_mixed_distribution(weight, k):
    """A guess inside q's top-k: exactly the top-k of (1 - w) q + w [guess]. Outside: the same
    with the guess's own q counted as 0 (it enters when w beats the k-th mixed probability)."""
    rng = np.random.default_rng(0)
    entered = outside = 0
    for _ in range(200):
        logp = log_softmax(rng.standard_normal(20) * 2)
        order = np.argsort(-logp, kind="stable")
        guess = int(rng.integers(20))
        tokens, lp = mix_guess(order[:k], logp[order[:k]], guess, weight)
        mixed = (1 - weight) * np.exp(logp)
        if guess not in order[:k]:
            mixed[guess] = 0.0  # what the top-k does not say
            outside += 1
            entered += guess in tokens
        mixed[guess] += weight
        best = np.argsort(-mixed, kind="stable")[:k]
        np.testing.assert_array_equal(np.sort(tokens), np.sort(best))
        np.testing.assert_allclose(lp, np.log(mixed[tokens]))
        assert np.all(np.diff(lp) <= 0)  # best first
    if weight > 0.5:  # above any (1 - w) q: every guess is proposed
        assert entered == outside > 0


def test_the_draft_proposes_the_guess_at_each_node_from_context_and_path():
    pair = ToyPair(16, seed=1, closeness=0.5)
    draft = LookupDraft(pair.draft, weights=(0.0, 0.95))  # two-token matches only
    context = [3, 4, 5, 9, 1, 3, 4]  # (3, 4) was followed by 5
    pool = Tree([4, 11, 5], [-1, 0, 1])  # root 4, then 11, then 5: (11, 5) never occurred
    tokens, logp = draft.topk_at(context, pool, [0, 1, 2], 3)
    plain, plain_logp = pair.draft.topk_at(context, pool, [0, 1, 2], 3)
    assert tokens[0, 0] == 5 and logp[0, 0] >= np.log(0.95)  # the root's tail is (3, 4)
    np.testing.assert_array_equal(tokens[1:], plain[1:])  # (4, 11) and (11, 5): no match
    np.testing.assert_array_equal(logp[1:], plain_logp[1:])
    assert draft.logits(context, pool, [1]).shape == (1, 16)  # rows stay the draft's own
    draft.reset(0)
    assert draft.index.tokens == []


@pytest.mark.parametrize("decoder", DECODERS[1:])
@pytest.mark.parametrize("budget", [1, 8])
def test_every_decoder_stays_greedy_with_prompt_lookup(decoder, budget):
    """A repetitive prompt, so guesses are proposed (and sometimes accepted) at every depth."""
    pair = ToyPair(8, seed=5, closeness=0.3)
    context = [3, 1, 4, 1, 5, 3, 1, 4, 1, 5, 3, 1]
    greedy = generate(pair.target, None, context, DecodeConfig("ar", max_new_tokens=40)).tokens
    cfg = decode_config(decoder, budget=budget, max_new_tokens=40, pool=PoolShape(top_k=3, depth=3))
    draft = LookupDraft(pair.draft)
    assert generate(pair.target, draft, context, cfg).tokens == greedy


def test_sampling_with_prompt_lookup_follows_the_target():
    """Temperature 1, the toy pair: the first three tokens of draft_rank and fts with the mixed
    draft follow the target's own distribution (a chi-square test over 4,000 seeds)."""
    from scipy import stats

    pair = ToyPair(4, seed=2, closeness=0.5, scale=1.5)
    prompt = [1, 2, 1, 2, 1]
    exact = {}
    for seq in itertools.product(range(4), repeat=3):
        exact[seq] = np.prod([pair.target_row(prompt + list(seq[:i]))[t]
                              for i, t in enumerate(seq)])
    seqs = sorted(exact, key=exact.get, reverse=True)
    samples = 4000
    for decoder in ("draft_rank", "fts"):
        counts = {}
        draft = LookupDraft(pair.draft, weights=(0.6, 0.9))
        for seed in range(samples):
            cfg = decode_config(decoder, budget=4, temperature=1.0, max_new_tokens=3, seed=seed,
                               pool=PoolShape(top_k=2, depth=2))
            out = tuple(generate(pair.target, draft, prompt, cfg).tokens)
            counts[out] = counts.get(out, 0) + 1
        expected = np.array([exact[s] * samples for s in seqs])
        observed = np.array([counts.get(s, 0) for s in seqs])
        big = expected >= 5
        obs = np.append(observed[big], observed[~big].sum())
        exp = np.append(expected[big], expected[~big].sum())
        assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 0.001, decoder


def test_weights_outside_zero_to_one_are_refused():
    pair = ToyPair(4)
    for weights in [(), (0.5, 1.0), (-0.1,)]:
        with pytest.raises(ValueError, match="lookup weights"):
            LookupDraft(pair.draft, weights)
