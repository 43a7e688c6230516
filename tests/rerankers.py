"""Models of the learned rules made by hand for tests (no training), so that every registered
decoder runs: rerankers whose weights mix every feature, so each one's code path is exercised,
and an acceptance vector for Sequoia that rises at rank 3, so its shapes differ from a top-B
by positional value."""

import numpy as np

from targetrows.core.rules.learned import ALL_FEATURES, STALE_FEATURES, Reranker
from targetrows.core.rules.sequoia_model import AcceptanceVector
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.registry import get_decoder


def reranker(rule: str, seed: int = 0) -> Reranker:
    features = ALL_FEATURES if rule == "learned_rerank" else STALE_FEATURES
    rng = np.random.default_rng(seed)
    weights = rng.normal(0.0, 0.3, len(features))
    weights[features.index("draft_logp")] += 1.0
    return Reranker(rule, features, tuple(float(w) for w in weights))


RERANKERS = {rule: reranker(rule) for rule in ("learned_rerank", "learned_stale_rerank")}
RERANKERS["sequoia"] = AcceptanceVector("sequoia", (0.55, 0.15, 0.2, 0.05))


def decode_config(decoder: str, **fields) -> DecodeConfig:
    """A `DecodeConfig` for any decoder, a learned one with its rule's test reranker."""
    entry = get_decoder(decoder)
    return DecodeConfig(entry, reranker=RERANKERS.get(entry.rule) if entry.learned else None,
                        **fields)
