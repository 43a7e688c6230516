"""What a bench run is set to run, and what the cost model expects of it:

- `BenchPrompt`, `BenchSettings`: the prompts, and the decoders, temperatures, budget and
  decode config every run starts from;
- `measure`: the part times, passes timed at the runs' shortest and longest mean contexts;
- `pick_budgets`: the budget and depth each tree decoder runs at (with --budget auto, the cost
  model's pick);
- `prompt_rows_seconds`: the longer first pass of decoders that read the target's rows at every
  prompt position;
- `with_cost_model`: each finished row beside its zero-overhead bound and the speed the cost
  model predicted for it before it ran.

They live apart from `run.py`, which runs the methods and writes one row per run, because more
than it reads them: the command line builds the settings before any model loads, and
`batched.py` plans its runs at batch size N with the same `measure` and `pick_budgets`. Nothing
here runs a method, so `run.py` imports from here and never the other way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from targetrows.core.checks import check_count, check_temperature
from targetrows.core.pool import PoolShape
from targetrows.cost.calibration import BudgetSearch, auto_budget
from targetrows.cost.parttimes import (
    draft_sizes_for,
    mean_context_len,
    measure_parts,
    target_sizes_for,
    time_prompt_pass,
    timing_context,
)
from targetrows.cost.rounds import DEFAULT_BUDGETS, bound, predicted_tokens_per_s
from targetrows.decoding.budget import NO_TREE, Auto, Budget, Fixed, Matched, parse_budget
from targetrows.decoding.config import DecodeConfig, condition_config
from targetrows.decoding.loop import new_state
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


# -- the cost model's side ---------------------------------------------------------------------


def pick_budgets(target, draft, prompts: Sequence[BenchPrompt], settings: BenchSettings, parts):
    """{(decoder, temperature): (budget, depth)} (ar: no budget) and the cost model's choice
    behind each tree decoder's plan (`auto_budget`, calibrated at three contexts 12 greedy
    tokens apart along the first prompt of each category: what a draft gets right differs from
    task to task, and a reply's first tokens are its easiest; benchmarks/calibration_spread.py
    compares placements): --budget auto runs its pick (`BudgetChoice.condition`: where no tree
    beats ar, (NO_TREE, NO_TREE), which runs as ar); a number runs at that budget and --depth,
    the choice then searching that one condition for the acceptance it predicts (each run's
    predicted speed, `_predicted`)."""
    first_of_each: dict[str, tuple[int, ...]] = {}
    for p in prompts:
        first_of_each.setdefault(p.category, p.ids)
    context_len = mean_context_len([len(p.ids) for p in prompts], settings.decode.max_new_tokens)
    plans, choices = {}, {}
    depth = settings.pool.depth
    fixed = isinstance(settings.budget, Fixed)
    for name in settings.decoders:
        for temp in settings.temperatures:
            if not get_decoder(name).drafts:
                plans[name, temp] = (None, depth)
                continue
            search = BudgetSearch(contexts=3 * len(first_of_each), gap=12)
            if fixed:
                search = replace(search, budgets=(settings.budget.nodes,), depths=(depth,))
            choice = auto_budget(target, draft, settings.run_config(name, temp, 1, depth, 0),
                                 list(first_of_each.values()), search, parts,
                                 context_len=context_len)
            choices[name, temp] = choice
            plans[name, temp] = (settings.budget.nodes, depth) if fixed else choice.condition()
    return plans, choices


def measure(target, draft, prompts: Sequence[BenchPrompt], settings: BenchSettings):
    """Part times at the shortest and the longest of the runs' mean contexts (a prompt's length
    plus half the new tokens: attention grows with the context, so one prompt's would misprice
    the others); `PartTimes.at` gives each prompt's own. At `settings.decode.batch_size` N:
    batched passes of N sequences (`measure_parts`)."""
    half = settings.decode.max_new_tokens // 2
    lengths = sorted(len(p.ids) + half for p in prompts)
    ids = [p.ids for p in prompts]
    candidates = (settings.budget.nodes,) if isinstance(settings.budget, Fixed) else DEFAULT_BUDGETS
    pool = settings.pool
    trees = any(get_decoder(d).drafts for d in settings.decoders)
    uses_draft = draft is not None and any(get_decoder(d).needs_draft for d in settings.decoders)
    sizes = target_sizes_for([min(b, pool.size) for b in candidates]) if trees else [1]
    widths = draft_sizes_for([pool.guesses, pool.top_k, pool.guesses * pool.top_k],
                             pool.depth + 2)
    longer = timing_context(ids, lengths[-1]) if lengths[-1] > lengths[0] else None
    return measure_parts(target, draft if uses_draft else None, timing_context(ids, lengths[0]),
                         sizes, widths, settings.repeats, longer, settings.decode.batch_size)


def prompt_rows_seconds(target, prompts: Sequence[BenchPrompt],
                        settings: BenchSettings) -> dict[str, list[float]]:
    """{decoder: each prompt's first pass beyond a one-token pass, seconds} for the decoders
    whose state reads the target's top-k rows at every prompt position first (RACER's): that
    pass (`time_prompt_pass` with `rows_k`), timed once per k."""
    out, by_k = {}, {}
    for name in settings.decoders:
        config = settings.run_config(name, settings.temperatures[0], 1, settings.pool.depth, 0)
        state = new_state(target, config)
        if getattr(state, "prompt_rows", False):
            k = state.table.k
            if k not in by_k:
                by_k[k] = [time_prompt_pass(target, p.ids, settings.repeats, k) for p in prompts]
            out[name] = by_k[k]
    return out


def with_cost_model(runs, parts, first_s: dict[str, list[float]], choices,
                    settings: BenchSettings) -> list[dict]:
    """The rows, each of our decoders' with the zero-overhead bound of its run
    (`targetrows.cost.rounds.bound`) and the share of it measured, and the speed the cost model
    predicted for it (`_predicted`) and the share of that measured. Part times are each
    prompt's own (`PartTimes.at` its mean context); `first_s[method][i]`: what prompt i's first
    pass costs that method beyond a one-token pass."""
    rows = []
    for row, result, i in runs:
        at = parts.at(row["prompt_tokens"] + row["new_tokens"] / 2)
        no_tree = row["budget"] == NO_TREE  # an auto pick of no tree: the run was ar's
        ran = "ar" if no_tree else row["method"]
        if result is not None and result.rounds:
            depth = row["depth"] or settings.pool.depth
            drafted = get_decoder(ran).pool_depth(depth, row["budget"] or depth)
            b = bound(ran, at, result.rounds, replace(settings.pool, depth=drafted),
                      first_s[ran][i], budget=row["budget"] or None)
            row.update(overlap=b.overlap, bound_tokens_per_s=b.tokens_per_s,
                       bound_speedup=b.speedup,
                       measured_over_bound=row["tokens_per_s"] / b.tokens_per_s)
        if row["method"] in settings.decoders and row["new_tokens"] > 0:
            choice = None if no_tree else choices.get((row["method"], row["temperature"]))
            predicted = _predicted(row, choice, at, first_s[ran][i], settings)
            row.update(predicted_tokens_per_s=predicted,
                       measured_over_predicted=row["tokens_per_s"] / predicted)
        rows.append(row)
    return rows


def _predicted(row, choice, parts, prompt_s: float, settings: BenchSettings) -> float:
    """The speed the cost model predicted for a run before it ran: the acceptance its choice
    predicted (ar: one token per target step), part times at the prompt's context, and the
    prompt's first pass, over the tokens the run wrote."""
    if choice is None:
        per_s = 1.0 / parts.target(1)
    else:
        committed, nodes = choice.picked()
        pool = replace(settings.pool, depth=choice.depth)
        per_s = float(predicted_tokens_per_s(row["method"], [committed], [nodes], parts,
                                             choice.overlap, pool, [choice.budget])[0])
    new = row["new_tokens"]
    return new / (prompt_s + new / per_s)
