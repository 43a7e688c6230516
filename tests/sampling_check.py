"""The temperature-1 losslessness check shared by the Hugging Face and EAGLE-3 tests: each
decoder's first three tokens, over many seeds, follow the target's own distribution (a
chi-square test against the exact probabilities from the target's forward passes). The seeds
are decoded in batches (`BATCH` sequences a pass, each with its own seed): lossless at every
batch size, and about twice as fast as one at a time on these tiny models."""

import itertools

import numpy as np
import torch
from rerankers import decode_config

from targetrows.core.pool import PoolShape
from targetrows.decoding.batch import generate_batch

BATCH = 10


def assert_first_tokens_follow_the_target(target_hf, target, draft, decoders, prompt,
                                          vocab: int, samples: int) -> None:
    from scipy import stats

    with torch.no_grad():
        exact = {}
        for seq in itertools.product(range(vocab), repeat=3):
            logits = target_hf(torch.tensor([prompt + list(seq[:2])])).logits[0, -3:]
            probs = torch.softmax(logits, -1)
            exact[seq] = float(probs[0, seq[0]] * probs[1, seq[1]] * probs[2, seq[2]])
    seqs = sorted(exact, key=exact.get, reverse=True)
    expected = np.array([exact[s] * samples for s in seqs])
    big = expected >= 5  # the rare sequences are pooled into one cell
    for decoder in decoders:
        counts = {}
        configs = [decode_config(decoder, budget=4, temperature=1.0, max_new_tokens=3, seed=seed,
                                 pool=PoolShape(top_k=2, depth=2)) for seed in range(samples)]
        for result in generate_batch(target, draft, [prompt] * samples, configs, BATCH):
            out = tuple(result.tokens)
            counts[out] = counts.get(out, 0) + 1
        observed = np.array([counts.get(s, 0) for s in seqs])
        obs = np.append(observed[big], observed[~big].sum())
        exp = np.append(expected[big], expected[~big].sum())
        p = stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
        assert p > 0.001, f"{decoder}: chi-square p = {p:.2g}"
