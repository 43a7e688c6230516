"""`targetrows bench`: our decoders against Hugging Face generation, on one pair, prompt set and
machine, in one process.

    targetrows bench --target T --draft D --prompts config/prompts/mt_bench.jsonl --num-prompts 4
        [--assistant A] [--temperature 0 1] [--budget auto|59] [--max-new-tokens 64]
        [--prompt-lookup-tokens 10] [--out-dir benchmarks/results]

For each prompt (interleaved, so that machine drift hits every method alike; the order of the
methods rotates from prompt to prompt) and temperature it runs `generate()` of the target (greedy
at temperature 0, pure sampling otherwise), assisted generation
(`generate(assistant_model=A)`, A the --assistant or else a standalone draft; an EAGLE-3 head
cannot assist), prompt lookup decoding (`generate(prompt_lookup_num_tokens=N)`, no draft) and
each of our decoders. The tables report tokens/s (median over prompts, min-max), ratios to the
three Hugging Face baselines, acceptance, the time split per round and measured / bound from
`targetrows.cost.rounds`. Results: a tidy CSV (one row per prompt, temperature and method) and
a Markdown report, both written atomically. The settings, and the cost model's side of a run
(part times, budgets, predicted speeds), are `targetrows.bench.plan`'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from targetrows.bench.baselines import HF_METHODS, assistant_for, hf_generate
from targetrows.core.rows import greedy
from targetrows.cost.parttimes import mean_parts, time_prompt_pass
from targetrows.decoding.budget import NO_TREE
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate, new_state
from targetrows.decoding.model import synchronize
from targetrows.decoding.registry import get_decoder

from .drift import explain_parting
from .peer import PREFIX as PEER
from .plan import (
    BenchPrompt,
    BenchSettings,
    measure,
    pick_budgets,
    prompt_rows_seconds,
    with_cost_model,
)

if TYPE_CHECKING:
    from targetrows.hf.model import HFModel

PER_ROUND = (
    "committed",
    "accepted",
    "nodes",
    "target_passes",
    "draft_passes",
    "t_draft",
    "t_root",
    "t_drafting",
    "t_verify",
    "t_bookkeeping",
    "t_round",
)


# -- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchModels:
    target: HFModel
    draft: object | None  # any Model draft, or None
    assistant: object | None  # the assistant model hf_assisted runs with
    peers: Mapping = field(default_factory=dict)  # "peer:<name>" -> a running `peer.Peer`
    # (decoder, temperature) -> a draft-free decoder's state kept across prompts
    # (`DecodeConfig.keep_across_prompts`; the warm-up's rows too, as the published codes keep)
    states: dict = field(default_factory=dict)


def run_method(method: str, models: BenchModels, prompt: BenchPrompt, config: DecodeConfig,
               settings: BenchSettings):
    """(new tokens, wall seconds, DecodeResult or None) of one method on one prompt: one of our
    decoders run with `config`, a Hugging Face method or a peer engine at its temperature, new
    tokens and seed (a peer's seconds are its own generate call's)."""
    if method in models.peers:
        tokens, seconds, _ = models.peers[method].generate(
            prompt.ids, config.max_new_tokens, config.temperature, config.seed, config.stop_ids)
        return tokens, seconds, None
    start = time.perf_counter()
    if method in HF_METHODS:
        tokens = hf_generate(
            models.target.model,
            prompt.ids,
            config.temperature,
            config.max_new_tokens,
            config.stop_ids,
            config.seed,
            models.target.vocab_size,
            models.assistant if method == "hf_assisted" else None,
            settings.prompt_lookup_tokens if method == "hf_prompt_lookup" else None,
        )
        result = None
    else:
        draft = models.draft if config.decoder.needs_draft else None  # no tree: ar's config
        result = generate(models.target, draft, prompt.ids, config, _kept_state(models, config))
        tokens = result.tokens
    synchronize(models.target)
    return tokens, time.perf_counter() - start, result


def _kept_state(models: BenchModels, config: DecodeConfig):
    """The state a draft-free decoder carries from prompt to prompt when its config keeps it
    (one per decoder and temperature), else None: a fresh one per prompt."""
    if not config.keep_across_prompts or config.decoder.new_state is None:
        return None
    key = (config.name, config.temperature)
    if key not in models.states:
        models.states[key] = new_state(models.target, config)
    return models.states[key]


def assisting_model(draft, assistant: HFModel | None) -> HFModel | None:
    """The standalone Hugging Face model that assisted generation runs with: `assistant`, else
    a standalone draft; None when the draft is an EAGLE-3 head (or absent) and no assistant is
    given, since transformers can only assist with a whole causal LM."""
    if assistant is not None:
        if getattr(assistant, "model", None) is None:
            raise ValueError(
                f"assistant {getattr(assistant, 'name', assistant)!r} is not a standalone Hugging "
                "Face model (an EAGLE-3 head?); --assistant needs a draft model folder with its "
                "own weights, such as a distilled draft"
            )
        return assistant
    draft = getattr(draft, "inner", draft)  # prompt lookup mixed in: HF assists with the model
    return draft if getattr(draft, "model", None) is not None else None


def run_bench(
    target,
    draft,
    prompts: Sequence[BenchPrompt],
    settings: BenchSettings,
    progress=None,
    assistant: HFModel | None = None,
    peers: Mapping | None = None,
) -> tuple[list[dict], dict]:
    """Every method on every prompt and temperature. `assistant`: the model hf_assisted runs
    with (default: the draft, when it is a standalone model); `peers`: running peer engines by
    method name ("peer:<name>", `targetrows.bench.peer`), interleaved like every other method.
    Returns (tidy rows, context) where the context holds the part times, the budgets, the auto
    choices and the methods skipped, with why, for the report."""
    if not prompts:
        raise ValueError("no prompts to benchmark")
    needing = [d for d in settings.decoders if get_decoder(d).needs_draft]
    if draft is None and needing:
        raise ValueError(f"{', '.join(needing)} need a draft model (--draft); ar and the "
                         "draft-free decoders run without one")
    methods, skipped, models = _methods(target, draft, settings, assistant, peers)
    parts = measure(target, draft, prompts, settings)
    # what each prompt's first pass costs beyond a round's one-token pass (in every bound); a
    # decoder that reads the target's rows at every prompt position first (RACER) pays more
    prompt_s = [time_prompt_pass(target, p.ids, settings.repeats) for p in prompts]
    prompt_rows_s = prompt_rows_seconds(target, prompts, settings)
    plans, choices = pick_budgets(target, draft, prompts, settings, parts)

    def config_for(method, temp, seed, max_new_tokens=None):
        name = method if method in settings.decoders else "ar"  # HF methods, peers
        budget, depth = plans.get((name, temp), (None, settings.pool.depth))
        return settings.run_config(name, temp, budget, depth, seed, max_new_tokens)

    for method in methods:  # warm-up: lazy initialisation is nobody's cost
        run_method(method, models, prompts[0],
                   config_for(method, settings.temperatures[0], settings.decode.seed, 4), settings)
    runs = _interleaved_runs(models, prompts, settings, methods, config_for, progress)
    # part times before and after the runs, averaged: drift of a shared machine shows in both
    parts = mean_parts(parts, measure(target, draft, prompts, settings))
    first_s = {m: prompt_rows_s.get(m, prompt_s) for m in [*methods, "ar"]}
    rows = with_cost_model(runs, parts, first_s, choices, settings)
    context = {"parts": parts, "prompt_s": prompt_s, "prompt_rows_s": prompt_rows_s,
               "plans": plans, "choices": choices,
               "methods": methods, "skipped": skipped}
    return rows, context


def _methods(target, draft, settings: BenchSettings, assistant, peers):
    """(methods in the order they run, methods skipped with why, the models they run with)."""
    source = assisting_model(draft, assistant) if settings.hf else None
    skipped = {}
    if settings.hf and source is None:
        skipped["hf_assisted"] = (
            "no standalone draft to assist with (an EAGLE-3 head or no draft): pass --assistant"
        )
    methods = [m for m in HF_METHODS if settings.hf and m not in skipped]
    methods += list(settings.decoders) + list(peers or {})
    helper = None
    if source is not None:  # one shared vocabulary: the smaller of the two
        vocab = min(target.vocab_size, source.vocab_size)
        helper = assistant_for(target.model, source.model, vocab)
    return methods, skipped, BenchModels(target, draft, helper, dict(peers or {}))


def _interleaved_runs(models: BenchModels, prompts, settings: BenchSettings, methods,
                      config_for, progress) -> list[tuple[dict, object, int]]:
    """(row, DecodeResult or None, prompt index) of every method on every prompt and
    temperature, the methods' order rotating from prompt to prompt (drift of a shared machine
    then hits every method alike); at temperature 0, each row says whether it wrote HF
    greedy's tokens and, where not, where and why it parted."""
    runs = []
    for i, prompt in enumerate(prompts):
        for temp in settings.temperatures:
            order = methods[i % len(methods):] + methods[: i % len(methods)]
            done = {}
            for method in order:
                config = config_for(method, temp, settings.decode.seed + i)
                tokens, wall, result = run_method(method, models, prompt, config, settings)
                done[method] = tokens
                runs.append((_row(method, prompt, temp, config, tokens, wall, result), result, i))
                if progress is not None:
                    progress(runs[-1][0])
            if greedy(temp) and "hf_generate" in done:
                for row, _, _ in runs[-len(order):]:
                    row["same_as_hf_generate"] = done[row["method"]] == done["hf_generate"]
                    if not row["same_as_hf_generate"]:  # parted at a near-tie, or a bug?
                        row.update(_parting(models.target, prompt.ids, done["hf_generate"],
                                            done[row["method"]]))
    return runs


