"""How long a decode job may run, from part times measured on the machine that runs it: the wall
time the pipeline asks a cluster for (SLURM `runtime`) before the job starts.

A job decodes every prompt turn once per budget condition. Each round commits at least one
token, so a turn takes at most its prompt's prefill plus `max_new_tokens` rounds, each as dear
as a round of its decoder can be (`Decoder.worst_round`, the registry's: each decoder says
which passes its dearest round runs):
- the verify pass over the largest tree the job runs (its budget plus the root or t0);
- the root pass beside or before it (a decoder with one: `Decoder.root_pass`);
- every draft pass of the pool at its widest, a redraft's second pool under t0 included; an
  EAGLE-3 head's first pass feeds the tokens the last round committed again;
- what a round costs beyond its passes, measured on `ar`'s rounds.
An `auto` condition first calibrates (passes timed, rows at 8 contexts), counted as one more
condition; a draft-free decoder calibrates along whole runs, each round verifying the union of
every candidate budget's tree (`targetrows.cost.draft_free`), priced at the sum of their sizes.
That bound, plus a job's start (imports, loading the models), times a margin, is the request:
the margin covers what a job does besides (reading prompts, writing answers, the first passes'
warm-up) and a machine slower than the one timed.

At `decode.batch_size` N above 1 the job runs N prompts at once, their passes gathered into
batched passes (`targetrows.decoding.batch`). The part times are timed at batch size 1, so the
bound rests on an assumption, conservative on every machine we know of: a batched pass of N
sequences costs no more than those N passes one after another (batching shares the weights'
reads; it does not add work). Then the job takes at most the sum of its sequences' passes, each
priced as batched: a lane's pass is padded to the widest of its batch, so every target pass of a
round is priced at the verify pass's width and every draft pass at the widest draft pass, and a
lane's prefill may pad the N - 1 other lanes' passes to its length (N prefills per turn). At N = 1
that is the bound above; at N > 1 it is a little more, never the N-fold speed-up batching may
bring: a request that is too long waits longer in the queue, one too short kills the job. Rounds
stay priced at the runs' mean context, though a lane's attention spans its batch's longest
buffer: the margin covers that.

Asking for the bound, not for the expected time, keeps a job from being killed at its limit:
speculation commits several tokens a round when the draft agrees, and the bound does not count
on it. For `ar` the bound is the job's own time; for a tree decoder it is several times more
(docs/measurements.md, "Wall-time requests"), which a scheduler turns into a longer wait in
its queue, not a failed job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from targetrows.core.pool import PoolShape
from targetrows.decoding.budget import Auto, Budget, Fixed, Matched
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import Decoder, RoundShape

from .calibration import candidate_budgets
from .parttimes import (
    PartTimes,
    PassCurve,
    mean_context_len,
    measure_parts,
    target_sizes_for,
    time_prompt_pass,
    timing_context,
)
from .rounds import DEFAULT_BUDGETS

PREFILL_ROWS_K = 8  # the dearest first pass: RACER's, which reads the top-8 of every prompt row


@dataclass(frozen=True)
class MeasuredPair:
    """What `targetrows part-times` measures for a pair and its prompts on one machine: its part
    times at the runs' mean context, the prefill of the longest prompt a turn may have, the
    prompt turns, a job's start and a round's overhead."""

    parts: PartTimes
    prefill_s: float  # one pass over `longest_turn` tokens from an empty cache
    longest_turn: int  # tokens of the longest prompt a turn may have (later turns: answers too)
    turns: int  # prompt turns over every prompts file (a two-turn question counts twice)
    load_s: float  # a job's start: its imports and loading the target and the draft
    # what a round costs beyond its passes (draws and their reads, checks, the loop's own
    # work): measured on ar's rounds, one pass each
    round_overhead_s: float = 0.0

    def to_json(self) -> dict:
        return {"parts": _parts_json(self.parts), "prefill_s": self.prefill_s,
                "longest_turn": self.longest_turn, "turns": self.turns, "load_s": self.load_s,
                "round_overhead_s": self.round_overhead_s}

    @classmethod
    def from_json(cls, doc: dict) -> MeasuredPair:
        return cls(_parts_from(doc["parts"]), float(doc["prefill_s"]), int(doc["longest_turn"]),
                   int(doc["turns"]), float(doc["load_s"]), float(doc["round_overhead_s"]))


@dataclass(frozen=True)
class DecodeWork:
    """What one decode job runs: its decoder at each budget condition over every prompt turn,
    `max_new_tokens` each, from a pool of `depth` levels of up to `top_k` nodes."""

    decoder: Decoder
    max_new_tokens: int
    budgets: tuple[int, ...] = ()  # the fixed budgets (none for a decoder without a tree)
    auto: bool = False  # one condition is `auto` (at most the largest candidate budget)
    top_k: int = 10
    depth: int = 6
    batch_size: int = 1  # prompts decoded at once (`decode.batch_size`)

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"a decode job's batch_size must be >= 1, got {self.batch_size} "
                             "(config key decode.batch_size)")

    @property
    def conditions(self) -> int:
        """Conditions decoded, the `auto` one's calibration counted as one more."""
        return max(1, len(self.budgets) + 2 * self.auto)

    @property
    def pool(self) -> PoolShape:
        return PoolShape(self.top_k, self.depth)

    @property
    def candidates(self) -> tuple[int, ...]:
        """The budgets an `auto` condition may pick (`calibration.candidate_budgets`)."""
        return candidate_budgets(self.pool) if self.auto else ()

    @property
    def largest_budget(self) -> int:
        return max(self.budgets + self.candidates, default=0)


