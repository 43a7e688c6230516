"""First-token sampling against PEARL at B=59 on a toy pair whose draft guesses t0 most of the
time: the paper's regime, offline (row logs) and online (the decoders), with 95% bootstrap CIs
resampled by prompt; and the cost of verifying an empty tree after t0 (`verify_empty`).

    python benchmarks/toy_first_token.py      # writes benchmarks/results/toy_first_token.md

The toy pair (vocab 64, logit scale 3, draft closeness 0.9) puts the target's t0 among the
draft's 10 first-level pool tokens about 85% of the time at temperature 1, as a good draft does.
The time per round in the last table comes from the cost model with part times measured on the
embedded SmolLM2 pair on a 2-core CPU (`targetrows bench`, 1 thread): the toy has no time.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from targetrows.analysis import stats
from targetrows.core.atomic import atomic_write_text
from targetrows.core.pool import PoolShape
from targetrows.core.toy import ToyPair
from targetrows.cost.parttimes import PartTimes, PassCurve
from targetrows.cost.rounds import round_seconds
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.decoding.registry import get_decoder
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.record import RecordConfig, record_prompt
from targetrows.rowlog.score import score_log

VOCAB, SCALE, CLOSENESS, TOP_K, DEPTH, BUDGET = 64, 3.0, 0.9, 10, 6, 59
# part times of the embedded pair with its distilled draft, measured by `targetrows bench` on plain
# linear layers (git history: benchmarks/results/bench_smollm2-135m_cpu_k2d4_idle_20261129.md)
TARGET_MS = {1: 73.3, 2: 78.3, 3: 83.0, 4: 119.6, 5: 124.1, 8: 151.8, 9: 154.4, 12: 177.5,
             13: 196.8, 14: 200.7, 15: 205.9}
DRAFT_MS = {1: 14.4, 2: 15.2, 4: 26.0}


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, 6).tolist() for _ in range(n)]


def offline(pair, ps, temperature, new):
    """Score table of pearl and first_token at B=59 on the target's own trajectories."""
    config = RecordConfig(temperature=temperature, stride=1,
                          max_new_tokens=new, root_top=VOCAB, seed=0,
                          pool=PoolShape(top_k=TOP_K, depth=DEPTH))
    segments = [dict(record_prompt(pair.target, pair.draft, p, config, seed=i),
                     question=f"p{i}", task="toy", turn=0) for i, p in enumerate(ps)]
    header = dict(temperature=float(temperature), depth=DEPTH, top_k=TOP_K, stride=1,
                  target="toy", draft="toy", complete=True)
    log = rowlog.from_segments(header, segments)
    return score_log(log, [BUDGET], rules=("pearl", "first_token"), pair="toy")


def online(pair, ps, temperature, new, verify_empty=True):
    """{decoder: [DecodeResult per prompt]} for pearl and fts at B=59."""
    out = {}
    for decoder in ("pearl", "fts"):
        config = DecodeConfig(decoder, budget=BUDGET, temperature=temperature, max_new_tokens=new,
                              verify_empty=verify_empty,
                              pool=PoolShape(top_k=TOP_K, depth=DEPTH))
        out[decoder] = [generate(pair.target, pair.draft, p, dataclasses.replace(config, seed=i))
                        for i, p in enumerate(ps)]
    return out


def online_table(results, temperature) -> dict:
    """Per-prompt accepted draft tokens and nodes per round as a stats table, for paired gains."""
    cols = {k: [] for k in ("pair", "task", "temperature", "prompt_id", "turn", "position",
                            "rule", "budget", "accepted", "nodes")}
    for decoder, runs in results.items():
        for i, res in enumerate(runs):
            n = len(res.rounds)
            for k, v in (("pair", "toy"), ("task", "toy"), ("temperature", temperature),
                         ("prompt_id", f"p{i}"), ("turn", 0), ("position", 0),
                         ("rule", decoder), ("budget", BUDGET),
                         ("accepted", sum(r.accepted for r in res.rounds) / n),
                         ("nodes", sum(r.nodes for r in res.rounds) / n)):
                cols[k].append(v)
    return {k: np.array(v, dtype=object if k in ("pair", "task", "prompt_id", "rule") else None)
            for k, v in cols.items()}


def gain_line(table, rule, base, metric) -> str:
    g = stats.paired_gain(table, rule, base, metric=metric, by=("temperature",), n_boot=2000)
    return (f"{100 * g['gain'][0]:+.1f}% [{100 * g['lo'][0]:+.1f}, {100 * g['hi'][0]:+.1f}]"
            f" ({g['n_prompts'][0]} prompts, {g['n_undefined'][0]} undefined replicates)")


