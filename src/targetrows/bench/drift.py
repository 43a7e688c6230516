"""Temperature-0 drift: where a decoder's tokens part from the target's own greedy tokens, and
how close the target's logits of the two tokens were there.

Every decoder is lossless with respect to the target *as it computes its rows*. A row is the
same function of the context in every pass, but not the same floating-point computation: a
tree pass of n tokens, ar's one-token step and a prefill multiply matrices of different shapes,
and the kernels sum in different orders (on GPUs the kernel itself is chosen by shape). So the
same row can come out a few rounding steps apart, and where the target's two best logits are
closer than that, a decoder takes the other token from then on: a *parting*. In float64 (and in
float32 on this project's CPU kernels) rows agree closely enough that no parting happens in
practice; in bfloat16 they can.

- `row_spread` measures how far one row moves between pass shapes, in rounding steps of the
  rows' dtype: what decides whether a parting at a given gap can be rounding at all;
- `near_tie_steps` turns measured spreads into the widest gap rounding explains;
- `explain_parting` finds where a run parts from the reference and measures both there (what
  `compare`, `bench`, `targetrows drift` and the pipeline's drift table report);
- `drift_summary` is the table: per decoder, the runs whose tokens equal the reference, and at
  each parting the gap of the two tokens' logits in rounding steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from targetrows.core.passes import Passes, run_now
from targetrows.core.tree import Tree


def rounding_step(value: float, eps: float) -> float:
    """The spacing of floating-point numbers with machine epsilon `eps` at `value` (one unit
    in the last place of a number of that size)."""
    return eps * 2.0 ** math.floor(math.log2(max(abs(value), np.finfo(np.float64).tiny)))


def _eps(row) -> float:
    import torch

    if isinstance(row, torch.Tensor):
        return float(torch.finfo(row.dtype).eps)
    return float(np.finfo(np.asarray(row).dtype).eps)


def _numpy(row) -> np.ndarray:
    if hasattr(row, "detach"):
        return row.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(row, dtype=np.float64)


@dataclass(frozen=True)
class Spread:
    """How far the row at one context moves between pass shapes, against ar's one-token step."""

    dtype: str
    best_logit: float  # the row's largest logit (ar's step)
    step: float  # one rounding step of the dtype at that size
    # pass -> largest |logit difference| from ar's step, in steps: "prefill" (the whole context
    # from an empty cache) and "tree n" (the row as a node of an n-node tree pass)
    steps: dict
    same_argmax: bool  # every pass agreed on the best token

    @property
    def max_steps(self) -> float:
        return max(self.steps.values(), default=0.0)


def _tree_with(row_token: int, root: int, n: int, vocab: int, rng) -> Tree:
    """A tree of n non-root nodes whose node 1 is `row_token` under the root; the others are
    random (distinct tokens under each parent)."""
    parents, tokens = [-1, 0], [root, row_token]
    used = {0: {row_token}}
    for i in range(2, n + 1):
        parent = int(rng.integers(i))
        taken = used.setdefault(parent, set())
        tok = int(rng.integers(vocab))
        while tok in taken:
            tok = int(rng.integers(vocab))
        taken.add(tok)
        parents.append(parent)
        tokens.append(tok)
    return Tree(np.array(tokens), np.array(parents))


def _step_and_trees(model, ctx: list[int], sizes: Sequence[int], seed: int) -> Passes[dict]:
    """The row at `ctx` from a one-token step on the cached ctx[:-1] ("step"), then as node 1 of
    a tree pass of each of `sizes` nodes ("tree n"); as steps that ask for their passes."""
    rng = np.random.default_rng(seed)
    yield from model.logits_passes(ctx[:-1], Tree.root_only(ctx[-2]), [0])
    model.commit(ctx[:-1])
    rows = {"step": (yield from model.logits_passes(ctx, Tree.root_only(ctx[-1]), [0]))}
    model.commit(ctx[:-1])
    for n in (n for n in sizes if n < model.vocab_size):  # a tree's first level: distinct tokens
        tree = _tree_with(ctx[-1], ctx[-2], int(n), model.vocab_size, rng)
        rows[f"tree {n}"] = yield from model.logits_passes(ctx[:-1], tree, [1])
        model.commit(ctx[:-1])
    return {k: _numpy(r)[0] for k, r in rows.items()}


