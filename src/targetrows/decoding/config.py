"""What one decoding runs with: the decoder, its budget and temperature, and the pool it
drafts. Every default and every check of these values lives here (and in `PoolShape`); the
command line, `bench`, `decode` and the pipeline build their settings from this."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from targetrows.core.checks import check_budget, check_count, check_temperature
from targetrows.core.pool import PoolShape
from targetrows.core.rules.learned import Reranker
from targetrows.core.rules.sequoia_model import AcceptanceVector

from .budget import DEFAULT_BUDGET, NO_TREE
from .registry import Decoder, get_decoder


@dataclass(frozen=True)
class DecodeConfig:
    # the decoder's registry entry (a name is looked up once, here)
    decoder: Decoder | str = "fts"
    # non-root nodes per verified tree; None for a decoder that verifies no tree (ar), whatever
    # is given
    budget: int | None = DEFAULT_BUDGET
    temperature: float = 0.0
    max_new_tokens: int = 128
    pool: PoolShape = field(default_factory=PoolShape)  # the candidate pool drafted
    seed: int = 0
    stop_ids: frozenset[int] = frozenset()
    overlap: bool | None = None  # root pass alongside drafting; None: when on two devices
    # after t0, a tree without draft nodes is still verified for its bonus token (one more
    # one-token pass buys one more token, faster than leaving the row to the next round's root
    # pass: docs/measurements.md); False commits t0 alone
    verify_empty: bool = True
    # a learned rule's trained model: a `targetrows.core.rules.learned.Reranker`, or Sequoia's
    # `targetrows.core.rules.sequoia_model.AcceptanceVector`
    reranker: Reranker | AcceptanceVector | None = None
    # the draft-free decoders (racer, recycle): the target's top-k ids kept per token (RACER's
    # and Token Recycling's 8), and whether what they learned carries over from one prompt to
    # the next of a caller that keeps their state (both published codes do; off, each prompt's
    # trees depend on that prompt alone, so a resumed or reordered run measures the same)
    recycle_k: int = 8
    keep_across_prompts: bool = False
    # sequences decoded at once (`targetrows.decoding.batch`): each keeps its batch-1 tokens
    # (in reduced precision up to near-ties a batched pass rounds the other way), its times
    # are those of a sequence sharing its passes with batch_size - 1 others
    batch_size: int = 1

    def __post_init__(self):
        entry = self.decoder if isinstance(self.decoder, Decoder) else get_decoder(self.decoder)
        object.__setattr__(self, "decoder", entry)  # an unknown name raised, naming the known
        if not entry.drafts:
            object.__setattr__(self, "budget", None)
        elif self.budget is None:
            raise ValueError(f"decoder {entry.name!r} verifies a tree: give it a budget")
        else:
            object.__setattr__(self, "budget", check_budget(self.budget))
        check_temperature(self.temperature)
        check_count(self.max_new_tokens, "max_new_tokens")
        if not isinstance(self.pool, PoolShape):
            raise ValueError(f"pool must be a PoolShape, got {self.pool!r}")
        check_count(self.recycle_k, "recycle_k")
        check_count(self.batch_size, "batch_size")
        if not isinstance(self.keep_across_prompts, bool):
            raise ValueError(f"keep_across_prompts must be True or False, got "
                             f"{self.keep_across_prompts!r}")
        if entry.learned and self.reranker is None:
            raise ValueError(f"decoder {entry.name!r} scores with a trained model: give one "
                             "(--reranker FILE, from targetrows train-reranker)")
        if entry.learned and self.reranker.rule != entry.rule:
            raise ValueError(f"decoder {entry.name!r} runs rule {entry.rule!r}, but the "
                             f"reranker was trained for {self.reranker.rule!r}")

    def for_decoder(self, decoder: str | Decoder, rerankers=None) -> DecodeConfig:
        """This config for `decoder`, with the reranker of its rule from `rerankers` (a mapping
        rule -> Reranker) when it is a learned one; a tree decoder coming from ar's config
        takes the default budget."""
        entry = decoder if isinstance(decoder, Decoder) else get_decoder(decoder)
        reranker = (rerankers or {}).get(entry.rule) if entry.learned else None
        budget = self.budget if self.budget is not None else DEFAULT_BUDGET
        return replace(self, decoder=entry, budget=budget, reranker=reranker)

    @property
    def name(self) -> str:
        """The decoder's name (what answers, tables and messages say)."""
        return self.decoder.name

    @property
    def pool_depth(self) -> int:
        """Pool levels the round loop drafts (`Decoder.pool_depth`)."""
        return self.decoder.pool_depth(self.pool.depth, self.budget)

    @property
    def pool_budget(self) -> int | None:
        """The tree size a round's root pool is pruned to (`Decoder.prunes_pool`), or None."""
        return self.budget if self.decoder.prunes_pool else None


def condition_config(config: DecodeConfig, budget: int | None, depth: int) -> DecodeConfig:
    """`config` at one condition: a tree decoder at `budget` non-root nodes on a pool of `depth`
    levels (0: the pool's own); at NO_TREE (`auto` found no tree faster than ar's one pass per
    token, `BudgetChoice.condition`) ar's config, which drafts nothing. A decoder without a
    tree (ar) keeps its config."""
    if not config.decoder.drafts:
        return config
    if budget == NO_TREE:
        return config.for_decoder("ar")
    config = replace(config, budget=budget)
    return replace(config, pool=replace(config.pool, depth=depth)) if depth else config
