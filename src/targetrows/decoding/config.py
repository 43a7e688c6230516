"""What one decoding runs with: the decoder, its budget and temperature, and the pool it
drafts. Every default and every check of these values lives here (and in `PoolShape`); the
command line, `bench`, `decode` and the pipeline build their settings from this."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from targetrows.core.checks import check_budget, check_count, check_temperature
from targetrows.core.pool import PoolShape
from targetrows.core.rules.learned import Reranker

from .registry import get_decoder, get_rule


@dataclass(frozen=True)
class DecodeConfig:
    decoder: str = "fts"
    budget: int = 59  # non-root nodes per verified tree
    temperature: float = 0.0
    max_new_tokens: int = 128
    pool: PoolShape = field(default_factory=PoolShape)  # the candidate pool drafted
    seed: int = 0
    stop_ids: frozenset[int] = frozenset()
    overlap: bool | None = None  # root pass alongside drafting; None: when on two devices
    # after t0, a tree without draft nodes is still verified for its bonus token (one more
    # one-token pass buys one more token: measured faster than leaving the row to the next
    # round's root pass); False commits t0 alone
    verify_empty: bool = True
    # a learned rule's trained model (`targetrows.core.rules.learned.Reranker`)
    reranker: Reranker | None = None

    def __post_init__(self):
        entry = get_decoder(self.decoder)  # an unknown name raises, naming the known ones
        check_budget(self.budget)
        check_temperature(self.temperature)
        check_count(self.max_new_tokens, "max_new_tokens")
        if not isinstance(self.pool, PoolShape):
            raise ValueError(f"pool must be a PoolShape, got {self.pool!r}")
        learned = entry.drafts and get_rule(entry.rule).learned
        if learned and self.reranker is None:
            raise ValueError(f"decoder {self.decoder!r} scores with a trained reranker: give one "
                             "(--reranker FILE, from targetrows train-reranker)")
        if learned and self.reranker.rule != entry.rule:
            raise ValueError(f"decoder {self.decoder!r} runs rule {entry.rule!r}, but the "
                             f"reranker was trained for {self.reranker.rule!r}")

    def for_decoder(self, decoder: str, rerankers=None) -> DecodeConfig:
        """This config for `decoder`, with the reranker of its rule from `rerankers` (a
        mapping rule -> Reranker) when it is a learned one."""
        entry = get_decoder(decoder)
        reranker = (rerankers or {}).get(entry.rule) if entry.learned else None
        return replace(self, decoder=decoder, reranker=reranker)

    @property
    def pool_depth(self) -> int:
        """Pool levels the round loop drafts (`Decoder.pool_depth`)."""
        return get_decoder(self.decoder).pool_depth(self.pool.depth, self.budget)

    @property
    def pool_budget(self) -> int | None:
        """The tree size a round's root pool is pruned to (`Decoder.prunes_pool`), or None."""
        return self.budget if get_decoder(self.decoder).prunes_pool else None