def _in_a_batch(model, ctx: list[int], sizes: Sequence[int], seed: int,
                batch_size: int) -> dict:
    """`_step_and_trees` at `ctx` as lane 0 of a batch of `batch_size` lanes
    (`targetrows.decoding.batch`), the other lanes making the same passes at random contexts
    of other lengths: each pass is padded and masked as a real batch's is."""
    from targetrows.decoding.schedule import run_batched

    rng = np.random.default_rng(seed)
    contexts = [ctx] + [rng.integers(model.vocab_size, size=int(n)).tolist() for n in
                        rng.integers(3, 2 * len(ctx) + 2, size=batch_size - 1)]
    jobs = [lambda lane, _, c=c: _step_and_trees(lane, c, sizes, seed) for c in contexts]
    rows = run_batched(model, None, jobs, batch_size)[0]
    return {f"batch {batch_size} {k}": r for k, r in rows.items()}


def row_spread(model, context: Sequence[int], sizes: Sequence[int] = (2, 8, 32, 64),
               seed: int = 0, batch_size: int = 1) -> Spread:
    """The row at `context` as ar computes it (a one-token step on the cached context less its
    last token) against the same row from a prefill and as node 1 of tree passes of `sizes`
    nodes (on the cached context less its last token), and with `batch_size` above 1 the same
    step and trees in a batch of that many sequences ("batch N step", "batch N tree n"): the
    largest logit difference of each, in rounding steps of the rows' dtype at the size of the
    best logit."""
    ctx = [int(t) for t in context]
    if len(ctx) < 3:
        raise ValueError("row_spread needs a context of at least 3 tokens")
    model.reset(seed)
    prefill = model.logits(ctx, Tree.root_only(ctx[-1]), [0])
    dtype, eps, prefill = str(getattr(prefill, "dtype", "")), _eps(prefill), _numpy(prefill)[0]
    model.reset(seed)
    shapes = run_now(_step_and_trees(model, ctx, sizes, seed))
    step_row = shapes.pop("step")
    rows = {"prefill": prefill, **shapes}
    model.reset(seed)
    if batch_size > 1:
        rows.update(_in_a_batch(model, ctx, sizes, seed, batch_size))
    best = float(step_row.max())
    step = rounding_step(best, eps)
    return Spread(
        dtype=dtype, best_logit=best, step=step,
        steps={k: float(np.abs(r - step_row).max() / step) for k, r in rows.items()},
        same_argmax=all(int(r.argmax()) == int(step_row.argmax()) for r in rows.values()),
    )


def token_gap(model, context: Sequence[int], a: int, b: int) -> tuple[float, float, str]:
    """(gap, gap in rounding steps, dtype) between the target's logits of tokens `a` and `b` at
    `context`, from one pass over the whole context from an empty cache (the model is reset);
    the step is the dtype's at the size of the row's best logit. At a parting that rounding
    explains, `a` and `b` are the target's two best tokens and this is their top-2 gap; a
    token far down the row is far from the best one, however close the best two are."""
    ctx = [int(t) for t in context]
    model.reset()
    row = model.logits(ctx, Tree.root_only(ctx[-1]), [0])
    dtype, eps, values = str(getattr(row, "dtype", "")), _eps(row), _numpy(row)[0]
    model.reset()
    gap = float(abs(values[int(a)] - values[int(b)]))
    return gap, gap / rounding_step(float(values.max()), eps), dtype


MIN_TIE_STEPS = 2.0  # two best logits this close are a near-tie even where no spread shows


