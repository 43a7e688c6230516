"""Decoders on one prompt, side by side (what `targetrows compare` prints).

Per decoder: new tokens, tokens/s, speedup over `ar`, tokens committed per round, accepted
draft tokens per round and mean non-root nodes verified. At temperature 0 every decoder must
reproduce `ar`'s tokens exactly (lossless); `lossless_report` says so, or fails if not. One
exception is explained rather than failed: in reduced precision a tree pass can round a row
differently from `ar`'s one-token step, so where the target's two best logits are closer than
that rounding can move them (measured there, `targetrows.bench.drift`) a decoder may take the
other one (a near-tie, not a bug).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping

from targetrows.bench.drift import explain_parting
from targetrows.core.rows import greedy
from targetrows.decoding.batch import generate_batch
from targetrows.decoding.budget import NO_TREE, NO_TREE_TEXT
from targetrows.decoding.config import DecodeConfig, condition_config
from targetrows.decoding.loop import DecodeResult, generate
from targetrows.decoding.registry import get_decoder


def decoder_configs(decoders, config: DecodeConfig, rerankers=None,
                    condition: tuple[int, int] | None = None) -> dict[str, DecodeConfig]:
    """{decoder: the config it runs with}: `config` with the decoder's own entry (a learned one
    with its rule's model from `rerankers`), a tree decoder at `condition` (budget, pool depth)
    where given, else at `config`'s budget; at (NO_TREE, NO_TREE), an `auto` pick of no tree,
    with ar's config (`condition_config`)."""
    configs = {name: config.for_decoder(name, rerankers) for name in decoders}
    if condition is None:
        return configs
    return {name: condition_config(c, *condition) for name, c in configs.items()}


def compare(target, draft, prompt_ids, configs: Mapping[str, DecodeConfig], progress=True):
    """{decoder: DecodeResult}, each decoder run once with its config (`decoder_configs`) on the
    same prompt and seed. At a config's `batch_size` N above 1 the decoder decodes N copies of
    the prompt at once (`batched_copies`)."""
    from tqdm import tqdm

    results = {}
    # a short warm-up so the first decoder does not pay for lazy initialisation
    for config in list(configs.values())[:1]:
        generate(target, None, prompt_ids,
                 dataclasses.replace(config, decoder="ar", max_new_tokens=2))
    for name, run in tqdm(configs.items(), desc="decoders", file=sys.stderr,
                          disable=not progress):
        use = draft if run.decoder.needs_draft else None  # no tree: ar's config, no draft
        results[name] = (generate(target, use, prompt_ids, run) if run.batch_size == 1 else
                         batched_copies(target, use, prompt_ids, run, run.batch_size))
    return results


def batched_copies(target, draft, prompt_ids, config: DecodeConfig, n: int) -> DecodeResult:
    """`n` copies of the prompt decoded at once with one seed, each to come out as the first. A
    copy may part only where the batch's shapes can round the rows either way: greedy, at a
    near-tie of batched passes (`drift.explain_parting`); sampling, in reduced precision (a
    draw near the edge of a token's share). That is printed; any other parting is an error.
    Returns the first copy's result with the batch's wall time divided by `n`, so its tokens/s
    is the batch's total throughput."""
    start = time.perf_counter()
    copies = generate_batch(target, draft, [list(prompt_ids)] * n, config, n)
    wall = time.perf_counter() - start
    dtype = str(getattr(target, "dtype", ""))
    for i, copy in enumerate(copies[1:], 1):
        if copy.tokens == copies[0].tokens:
            continue
        message = (f"{config.name}: copy {i} of the prompt in a batch of {n} parted from copy 0 "
                   "under the same seed")
        if greedy(config.temperature):
            p = explain_parting(target, prompt_ids, copies[0].tokens, copy.tokens, batch_size=n)
            rounding = p.near_tie
            why = (f"at new token {p.position}, a near-tie ({p.gap_steps:.1f} rounding steps of "
                   f"{p.dtype}; the batch's passes move them by up to "
                   f"{p.threshold_steps / 2:.1f})") if rounding else ""
        else:
            rounding = dtype not in ("torch.float32", "torch.float64")
            why = f"sampling in {dtype}: a draw at the edge of a token's share"
        if not rounding:
            raise RuntimeError(message + "; a sequence's tokens must not depend on its batch "
                               "(please report this)")
        print(f"{message}, {why}", file=sys.stderr)
    return dataclasses.replace(copies[0], wall_time=wall / n)


