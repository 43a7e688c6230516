"""What the passes of a round cost on this machine: a forward pass of the target or the draft
timed against the number of new tokens it feeds, on top of a cached context, at one or two
context lengths (attention reads the whole context, so a pass at 1,000 tokens costs more than
one at 100: `PartTimes.at` interpolates).

`targetrows.cost.rounds` turns these part times into round times and the zero-overhead bound
of each decoder, `targetrows.cost.calibration` into the budget that fits the hardware.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from targetrows.core.passes import Passes, run_now
from targetrows.core.tree import Tree
from targetrows.decoding.model import synchronize
from targetrows.decoding.planners import prompt_rows


@dataclass(frozen=True)
class PassCurve:
    """Seconds of one forward pass against the number of new tokens it feeds: linear between
    the measured sizes, extended along the last segment's slope beyond them, 0 for 0 tokens."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self):
        sizes = np.asarray(self.sizes)
        if len(sizes) == 0 or len(sizes) != len(self.seconds):
            raise ValueError(
                f"a pass curve needs one time per size, got {self.sizes} / {self.seconds}"
            )
        if np.any(np.diff(sizes) <= 0) or sizes[0] < 1:
            raise ValueError(f"pass sizes must be increasing and >= 1, got {self.sizes}")

    def __call__(self, n):
        n = np.asarray(n, dtype=np.float64)
        x, y = np.asarray(self.sizes, float), np.asarray(self.seconds, float)
        out = np.interp(n, x, y)
        if len(x) > 1:
            slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
            out = np.where(n > x[-1], y[-1] + slope * (n - x[-1]), out)
        out = np.where(n <= 0, 0.0, out)
        return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class PartTimes:
    target: PassCurve  # target pass over q new tokens
    draft: PassCurve | None  # draft pass over w new tokens
    context_len: int  # committed tokens in the cache when they were timed
    # the draft feeds a round's committed tokens again in its next round's first pass (an
    # EAGLE-3 head, from the target's features); a standalone draft kept the entries its pool
    # fed, and its first pass feeds the bonus token alone
    draft_refeeds: bool = False
    longer: PartTimes | None = None  # the same passes timed at a longer context

    def __post_init__(self):
        if self.longer is not None and self.longer.context_len <= self.context_len:
            raise ValueError(f"part times at a longer context must be at more than "
                             f"{self.context_len} tokens, got {self.longer.context_len}")

    def at(self, context_len: float) -> PartTimes:
        """The part times at a mean context of `context_len` tokens: linear in the context
        between the two timings (attention's cost is), held at the shorter one's below it and
        extended along the line above the longer one. Timed at one context: those times."""
        if self.longer is None:
            return self
        far = self.longer
        share = max(0.0, (context_len - self.context_len) / (far.context_len - self.context_len))

        def between(near: PassCurve | None, long: PassCurve | None) -> PassCurve | None:
            if near is None or long is None:
                return near
            if near.sizes != long.sizes:
                raise ValueError(f"cannot interpolate pass curves over sizes {near.sizes} and "
                                 f"{long.sizes}")
            seconds = np.add(near.seconds, share * np.subtract(long.seconds, near.seconds))
            return PassCurve(near.sizes, tuple(isotonic(np.maximum(seconds, 0.0).tolist())))

        return PartTimes(between(self.target, far.target), between(self.draft, far.draft),
                         round(context_len), self.draft_refeeds)


# -- timing ------------------------------------------------------------------------------------


def time_passes(
    model, context: Sequence[int], sizes: Sequence[int], repeats: int = 3, seed: int = 0
) -> PassCurve:
    """Median seconds of a pass feeding n tree nodes on top of a cached `context`, per size n,
    made non-decreasing in n (`isotonic`).

    The whole context is cached first, so a pass feeds exactly the n nodes; after each pass the
    model drops them again (commit of the same context), so every pass starts from one cache.
    The n nodes are the root's children: one pass for every model (an EAGLE-3 head feeds a
    tree one level per pass, and a round's draft passes are each one level of its pool).
    Each repeat times every size once, in turn: on a shared machine a slow spell then slows one
    sample of every size, which the median drops, instead of every sample of one size (which
    would make that size look dearer than a larger one, and mislead --budget auto).
    """
    return run_now(time_passes_steps(model, context, sizes, repeats, seed))


