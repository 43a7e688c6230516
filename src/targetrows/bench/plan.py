"""What a bench run is set to run: its prompts (`BenchPrompt`) and its settings (`BenchSettings`:
the decoders, temperatures, budget and the decode config every run starts from).

They live apart from `run.py` because more than the batch-1 run reads them: the command line
builds them before any model loads, and `batched.py` runs the same settings N sequences at a
time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from targetrows.core.checks import check_count, check_temperature
from targetrows.core.pool import PoolShape
from targetrows.decoding.budget import Auto, Budget, Matched, parse_budget
from targetrows.decoding.config import DecodeConfig, condition_config
from targetrows.decoding.registry import decoder_names, get_decoder


@dataclass(frozen=True)
class BenchPrompt:
    question_id: str
    category: str
    ids: tuple[int, ...]


@dataclass(frozen=True)
class BenchSettings:
    """A bench run: the methods, temperatures and budget, on top of `decode` (new tokens, pool,
    seed and stop tokens of every decoder's runs; its decoder, budget and temperature are each
    run's own)."""

    decode: DecodeConfig = DecodeConfig(max_new_tokens=64)
    decoders: tuple[str, ...] = decoder_names(learned=False)
    rerankers: Mapping = field(default_factory=dict)  # rule -> Reranker, for learned decoders
    temperatures: tuple[float, ...] = (0.0,)
    budget: Budget = Auto()  # every tree decoder's (a number is read as Fixed)
    hf: bool = True  # run the Hugging Face baselines
    repeats: int = 5  # timings per pass size for the cost model (interleaved, median)
    # candidates per round of hf_prompt_lookup: 10 is the default of transformers' own
    # PromptLookupCandidateGenerator (num_output_tokens), from the prompt lookup decoding
    # repository it cites; a wrong guess costs only a wider target pass, and long copies are
    # where lookup pays off
    prompt_lookup_tokens: int = 10

    def __post_init__(self):
        if not self.temperatures:
            raise ValueError("temperatures: give at least one")
        for t in self.temperatures:
            check_temperature(t, "--temperature")
        budget = parse_budget(self.budget, "--budget")
        if isinstance(budget, Matched):
            raise ValueError("--budget: bench takes a number or auto, not a matched cap")
        object.__setattr__(self, "budget", budget)
        check_count(self.prompt_lookup_tokens, "--prompt-lookup-tokens")
        for name in self.decoders:
            get_decoder(name)  # an unknown name raises, naming the known ones

    @property
    def pool(self) -> PoolShape:
        return self.decode.pool

    def at_batch_size(self, n: int) -> BenchSettings:
        """These settings decoding `n` sequences at once (`decode.batch_size`, what
        `targetrows.bench.batched` runs at)."""
        return replace(self, decode=replace(self.decode, batch_size=n))

    def run_config(self, method: str, temperature: float, budget: int | None, depth: int,
                   seed: int, max_new_tokens: int | None = None) -> DecodeConfig:
        """One of our decoders' runs: `decode` with its own decoder, temperature and seed, at
        (budget, pool depth) (`condition_config`: ar's budget is None; a tree decoder at
        NO_TREE, an `auto` pick of no tree, runs with ar's config)."""
        config = replace(self.decode.for_decoder(method, self.rerankers),
                         temperature=temperature, seed=seed,
                         max_new_tokens=max_new_tokens or self.decode.max_new_tokens)
        return condition_config(config, budget, depth)