def decode_work(decoder: Decoder, budgets: Sequence[Budget], max_new_tokens: int,
                pool: PoolShape, batch_size: int = 1) -> DecodeWork:
    """A decode job's `DecodeWork` from its budget conditions: a matched cap is at most the
    baseline budget it matches."""
    fixed = tuple(b.nodes if isinstance(b, Fixed) else b.at for b in budgets
                  if isinstance(b, Fixed | Matched)) if decoder.drafts else ()
    return DecodeWork(decoder, int(max_new_tokens), fixed,
                      decoder.drafts and any(isinstance(b, Auto) for b in budgets),
                      pool.top_k, pool.depth, int(batch_size))


def round_s(pair: MeasuredPair, shape: RoundShape, padded: bool = False) -> float:
    """Seconds of a round of `shape`'s passes with the pair's part times, and its overhead.
    `padded`: each pass as a lane of a batch runs it, padded to the widest pass of its model
    in the round (the root pass to the verify pass's width)."""
    parts = pair.parts
    seconds = pair.round_overhead_s + float(parts.target(shape.verify_nodes))
    if shape.root_pass:
        seconds += float(parts.target(shape.verify_nodes if padded else 1))
    if shape.draft_widths:
        if parts.draft is None:
            raise ValueError("the round drafts, but the part times hold no draft passes")
        widths = list(shape.draft_widths)
        if parts.draft_refeeds:  # an EAGLE-3 head's first pass feeds the last round's tokens
            widths[0] = max(widths[0], shape.committed)
        if padded:
            widths = [max(widths)] * len(widths)
        seconds += sum(float(parts.draft(w)) for w in widths)
    return seconds


def worst_round_s(pair: MeasuredPair, work: DecodeWork) -> float:
    """The dearest round `work` can have: its decoder's at the largest budget it may run (in a
    batch, its passes padded: the module docstring)."""
    return round_s(pair, work.decoder.worst_round(work.pool, work.largest_budget),
                   padded=work.batch_size > 1)


def calibration_round_s(pair: MeasuredPair, work: DecodeWork) -> float:
    """The dearest round of an `auto` condition's calibration: a decode round for a decoder
    with a draft (its rows are read at a few contexts), and for a draft-free one a pass over
    the union of every candidate budget's tree."""
    if work.decoder.needs_draft or not work.decoder.drafts:
        return worst_round_s(pair, work)
    union = 1 + sum(work.candidates)
    return round_s(pair, RoundShape(union, False, (), union), padded=work.batch_size > 1)


