"""Temperature-0 drift: where a decoder's tokens part from the target's own greedy tokens, and
how close the target's two best logits were there.

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
- `near_tie_steps` turns a measured spread into the threshold `compare` and `bench` use;
- `drift_summary` is the table: per decoder, the prompts whose tokens equal the reference, and
  at each parting the gap of the two best logits in rounding steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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


def row_spread(model, context: Sequence[int], sizes: Sequence[int] = (2, 8, 32, 64),
               seed: int = 0) -> Spread:
    """The row at `context` as ar computes it (a one-token step on the cached context less its
    last token) against the same row from a prefill and as node 1 of tree passes of `sizes`
    nodes (on the cached context less its last token): the largest logit difference of each, in
    rounding steps of the rows' dtype at the size of the best logit."""
    ctx = [int(t) for t in context]
    if len(ctx) < 3:
        raise ValueError("row_spread needs a context of at least 3 tokens")
    rng = np.random.default_rng(seed)
    model.reset(seed)
    prefill = model.logits(ctx, Tree.root_only(ctx[-1]), [0])
    dtype, eps, prefill = str(getattr(prefill, "dtype", "")), _eps(prefill), _numpy(prefill)[0]
    model.reset(seed)
    model.logits(ctx[:-1], Tree.root_only(ctx[-2]), [0])
    model.commit(ctx[:-1])
    step_row = _numpy(model.logits(ctx, Tree.root_only(ctx[-1]), [0]))[0]
    model.commit(ctx[:-1])
    rows = {"prefill": prefill}
    for n in sizes:
        tree = _tree_with(ctx[-1], ctx[-2], int(n), model.vocab_size, rng)
        rows[f"tree {n}"] = _numpy(model.logits(ctx[:-1], tree, [1]))[0]
        model.commit(ctx[:-1])
    model.reset(seed)
    best = float(step_row.max())
    step = rounding_step(best, eps)
    return Spread(
        dtype=dtype, best_logit=best, step=step,
        steps={k: float(np.abs(r - step_row).max() / step) for k, r in rows.items()},
        same_argmax=all(int(r.argmax()) == int(step_row.argmax()) for r in rows.values()),
    )


def top2_gap(model, context: Sequence[int]) -> tuple[float, float, str]:
    """(gap, gap in rounding steps, dtype) of the target's two best logits at `context`, from
    one pass over the whole context from an empty cache (the model is reset)."""
    ctx = [int(t) for t in context]
    model.reset()
    row = model.logits(ctx, Tree.root_only(ctx[-1]), [0])
    dtype, eps, values = str(getattr(row, "dtype", "")), _eps(row), _numpy(row)[0]
    model.reset()
    second, best = np.sort(values)[-2:]
    gap = float(best - second)
    return gap, gap / rounding_step(float(best), eps), dtype


def near_tie_steps(spreads: Sequence[Spread], floor: float = 1.0) -> float:
    """The widest top-2 gap, in rounding steps, that pass shapes can flip: each of the two
    logits can move by up to the measured spread, so twice the largest spread (at least
    `floor`)."""
    return max([floor] + [2.0 * s.max_steps for s in spreads])


def parting(reference: Sequence[int], tokens: Sequence[int]) -> int | None:
    """The first position where `tokens` differ from `reference` (a shorter run parts where it
    stops), or None when they are equal."""
    n = min(len(reference), len(tokens))
    at = next((i for i in range(n) if reference[i] != tokens[i]), n)
    return None if at == n and len(reference) == len(tokens) else at


def drift_summary(records: Sequence[dict], threshold: float) -> list[dict]:
    """One row per (dtype, decoder) from records {dtype, decoder, prompt, position (None when
    identical), steps (the top-2 gap at the parting, in rounding steps; None if unknown)}:
    prompts, prompts identical to the reference, partings within `threshold` steps (a near-tie
    that rounding explains), partings beyond it, and the largest gap at a parting."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["dtype"], r["decoder"]), []).append(r)
    out = []
    for (dtype, decoder), rs in groups.items():
        parted = [r for r in rs if r["position"] is not None]
        gaps = [r["steps"] for r in parted if r["steps"] is not None]
        out.append({
            "dtype": dtype,
            "decoder": decoder,
            "prompts": len(rs),
            "identical": len(rs) - len(parted),
            "near_tie": sum(1 for g in gaps if g <= threshold),
            "beyond": sum(1 for r in parted if r["steps"] is None or r["steps"] > threshold),
            "max_gap_steps": max(gaps) if gaps else None,
            "first_parting": min((r["position"] for r in parted), default=None),
        })
    return out


def drift_markdown(summary: Sequence[dict], threshold: float) -> str:
    lines = [
        f"| dtype | decoder | prompts | identical | parted at a near-tie (<= {threshold:.1f} "
        "steps) | parted beyond | largest gap at a parting (steps) | earliest parting |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        gap = "-" if s["max_gap_steps"] is None else f"{s['max_gap_steps']:.1f}"
        first = "-" if s["first_parting"] is None else str(s["first_parting"])
        lines.append(f"| {s['dtype']} | {s['decoder']} | {s['prompts']} | {s['identical']} | "
                     f"{s['near_tie']} | {s['beyond']} | {gap} | {first} |")
    return "\n".join(lines)