def time_passes_steps(model, context: Sequence[int], sizes: Sequence[int], repeats: int = 3,
                      seed: int = 0) -> Passes[PassCurve]:
    """`time_passes` as steps that ask for their passes (`targetrows.core.passes`): how a lane
    of a batch times its passes, each run batched with the other lanes' (`measure_parts`)."""
    ctx = [int(t) for t in context]
    sizes = sorted({int(n) for n in sizes})
    if not ctx or not sizes or sizes[0] < 1:
        raise ValueError(f"time_passes needs a non-empty context and sizes >= 1, got {sizes}")
    rng = np.random.default_rng(seed)
    model.reset(seed)
    yield from model.logits_passes(ctx, Tree.root_only(ctx[-1]), [0])
    model.commit(ctx)
    trees = {n: _one_level(rng, ctx[-1], n, model.vocab_size) for n in sizes}
    yield from _timed_pass(model, ctx, trees[sizes[-1]])  # warm-up: allocator, kernels
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            samples[n].append((yield from _timed_pass(model, ctx, trees[n])))
    seconds = [float(np.median(samples[n])) for n in sizes]
    model.reset(seed)
    return PassCurve(tuple(sizes), tuple(isotonic(seconds)))


def time_prompt_pass(model, prompt: Sequence[int], repeats: int = 3,
                     rows_k: int | None = None) -> float:
    """Median seconds of a pass over the whole `prompt` from an empty cache (the first pass of
    any decoding), less a one-token pass on top of it (what a round's part times count).
    `rows_k`: the first pass of a decoder that reads the target's top-`rows_k` rows at every
    prompt position (RACER's, `decoding.planners.prompt_rows`), which costs more."""
    ctx = [int(t) for t in prompt]
    if not ctx:
        raise ValueError("time_prompt_pass needs a non-empty prompt")
    root = Tree.root_only(ctx[-1])
    one = _one_level(np.random.default_rng(0), ctx[-1], 1, model.vocab_size)
    full, step = [], []
    for _ in range(repeats + 1):  # the first of each is a warm-up
        model.reset(0)
        t = time.perf_counter()
        if rows_k is None:
            model.logits(ctx, root, [0])
        else:
            prompt_rows(model, ctx, rows_k)
        synchronize(model)
        full.append(time.perf_counter() - t)
        model.commit(ctx)
        step.append(run_now(_timed_pass(model, ctx, one)))
    model.reset(0)
    return max(0.0, float(np.median(full[1:]) - np.median(step[1:])))


def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to `values` in least squares (pool adjacent
    violators): a pass over more tokens never costs less, so a dip is timing noise, and left in
    it would make a bigger tree look free."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return [m for m, w in blocks for _ in range(int(w))]


def _timed_pass(model, ctx: list[int], tree: Tree) -> Passes[float]:
    t = time.perf_counter()
    yield from model.logits_passes(ctx, tree, np.arange(1, len(tree)))
    synchronize(model)
    elapsed = time.perf_counter() - t
    model.commit(ctx)  # drops the tree's entries
    return elapsed


def _one_level(rng: np.random.Generator, root: int, n: int, vocab: int) -> Tree:
    """n random tokens under the root (distinct while the vocabulary allows)."""
    tokens = rng.choice(vocab, size=n, replace=n > vocab)
    return Tree(np.concatenate([[root], tokens]), np.array([-1] + [0] * n))