def _parting(target, prompt_ids, reference, tokens) -> dict:
    """Where `tokens` part from `reference`, the gap between the target's logits of the two
    tokens there and the widest gap rounding between pass shapes explains there, in rounding
    steps (`drift.explain_parting`): in bfloat16 a tree pass and a one-token step may round
    such a pair either way, and either token is the target's greedy choice as it runs."""
    p = explain_parting(target, prompt_ids, reference, tokens)
    return {"near_tie": p.near_tie, "parting": p.position, "gap_steps": p.gap_steps,
            "tie_threshold_steps": p.threshold_steps}


def _row(method, prompt, temperature, config: DecodeConfig, tokens, wall, result) -> dict:
    ours = method not in HF_METHODS and not method.startswith(PEER)
    tree = ours and config.budget is not None
    # a tree decoder run with ar's config: its auto pick was no tree (budget and depth 0)
    no_tree = ours and get_decoder(method).drafts and not config.decoder.drafts
    row = {
        "method": method,
        "temperature": temperature,
        "budget": config.budget if tree else NO_TREE if no_tree else "",
        "depth": config.pool.depth if tree else NO_TREE if no_tree else "",  # pool depth
        "question_id": prompt.question_id,
        "category": prompt.category,
        "prompt_tokens": len(prompt.ids),
        "new_tokens": len(tokens),
        "wall_time": wall,
        "tokens_per_s": len(tokens) / wall if wall > 0 else 0.0,
        "same_as_hf_generate": "",
    }
    if result is None or not result.rounds:
        return row
    rounds = result.rounds
    row["rounds"] = len(rounds)
    for key in PER_ROUND:
        row[f"mean_{key}"] = float(np.mean([getattr(r, key) for r in rounds]))
    return row
