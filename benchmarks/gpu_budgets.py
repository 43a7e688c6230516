"""The seconds each part of the GPU check's graphs stage needs (`gpu_graphs.GraphsStage.need_s`),
from the work it runs, priced at what the stage has measured by the time it starts: the GPU
check skips a part only when that budget exceeds the time left.

The rule: a part's budget is MARGIN times the seconds of what it runs, counted from the
stage's settings:

- passes of a model, each priced on that model's pass curve (`PassCurve`: linear between the
  sizes measured): at first the setup's probe (`probe`: eager passes of one token, of the
  widest the stage feeds and of a prefill, per model), then the passes part's curves (each
  size at the slower of eager and graphs); a head step on the head part's curve, before it on
  the draft's;
- decodes, each as the pipeline bounds a decode job (`targetrows.cost.job_time`): its
  prompt's prefill, then one round a new token (a round commits at least one, and random
  weights accept almost nothing more), each as dear as its decoder's dearest round at the
  run's budget and pool (`Decoder.worst_round`), plus what an `ar` round costs beyond its
  pass (`round_overhead`, probed at the setup);
- graphs captured: each bucket a part may replay and its model has not captured yet, at the
  mean of the captures so far, or, before the first, at two passes of the widest bucket (a
  capture runs the pass twice: a warm-up and the recorded run).

The identity part's tiny float32 models are priced the same way, on their own curves and
round overhead, probed at the setup. MARGIN is the pipeline's own margin on that bound
(`decode_minutes`): it covers the host work the count leaves out (a tree decoder's pool growth
and selection beyond `ar`'s round) and a slower spell of the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from targetrows.core.pool import PoolShape
from targetrows.cost.job_time import MeasuredPair, decode_seconds, decode_work, round_overhead
from targetrows.cost.parttimes import (
    PartTimes,
    PassCurve,
    draft_sizes_for,
    target_sizes_for,
    time_passes,
)
from targetrows.decoding.budget import Fixed
from targetrows.decoding.registry import decoder_names, get_decoder

MARGIN = 1.5  # `decode_minutes`' default margin
# the passes part's curves, by the model they price (a head's steps: the head part's)
MEASURED = {"target": "target_passes", "draft": "draft_pass", "head": "head_step"}
# `targetrows bench` picks a fixed budget after calibrating each tree decoder's acceptance at
# 3 contexts 12 greedy tokens apart (`bench.plan.pick_budgets`, one category of prompts)
CALIBRATION_TOKENS = 3 * 12
# explaining a parting (`gpu_graphs.graphs_parting`): a fresh pass over the context, and on each
# of two models `row_spread`'s 7 (two prefills, a step, trees of 2, 8, 32 and 64 nodes)
PARTING_PASSES = 1 + 2 * 7


@dataclass(frozen=True)
class Decoding:
    """How a part decodes: how many prompts of how many tokens, the new tokens of each, the
    budget and the pool."""

    prompts: int
    prompt_len: int
    new_tokens: int
    budget: int
    pool: PoolShape


class Prices:
    """What the stage has measured so far (`rep`, its parts' results), and the setup's probe:
    a pass curve per model, what an `ar` round costs beyond its pass (per pair), and the
    graphs' captures (`captured()`: their count and seconds so far)."""

    def __init__(self, rep: dict, probed: dict[str, PassCurve], overhead_s: dict[str, float],
                 captured):
        self.rep, self.probed, self.overhead_s, self.captured = rep, probed, overhead_s, captured

    def curve(self, model: str) -> PassCurve:
        measured = self.rep.get(MEASURED.get(model))
        if measured is not None:
            return _slower(measured["eager"], measured["graphs"])
        return self.curve("draft") if model == "head" else self.probed[model]

    def pass_s(self, model: str, n: int) -> float:
        return float(self.curve(model)(n))

    def captures_s(self, model: str, count: int, widest: int) -> float:
        """`count` captures of `model`'s graphs (see the module docstring)."""
        done, seconds = self.captured()
        each = seconds / done if done else 2 * self.pass_s(model, widest)
        return max(count, 0) * each

    def decodes_s(self, pair: tuple[str, str], names, run: Decoding, decodes: int,
                  overhead: str) -> float:
        """`decodes` decodes of each decoder in `names` on `pair` (target, draft: the curves'
        keys) as `run` says: the job-time bound (see the module docstring)."""
        target, draft = pair
        parts = PartTimes(self.curve(target), self.curve(draft), run.prompt_len,
                          draft_refeeds=draft == "head")
        prefill = self.pass_s(target, run.prompt_len) + self.pass_s(draft, run.prompt_len)
        measured = MeasuredPair(parts, prefill, run.prompt_len, decodes, 0.0,
                                self.overhead_s[overhead])
        return sum(decode_seconds(measured, decode_work(get_decoder(name), [Fixed(run.budget)],
                                                        run.new_tokens, run.pool))
                   for name in names)


def _slower(a: PassCurve, b: PassCurve) -> PassCurve:
    """The slower of two curves over the same sizes, size by size."""
    return PassCurve(a.sizes, tuple(max(x, y) for x, y in zip(a.seconds, b.seconds, strict=True)))


def probe(stage, tiny_pair) -> Prices:
    """The setup's prices: eager passes of one token, of the widest the stage feeds and of its
    context (a prefill), per model (`time_passes`, 3 repeats), on the stage's 8B-shaped pair
    and on the identity part's tiny float32 pair (`tiny_pair`: `HFModel`s, at a context as
    long as the identity's runs); and an `ar` round's cost beyond its pass on each pair."""
    run = stage.tiny_run
    tiny_ctx = [t % tiny_pair[0].vocab_size for t in stage.ctx[: run.prompt_len + run.new_tokens]]
    runs = {"target": (stage.target, stage.ctx, max(stage.sizes)),
            "draft": (stage.draft, stage.ctx, max(stage.draft_sizes)),
            "tiny target": (tiny_pair[0], tiny_ctx, 8), "tiny draft": (tiny_pair[1], tiny_ctx, 8)}
    # three of each, the median kept: a shape's first pass may pay for its kernels' set-up
    curves = {key: time_passes(model, ctx, sorted({1, widest, len(ctx)}), repeats=3)
              for key, (model, ctx, widest) in runs.items()}
    overhead = {pair: round_overhead(model, ctx[: run.prompt_len],
                                     PartTimes(curves[key], None, run.prompt_len), rounds=8)
                for pair, model, ctx, key in (("8b", stage.target, stage.ctx, "target"),
                                              ("tiny", tiny_pair[0], tiny_ctx, "tiny target"))}
    return Prices(stage.rep, curves, overhead, stage.captured)


def need_s(stage, part: str) -> float:
    """The seconds `part` needs (the module docstring's rule)."""
    return MARGIN * WORK[part](stage, stage.prices)


def _passes(stage, prices: Prices) -> float:
    """`time_passes` eager, then on graphs, per model: the context's prefill, a warm-up at the
    widest, each size once a repeat; on graphs a capture of each size and of the prefill."""
    seconds = 0.0
    for model, sizes in (("target", stage.sizes), ("draft", stage.draft_sizes)):
        one = (prices.pass_s(model, len(stage.ctx)) + prices.pass_s(model, max(sizes))
               + stage.repeats * sum(prices.pass_s(model, n) for n in sizes))
        seconds += 2 * one + prices.captures_s(model, len(sizes) + 1, max(stage.shape.buckets))
    return seconds


def _kernels(stage, prices: Prices) -> float:
    """`kernel_breakdown` at each size: the context's prefill, a warm-up, three timed passes
    and the profiled one (the profiler's own start and trace left to the margin)."""
    return sum(prices.pass_s("target", len(stage.ctx)) + 5 * prices.pass_s("target", n)
               for n in stage.kernel_sizes)


def _identity(stage, prices: Prices) -> float:
    """Every decoder, eager and on graphs, on each of the identity's prompts, and once more on
    graphs with the syncs counted, with the standalone draft and with the head (drafted
    decoders); a capture of each bucket per model (target, draft or head, a head's ranking)."""
    run, seconds = stage.tiny_run, 0.0
    for kind in ("standalone", "eagle3"):
        names = [n for n in decoder_names()
                 if kind == "standalone" or get_decoder(n).needs_draft]
        seconds += prices.decodes_s(("tiny target", "tiny draft"), names, run,
                                    2 * run.prompts + 1, "tiny")
    # captures: the standalone pair's two groups of graphs, the head pair's three; each at
    # two tiny passes (the 8B-shaped models' captures do not price the tiny ones')
    buckets = stage.tiny_shape.buckets
    return seconds + (2 + 3) * len(buckets) * 2 * prices.pass_s("tiny target", max(buckets))


def _head(stage, prices: Prices) -> float:
    """`time_passes` of the head, eager then on graphs: the target's features of the context
    (a target pass), the head's prefill, a warm-up, each width a repeat; on graphs a capture of
    each width and of the prefill, and the target twin's prefill."""
    widths = stage.head_widths
    one = (prices.pass_s("target", len(stage.ctx)) + prices.pass_s("head", len(stage.ctx))
           + prices.pass_s("head", max(widths))
           + stage.repeats * sum(prices.pass_s("head", n) for n in widths))
    widest = max(stage.shape.buckets)
    return (2 * one + prices.captures_s("head", len(widths) + 1, widest)
            + prices.captures_s("target", 1, widest))


def _speed(stage, prices: Prices) -> float:
    """Each speed decoder on every prompt after a warm-up, eager and on graphs; Hugging Face's
    `generate()` as many times (priced as `ar`); a parting explained for every decode compared;
    the graphs of every bucket the pair has not captured."""
    run = stage.run
    seconds = prices.decodes_s(("target", "draft"), stage.speed_decoders, run,
                               2 * (run.prompts + 1), "8b")
    seconds += prices.decodes_s(("target", "draft"), ["ar"], run, run.prompts + 1, "8b")
    context = run.prompt_len + run.new_tokens
    seconds += (len(stage.speed_decoders) * run.prompts * PARTING_PASSES
                * prices.pass_s("target", context))
    return seconds + _uncaptured_s(stage, prices, ("target", "draft"))


def _uncaptured_s(stage, prices: Prices, models) -> float:
    """Captures of every bucket of `models` ("target", "draft", "head") not captured yet on
    the main stream."""
    widest = max(stage.shape.buckets)
    return sum(prices.captures_s(m, len(stage.shape.buckets) - stage.captured_by(m), widest)
               for m in models)


def _overlap(stage, prices: Prices) -> float:
    """rerank and fts on graphs, a warm-up and a prompt, each schedule; the root pass's graphs
    on its side stream."""
    run = replace(stage.run, prompts=1)
    seconds = prices.decodes_s(("target", "draft"), ("rerank", "fts"), run, 2 * 2, "8b")
    return seconds + prices.captures_s("target", len(stage.shape.buckets),
                                       max(stage.shape.buckets))


def _bench(stage, prices: Prices, draft: str = "draft") -> float:
    """`run_bench` on graphs: each decoder's warm-up (4 tokens) and its decode of every
    prompt, its acceptance calibrated (tree decoders), the part times twice (before and after
    the runs), each prompt's first pass timed (and again with its rows read, for RACER), and
    the captures not made yet."""
    run, pair, names = stage.run, ("target", draft), decoder_names(learned=False)
    seconds = prices.decodes_s(pair, names, run, run.prompts, "8b")
    seconds += prices.decodes_s(pair, names, replace(run, new_tokens=4), 1, "8b")
    trees = [n for n in names if get_decoder(n).drafts]
    seconds += prices.decodes_s(pair, trees, replace(run, new_tokens=CALIBRATION_TOKENS), 1,
                                "8b")
    pool, repeats = run.pool, stage.bench_repeats
    sizes = {"target": target_sizes_for([min(run.budget, pool.size)]),
             draft: draft_sizes_for([pool.guesses, pool.top_k, pool.guesses * pool.top_k],
                                    pool.depth + 2)}
    context = run.prompt_len + run.new_tokens // 2  # `bench.plan.measure`'s
    for model, widths in sizes.items():  # `measure_parts`: as `_passes` times one model
        seconds += 2 * (prices.pass_s(model, context) + prices.pass_s(model, max(widths))
                        + repeats * sum(prices.pass_s(model, n) for n in widths))
    seconds += 2 * run.prompts * (repeats + 1) * (prices.pass_s("target", run.prompt_len)
                                                  + prices.pass_s("target", 1))
    return seconds + _uncaptured_s(stage, prices, pair)


WORK = {"passes": _passes, "kernels": _kernels, "identity": _identity, "head": _head,
        "speed": _speed, "overlap": _overlap, "bench": _bench,
        "head_bench": lambda stage, prices: _bench(stage, prices, "head")}