def near_tie_steps(spreads: Sequence[Spread], floor: float = MIN_TIE_STEPS) -> float:
    """The widest gap between two logits, in rounding steps, that pass shapes can flip: each
    of the two logits can move by up to the measured spread, so twice the largest spread (at least
    `floor`: the spread at one context misses what the cache entries carry from earlier passes
    of other shapes)."""
    return max([floor] + [2.0 * s.max_steps for s in spreads])


@dataclass(frozen=True)
class Parting:
    """Where a run parted from the reference at temperature 0, and whether rounding explains it."""

    position: int  # the first new token that differs
    # the target's logits of the two runs' tokens apart there (None: a run stopped early)
    gap: float | None
    gap_steps: float | None  # the same in rounding steps of the rows' dtype
    threshold_steps: float  # the widest gap rounding explains there (`near_tie_steps`)
    dtype: str | None

    @property
    def near_tie(self) -> bool:
        return self.gap_steps is not None and self.gap_steps <= self.threshold_steps


def explain_parting(model, prompt: Sequence[int], reference: Sequence[int],
                    tokens: Sequence[int], batch_size: int = 1) -> Parting | None:
    """None when `tokens` equal `reference`; else the parting: the gap between the target's
    logits of the two tokens at the context where they part (one fresh pass; at a near-tie, its
    two best) against twice the spread of that row between pass shapes
    measured there (`row_spread`; with `batch_size` above 1, a run decoded in batches of that
    many, the batched passes' shapes too). A run that only stopped early is never a near-tie."""
    at = parting(reference, tokens)
    if at is None:
        return None
    if at >= min(len(reference), len(tokens)):
        return Parting(at, None, None, MIN_TIE_STEPS, None)
    context = list(prompt) + list(reference[:at])
    gap, steps, dtype = token_gap(model, context, reference[at], tokens[at])
    spreads = [row_spread(model, context, batch_size=batch_size)] if len(context) >= 3 else []
    return Parting(at, gap, steps, near_tie_steps(spreads), dtype)


def parting(reference: Sequence[int], tokens: Sequence[int]) -> int | None:
    """The first position where `tokens` differ from `reference` (a shorter run parts where it
    stops), or None when they are equal."""
    n = min(len(reference), len(tokens))
    at = next((i for i in range(n) if reference[i] != tokens[i]), n)
    return None if at == n and len(reference) == len(tokens) else at


def drift_summary(records: Sequence[dict]) -> list[dict]:
    """One row per (dtype, decoder) from records {dtype, decoder, parting: Parting or None}:
    runs, runs identical to the reference, partings at a near-tie (rounding explains them),
    partings beyond one, the largest gap at a parting in rounding steps and the earliest
    parting."""
    groups: dict[tuple, list] = {}
    for r in records:
        groups.setdefault((r["dtype"], r["decoder"]), []).append(r["parting"])
    out = []
    for (dtype, decoder), partings in groups.items():
        parted = [p for p in partings if p is not None]
        gaps = [p.gap_steps for p in parted if p.gap_steps is not None]
        out.append({
            "dtype": dtype,
            "decoder": decoder,
            "runs": len(partings),
            "identical": len(partings) - len(parted),
            "near_tie": sum(p.near_tie for p in parted),
            "beyond": sum(not p.near_tie for p in parted),
            "max_gap_steps": max(gaps) if gaps else None,
            "first_parting": min((p.position for p in parted), default=None),
        })
    return out


def drift_markdown(summary: Sequence[dict]) -> str:
    lines = [
        "| dtype | decoder | runs | identical | parted at a near-tie | parted beyond | largest "
        "gap at a parting (steps) | earliest parting |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        gap = "-" if s["max_gap_steps"] is None else f"{s['max_gap_steps']:.1f}"
        first = "-" if s["first_parting"] is None else str(s["first_parting"])
        lines.append(f"| {s['dtype']} | {s['decoder']} | {s['runs']} | {s['identical']} | "
                     f"{s['near_tie']} | {s['beyond']} | {gap} | {first} |")
    return "\n".join(lines)
