"""`targetrows bench --batch-size N`: throughput of every decoder decoding N prompts at once,
against Hugging Face's batched `generate()` at the same batch size.

Serving decodes many sequences at once, and a verify pass then grows with batch x nodes, so
what a tree buys at batch 1 need not survive at N. Here every method decodes all the prompts,
N at a time, per temperature:

- **hf_generate**: the target's own batched `generate()` over N left-padded prompts (greedy, or
  pure sampling), batch after batch; a batch runs until its last sequence stops, and each of
  its sequences waits that long (its latency);
- **our decoders**: `targetrows.decoding.batch.generate_batch`, N lanes, a finished sequence's
  lane taking the next prompt at once; a sequence's latency is its own `generate` call's.

The table: total new tokens over total wall time (the batch's throughput), its ratio to
hf_generate's, per-sequence latency (median and max), tokens committed per round, the mean
number of sequences per batched pass (how full the batches ran), and at temperature 0 the share
of prompts whose tokens equal `ar`'s at the same batch size (every decoder is lossless, so any
parting is a near-tie of reduced precision; HF's padded rows round differently too).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np

from targetrows.bench.baselines import hf_generate_batch
from targetrows.core.atomic import atomic_write_text
from targetrows.core.rows import greedy
from targetrows.decoding.batch import generate_batch
from targetrows.decoding.budget import Fixed
from targetrows.decoding.model import synchronize
from targetrows.decoding.registry import get_decoder
from targetrows.decoding.schedule import BatchStats

from .plan import measure, pick_budgets
from .report import budget_cell, csv_text


def run_batched_bench(target, draft, prompts: Sequence, settings, progress=None,
                      runs: int = 1) -> list[dict]:
    """One row per method and temperature (see the module docstring), at the batch size
    `settings.decode.batch_size`. With `--budget auto` each decoder runs the budget and depth
    the cost model picks for this batch size, from passes timed batched (`measure`), and its
    row holds the throughput that pick predicted; a pick of no tree runs as ar (budget and
    depth 0). `runs`: every method decodes the prompts that many times, the methods in turn
    (a slow spell of a shared machine then slows one run of each, not every run of one), and
    its row is its run of median wall time."""
    batch_size = settings.decode.batch_size
    ids = [list(p.ids) for p in prompts]
    methods = (["hf_generate"] if settings.hf else []) + list(settings.decoders)
    choices = {}
    if isinstance(settings.budget, Fixed):
        plans = {(m, t): (settings.budget.nodes if get_decoder(m).drafts else None,
                          settings.pool.depth)
                 for m in settings.decoders for t in settings.temperatures}
    else:
        parts = measure(target, draft, prompts, settings)
        plans, choices = pick_budgets(target, draft, prompts, settings, parts)
        for (method, temp), choice in choices.items():  # no tree: the best tree it rejected
            print(f"{method}, T={temp:g}: {choice.describe()}", file=sys.stderr)
    for method in methods:  # warm-up: lazy initialisation is nobody's cost
        _run(method, target, draft, ids[:batch_size], settings, settings.temperatures[0], 2,
             batch_size, plans.get((method, settings.temperatures[0])))
    rows = []
    for temp in settings.temperatures:
        done, timed = {}, {m: [] for m in methods}
        for _ in range(runs):
            for method in methods:
                timed[method].append(_run(method, target, draft, ids, settings, temp, None,
                                          batch_size, plans.get((method, temp))))
        for method in methods:
            by_wall = sorted(timed[method], key=lambda run: run[2])
            tokens, latency, wall, results, stats = by_wall[(len(by_wall) - 1) // 2]
            done[method] = tokens
            rows.append(_row(method, temp, plans.get((method, temp)), batch_size, tokens,
                             latency, wall, results, stats, choices.get((method, temp))))
            if progress is not None:
                progress(rows[-1])
        base = next((r for r in rows[-len(methods):] if r["method"] == "hf_generate"), None)
        for row in rows[-len(methods):]:
            row["x_hf_generate"] = (row["tokens_per_s"] / base["tokens_per_s"]
                                    if base else float("nan"))
            if greedy(temp) and "ar" in done:
                same = [a == b for a, b in zip(done[row["method"]], done["ar"], strict=True)]
                row["same_as_ar"] = float(np.mean(same))
    return rows


def _run(method, target, draft, ids, settings, temperature, max_new_tokens, batch_size, plan):
    """(tokens per prompt, latency per prompt, wall seconds, DecodeResults or None, stats) of
    one method over every prompt; `plan`: our decoder's (budget, depth)."""
    decode = settings.decode
    new = max_new_tokens or decode.max_new_tokens
    start = time.perf_counter()
    if method == "hf_generate":
        tokens, latency = [], []
        for at in range(0, len(ids), batch_size):
            t = time.perf_counter()
            part = hf_generate_batch(target.model, ids[at : at + batch_size], temperature, new,
                                     decode.stop_ids, decode.seed + at, target.vocab_size)
            synchronize(target)
            tokens += part
            latency += [time.perf_counter() - t] * len(part)
        return tokens, latency, time.perf_counter() - start, None, None
    budget, depth = plan
    configs = [settings.run_config(method, temperature, budget, depth, decode.seed + i, new)
               for i in range(len(ids))]
    stats = BatchStats()
    results = generate_batch(target, draft, ids, configs, batch_size, stats)
    synchronize(target)
    wall = time.perf_counter() - start
    return [r.tokens for r in results], [r.wall_time for r in results], wall, results, stats