def mean_of(table, rule, metric) -> float:
    return float(np.mean(table[metric][table["rule"] == rule].astype(float)))


def hit_rate(pair, ps, temperature) -> float:
    """Share of contexts along the target's trajectories where t0 is a first-level pool token."""
    hits = total = 0
    rng = np.random.default_rng(0)
    for p in ps:
        ctx = list(p)
        for _ in range(16):
            row = pair.target_row(ctx, temperature)
            t0 = int(row.argmax()) if temperature == 0 else int(rng.choice(VOCAB, p=row))
            top = np.argsort(-pair.draft_row(ctx), kind="stable")[:TOP_K]
            hits += t0 in top
            total += 1
            ctx.append(t0)
    return hits / total


def seconds_per_token(decoder, runs, verify_empty, overlap) -> float:
    """Cost-model seconds per committed token with the embedded pair's part times."""
    parts = PartTimes(PassCurve(tuple(TARGET_MS), tuple(v / 1e3 for v in TARGET_MS.values())),
                      PassCurve(tuple(DRAFT_MS), tuple(v / 1e3 for v in DRAFT_MS.values())), 88)
    rounds = [r for res in runs for r in res.rounds]
    depth = get_decoder(decoder).pool_depth(DEPTH, BUDGET)
    t = round_seconds(decoder, parts, [r.nodes for r in rounds], [r.draft_passes for r in rounds],
                      overlap, PoolShape(TOP_K, depth), BUDGET, verify_empty)
    return float(t.sum() / sum(r.committed for r in rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--out", default="benchmarks/results/toy_first_token.md")
    args = parser.parse_args()
    start = time.perf_counter()
    pair = ToyPair(VOCAB, seed=0, closeness=CLOSENESS, scale=SCALE)
    ps = prompts(args.prompts)
    lines = [
        "# First-token sampling vs PEARL on a toy pair (B=59)", "",
        f"Toy pair vocab {VOCAB}, logit scale {SCALE}, closeness {CLOSENESS}; pool top_k "
        f"{TOP_K} x depth {DEPTH}; {args.prompts} prompts x {args.new} new tokens; 95% "
        "bootstrap CIs resampled by prompt (`python benchmarks/toy_first_token.py`).", "",
        "| T | t0 in the pool's first level | offline nodes: pearl / first_token | offline "
        "accepted: pearl / first_token | offline gain | online nodes: pearl / fts | online "
        "accepted per round: pearl / fts | online gain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    policy = []
    for temperature in (0.0, 1.0):
        off = offline(pair, ps, temperature, args.new)
        runs = online(pair, ps, temperature, args.new)  # the default: verify_empty=True
        on = online_table(runs, temperature)
        lines.append(
            f"| {temperature:g} | {hit_rate(pair, ps, temperature):.0%} "
            f"| {mean_of(off, 'pearl', 'nodes'):.1f} / {mean_of(off, 'first_token', 'nodes'):.1f} "
            f"| {mean_of(off, 'pearl', 'accepted'):.3f} / "
            f"{mean_of(off, 'first_token', 'accepted'):.3f} "
            f"| {gain_line(off, 'first_token', 'pearl', 'accepted')} "
            f"| {mean_of(on, 'pearl', 'nodes'):.1f} / {mean_of(on, 'fts', 'nodes'):.1f} "
            f"| {mean_of(on, 'pearl', 'accepted'):.3f} / {mean_of(on, 'fts', 'accepted'):.3f} "
            f"| {gain_line(on, 'fts', 'pearl', 'accepted')} |")
        skipped = online(pair, ps, temperature, args.new, verify_empty=False)
        for decoder in ("fts", "pearl"):
            empty = np.mean([r.nodes == 0 for res in runs[decoder] for r in res.rounds])
            row = [f"{decoder}", f"{temperature:g}", f"{empty:.0%}"]
            for overlap in (0.0, 1.0):
                skip = seconds_per_token(decoder, skipped[decoder], False, overlap)
                verify = seconds_per_token(decoder, runs[decoder], True, overlap)
                row.append(f"{1e3 * skip:.1f} / {1e3 * verify:.1f}")
            policy.append("| " + " | ".join(row) + " |")
    lines += [
        "", "## An empty tree after t0: skip its verify pass, or verify it for the bonus token",
        "",
        "Cost-model milliseconds per committed token (skip / verify), with part times measured "
        "on the embedded pair (one device: no overlap; two devices: the root pass fully "
        "overlapped with drafting). Same toy runs as above.", "",
        "| decoder | T | rounds with an empty tree | one device | two devices |",
        "|---|---|---|---|---|", *policy, "",
        f"Total {time.perf_counter() - start:.0f} s.",
    ]
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