def measure_parts(
    target,
    draft,
    context: Sequence[int],
    target_sizes: Sequence[int],
    draft_sizes: Sequence[int] = (),
    repeats: int = 3,
    longer: Sequence[int] | None = None,
    batch_size: int = 1,
) -> PartTimes:
    """Time target passes (and draft passes, with a draft) at `context`, and at the `longer`
    context too where one is given (for `PartTimes.at`). At `batch_size` N above 1: the passes
    of a batch of N sequences (`targetrows.decoding.batch`), each lane timing the same passes,
    which run together, so that a lane's time is the batched pass's (a verify pass over N x n
    nodes): what a round of each sequence costs when N decode at once."""
    if batch_size == 1:
        return run_now(_parts_steps(target, draft, context, target_sizes, draft_sizes, repeats,
                                    longer))
    from targetrows.decoding.schedule import run_batched

    def job(t, d):
        return _parts_steps(t, d, context, target_sizes, draft_sizes, repeats, longer)

    return run_batched(target, draft, [job] * batch_size, batch_size)[0]


def _parts_steps(target, draft, context, target_sizes, draft_sizes, repeats,
                 longer) -> Passes[PartTimes]:
    tcurve = yield from time_passes_steps(target, context, target_sizes, repeats)
    dcurve = None
    if draft is not None and draft_sizes:
        dcurve = yield from time_passes_steps(draft, context, draft_sizes, repeats)
    refeeds = bool(getattr(draft, "refeeds_committed", False))
    far = None
    if longer is not None and len(longer) > len(context):
        far = yield from _parts_steps(target, draft, longer, target_sizes, draft_sizes, repeats,
                                      None)
    return PartTimes(tcurve, dcurve, len(context), refeeds, far)


def timing_context(prompts: Sequence[Sequence[int]], length: int) -> list[int]:
    """A context of `length` tokens to time passes at: the prompts' tokens, repeated as needed
    (a pass's cost depends on how many tokens are cached, not on which)."""
    ids = [int(t) for p in prompts for t in p]
    if not ids or length < 1:
        raise ValueError(f"a timing context needs prompt tokens and a length >= 1, got "
                         f"{len(ids)} tokens and length {length}")
    return (ids * (length // len(ids) + 1))[:length]


def mean_context_len(prompt_lens: Sequence[int], new_tokens: int) -> int:
    """The mean context the runs decode at: the prompts' mean length plus half the new tokens
    (a round's cost grows linearly with the context, so its mean over a run is the cost at the
    run's mean context)."""
    if len(prompt_lens) == 0:
        raise ValueError("mean_context_len needs at least one prompt")
    return max(1, round(float(np.mean(prompt_lens)) + new_tokens / 2))


def mean_parts(a: PartTimes, b: PartTimes) -> PartTimes:
    """Two timings of the same sizes and contexts averaged (say, before and after a benchmark)."""

    def mean(x: PassCurve | None, y: PassCurve | None) -> PassCurve | None:
        if x is None or y is None:
            return x or y
        if x.sizes != y.sizes:
            raise ValueError(f"cannot average pass curves over sizes {x.sizes} and {y.sizes}")
        return PassCurve(x.sizes, tuple(isotonic((np.add(x.seconds, y.seconds) / 2).tolist())))

    if a.context_len != b.context_len or (a.longer is None) != (b.longer is None):
        raise ValueError("cannot average part times timed at different contexts")
    longer = mean_parts(a.longer, b.longer) if a.longer is not None else None
    return PartTimes(mean(a.target, b.target), mean(a.draft, b.draft), a.context_len,
                     a.draft_refeeds, longer)


def target_sizes_for(budgets: Sequence[int]) -> list[int]:
    """Pass sizes to time for trees of up to max(budgets) nodes: powers of two and the budgets
    (with and without the root)."""
    top = max(budgets) + 1
    grid = {1, 2} | {2**i for i in range(1, 12) if 2**i <= top}
    return sorted(grid | {b for b in budgets} | {b + 1 for b in budgets})


def draft_sizes_for(widths: Sequence[int], most_committed: int) -> list[int]:
    """Draft pass sizes to time: a round's pass widths (`Decoder.draft_widths`) and every size
    up to the most tokens a round commits (the first pass of a draft that feeds them again)."""
    return sorted({int(w) for w in widths} | set(range(1, most_committed + 1)))