def _row(method, temperature, plan, batch_size, tokens, latency, wall, results, stats, choice):
    total = sum(len(t) for t in tokens)
    budget, depth = plan if plan is not None and plan[0] is not None else ("", "")
    row = {"method": method, "temperature": temperature, "batch_size": batch_size,
           "budget": budget, "depth": depth,
           "prompts": len(tokens), "new_tokens": total, "wall_time": wall,
           "tokens_per_s": total / wall if wall > 0 else 0.0,
           "latency_median_s": float(np.median(latency)), "latency_max_s": float(max(latency))}
    if results is not None:
        rounds = [r for res in results for r in res.rounds]
        row["tokens_per_round"] = float(np.mean([r.committed for r in rounds]))
        row["mean_nodes"] = float(np.mean([r.nodes for r in rounds]))
        row["sequences_per_pass"] = stats.mean_batch if stats.passes else 1.0
    if choice is not None:  # the pick's predicted tokens/s per sequence, times the batch
        predicted = batch_size * choice.predicted_tokens_per_s
        row["predicted_tokens_per_s"] = predicted
        row["measured_over_predicted"] = row["tokens_per_s"] / predicted
    return row


def markdown(head: dict, rows: list[dict]) -> str:
    lines = [f"# targetrows bench at batch size {rows[0]['batch_size']}", ""]
    lines += [f"- {k}: {v}" for k, v in head.items()]
    lines += ["", "Throughput is the total of new tokens over the wall time of decoding every "
              "prompt; latency is each sequence's, from its start to its last token. "
              "Sequences per pass: how many sequences the batched passes held on average.",
              ""]
    for temp in dict.fromkeys(r["temperature"] for r in rows):
        lines += [f"## temperature {temp}", "",
                  "| method | budget | depth | tokens/s | x HF generate | latency median (s) | "
                  "latency max (s) | tokens/round | sequences per pass | same as ar | "
                  "measured / predicted |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["temperature"] == temp):
            lines.append("| " + " | ".join([
                r["method"], budget_cell(r["budget"]), str(r["depth"]), f"{r['tokens_per_s']:.1f}",
                f"{r['x_hf_generate']:.2f}", f"{r['latency_median_s']:.2f}",
                f"{r['latency_max_s']:.2f}", _num(r.get("tokens_per_round")),
                _num(r.get("sequences_per_pass")), _num(r.get("same_as_ar")),
                _num(r.get("measured_over_predicted"))]) + " |")
        lines.append("")
    return "\n".join(lines)


def _num(value) -> str:
    return "" if value is None else f"{value:.2f}"


def write(out_dir: str, name: str | None, rows: list[dict], head: dict) -> tuple[str, str]:
    """Write NAME.csv and NAME.md under out_dir (atomically); return their paths."""
    import os

    name = name or time.strftime(f"bench_batch{rows[0]['batch_size']}_%Y%m%d-%H%M%S")
    csv_path, md_path = (os.path.join(out_dir, f"{name}.{ext}") for ext in ("csv", "md"))
    atomic_write_text(csv_path, csv_text(rows))
    atomic_write_text(md_path, markdown(head, rows))
    return csv_path, md_path