def table_rows(results, configs: Mapping[str, DecodeConfig] | None = None) -> list[dict]:
    """A row per decoder; with the `configs` they ran with, each tree decoder's budget and pool
    depth (NO_TREE for one that ran as ar: an `auto` pick of no tree)."""
    base = results.get("ar")
    rows = []
    for name, res in results.items():
        s = res.summary()
        speed = s["tokens_per_s"]
        rows.append({
            "decoder": name,
            **({} if configs is None else _condition(name, configs[name])),
            "new_tokens": s["new_tokens"],
            "tokens_per_s": speed,
            "speedup": speed / base.summary()["tokens_per_s"] if base else float("nan"),
            "tokens_per_round": s["mean_committed"],
            "accepted_per_round": s["mean_accepted"],
            "mean_nodes": s["mean_nodes"],
        })
    return rows


def _condition(name: str, config: DecodeConfig) -> dict:
    if config.decoder.drafts:
        return {"budget": config.budget, "depth": config.pool.depth}
    no_tree = get_decoder(name).drafts  # a tree decoder that ran with ar's config
    return {"budget": NO_TREE if no_tree else None, "depth": NO_TREE if no_tree else None}


def _budget_cell(budget) -> str:
    return "-" if budget is None else NO_TREE_TEXT if budget == NO_TREE else str(budget)


def format_table(rows: list[dict]) -> str:
    """The rows as a text table; with a budget column where they hold one (`table_rows` given
    the configs)."""
    budgets = all("budget" in r for r in rows)
    head = ("decoder", *(("budget",) if budgets else ()), "new tokens", "tokens/s", "speedup",
            "tokens/round", "accepted/round", "mean nodes")
    lines = ["  ".join(f"{h:>14}" for h in head)]
    for r in rows:
        lines.append("  ".join([
            f"{r['decoder']:>14}", *((f"{_budget_cell(r['budget']):>14}",) if budgets else ()),
            f"{r['new_tokens']:>14d}", f"{r['tokens_per_s']:>14.1f}",
            f"{r['speedup']:>13.2f}x", f"{r['tokens_per_round']:>14.2f}",
            f"{r['accepted_per_round']:>14.2f}", f"{r['mean_nodes']:>14.1f}",
        ]))
    return "\n".join(lines)


def lossless_report(target, prompt_ids, results, batch_size: int = 1) -> tuple[int, list[str]]:
    """(exit status, lines) of the temperature-0 check against `ar`: 0 when every decoder
    reproduced ar's tokens or parted from them only at a near-tie (`drift.explain_parting`: the
    target's logits of the two tokens closer there than rounding between pass shapes, batched
    ones at `batch_size` above 1, can move them); 1 otherwise."""
    status, lines = 0, []
    reference = results["ar"].tokens
    for name, res in results.items():
        p = explain_parting(target, prompt_ids, reference, res.tokens, batch_size)
        if p is None:
            continue
        at = p.position
        where = (f"{name} parts from ar at new token {at} ({res.tokens[at:at + 1]} vs "
                 f"{reference[at:at + 1]})")
        if p.near_tie:
            lines.append(f"near-tie: {where}, where the target's logits of the two are "
                         f"{p.gap:.3g} apart ({p.gap_steps:.1f} rounding steps of {p.dtype}; "
                         f"passes of other shapes move them by up to {p.threshold_steps / 2:.1f}"
                         "): the tree pass and ar's one-token step rounded them differently; "
                         "use --dtype float32 for an exact check")
        else:
            gap = "" if p.gap is None else (f"; the target's logits of the two are {p.gap:.3g} "
                                            f"apart ({p.gap_steps:.1f} rounding steps of "
                                            f"{p.dtype})")
            lines.append(f"LOSSLESS CHECK FAILED: {where}{gap}")
            status = 1
    if not lines:
        lines.append("temperature 0: every decoder reproduced ar's tokens exactly")
    return status, lines