def decode_seconds(pair: MeasuredPair, work: DecodeWork) -> float:
    """The bound on the job's decoding (the module docstring), loading left out: every condition
    over every turn, each turn a prefill of the longest prompt and one token per round. In a
    batch of N, a turn's prefill may pad the other lanes' passes to its length: N prefills."""
    def turns(round_seconds: float) -> float:
        return pair.turns * (work.batch_size * pair.prefill_s
                             + work.max_new_tokens * round_seconds)

    calibrations = int(work.auto and work.decoder.drafts)
    return ((work.conditions - calibrations) * turns(worst_round_s(pair, work))
            + calibrations * turns(calibration_round_s(pair, work)))


def decode_minutes(pair: MeasuredPair, work: DecodeWork, margin: float = 1.5,
                   least: int = 10) -> int:
    """Minutes to ask for: `margin` times the bound plus the load, and at least `least`."""
    if margin < 1:
        raise ValueError(f"a runtime margin of {margin} asks for less than the bound; use >= 1")
    seconds = margin * (decode_seconds(pair, work) + pair.load_s)
    return max(least, math.ceil(seconds / 60))


def measure_pair(target, draft, prompts: Sequence[Sequence[int]], turns: int, longest_turn: int,
                 max_new_tokens: int, budgets: Sequence[int], top_k: int, load_s: float,
                 repeats: int = 3) -> MeasuredPair:
    """Time what a decode job's rounds are made of on this machine: target passes up to the
    largest budget (and `auto`'s candidates) and draft passes up to `top_k` wide, at the mean
    context of runs from `prompts` (first turns, token ids); and the prefill of `longest_turn`
    tokens by the target (the dearest first pass, RACER's) and the draft."""
    lens = [len(p) for p in prompts]
    context = timing_context(prompts, mean_context_len(lens, max_new_tokens))
    sizes = target_sizes_for([*budgets, *DEFAULT_BUDGETS])
    draft_sizes = sorted({1, 2, max(top_k, 2)}) if draft is not None else ()
    parts = measure_parts(target, draft, context, sizes, draft_sizes, repeats)
    longest = timing_context(prompts, longest_turn)
    prefill = time_prompt_pass(target, longest, repeats, rows_k=PREFILL_ROWS_K)
    prefill += float(parts.target(1))
    if draft is not None:
        prefill += time_prompt_pass(draft, longest, repeats) + float(parts.draft(1))
    return MeasuredPair(parts, prefill, int(longest_turn), int(turns), float(load_s),
                        round_overhead(target, prompts[0], parts))


def round_overhead(target, prompt: Sequence[int], parts: PartTimes, rounds: int = 16) -> float:
    """Median seconds of an `ar` round beyond its one-token pass (`parts.target(1)`), over
    `rounds` rounds after a warm-up decode (its first round, the prefill, left out)."""
    config = DecodeConfig("ar", max_new_tokens=rounds + 1)
    generate(target, None, list(prompt), config)
    result = generate(target, None, list(prompt), config)
    t_round = [r.t_round for r in result.rounds[1:]]
    return max(0.0, float(np.median(t_round)) - float(parts.target(1))) if t_round else 0.0


# -- JSON ----------------------------------------------------------------------------------------


def _curve_json(curve: PassCurve | None) -> dict | None:
    return None if curve is None else {"sizes": list(curve.sizes), "seconds": list(curve.seconds)}


def _curve_from(doc: dict | None) -> PassCurve | None:
    return None if doc is None else PassCurve(tuple(doc["sizes"]), tuple(doc["seconds"]))


def _parts_json(parts: PartTimes) -> dict:
    return {"target": _curve_json(parts.target), "draft": _curve_json(parts.draft),
            "context_len": parts.context_len, "draft_refeeds": parts.draft_refeeds,
            "longer": None if parts.longer is None else _parts_json(parts.longer)}


def _parts_from(doc: dict) -> PartTimes:
    return PartTimes(_curve_from(doc["target"]), _curve_from(doc["draft"]),
                     int(doc["context_len"]), bool(doc["draft_refeeds"]),
                     None if doc.get("longer") is None else _parts_from(doc["longer"]))
