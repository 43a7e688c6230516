"""Where `--budget auto` should calibrate: its predicted tokens per round against what decoding
commits, for several placements of the calibration contexts.

`--budget auto` predicts acceptance at a few contexts along the target's greedy reply
(`targetrows.cost.calibration.acceptance_curve`). A reply's first tokens are its easiest to
guess, and what a draft gets right differs from task to task, so the placement matters. For
each placement this prints `draft_rank`'s predicted tokens per round at one budget and depth,
and the tokens per round measured by decoding the first `--num-prompts` prompts of each file
at that budget and depth (T=0).

    python benchmarks/calibration_spread.py --target RUN/resources/models/smollm2-135m-instruct \
        --draft RUN/resources/models/smollm2-135m-eagle3 --draft-lookup \
        --prompts config/prompts/*.jsonl --out benchmarks/results/calibration_spread.md
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from targetrows.cli.common import add_model_arguments, load_from_args
from targetrows.core.atomic import atomic_write_text
from targetrows.core.pool import PoolShape
from targetrows.cost.calibration import acceptance_curve
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.specbench.chat import encode_prompt, stop_ids
from targetrows.specbench.questions import read_questions

# (calibration prompts, contexts along each, greedy tokens between them)
PLACEMENTS = (("first file's first", 8, 4), ("each file's first", 2, 4),
              ("each file's first", 3, 12), ("each file's first", 8, 4))


@torch.inference_mode()
def predicted(target, draft, prompts, contexts: int, gap: int, budget: int, depth: int,
              top_k: int) -> float:
    """`draft_rank`'s predicted tokens per round, averaged over `prompts` (as `auto_budget`)."""
    return float(np.mean([
        acceptance_curve(target, draft, p, [budget],
                         DecodeConfig("draft_rank", pool=PoolShape(top_k, depth)), contexts,
                         gap=gap)[0][0] for p in prompts]))


@torch.inference_mode()
def measured(target, draft, prompts, config: DecodeConfig) -> float:
    """Tokens committed per round by decoding every prompt."""
    tokens = rounds = 0
    for p in prompts:
        result = generate(target, draft, p, config)
        tokens += len(result.tokens)
        rounds += len(result.rounds)
    return tokens / rounds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--prompts", nargs="+", required=True, help="Spec-Bench question files")
    p.add_argument("--num-prompts", type=int, default=3, help="prompts per file decoded")
    p.add_argument("--budget", type=int, default=4)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--top-k", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="write the Markdown table here too")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, draft, tokenizer = load_from_args(args)
    files = [[encode_prompt(tokenizer, q.turns[0]) for q in read_questions(path)[:args.num_prompts]]
             for path in args.prompts]
    firsts = [f[0] for f in files]
    config = DecodeConfig("draft_rank", budget=args.budget,
                          max_new_tokens=args.max_new_tokens,
                          stop_ids=frozenset(stop_ids(tokenizer, target)),
                          pool=PoolShape(top_k=args.top_k, depth=args.depth))
    decoded = measured(target, draft, [q for f in files for q in f], config)
    lines = ["| calibration prompts | contexts along each | tokens apart | predicted tokens / round |",
             "|---|---|---|---|"]
    for which, contexts, gap in PLACEMENTS:
        prompts = firsts[:1] if which.startswith("first file") else firsts
        value = predicted(target, draft, prompts, contexts, gap, args.budget, args.depth,
                          args.top_k)
        lines.append(f"| {which} | {contexts} | {gap} | {value:.2f} |")
    text = (f"`draft_rank` at B={args.budget}, depth {args.depth}, top_k {args.top_k}: tokens per "
            f"round predicted by `--budget auto`'s calibration against {decoded:.2f} measured on "
            f"{sum(map(len, files))} prompts ({args.num_prompts} of each file, "
            f"{args.max_new_tokens} new tokens, T=0).\n\n"
            f"- command: `python benchmarks/calibration_spread.py {' '.join(argv or sys.argv[1:])}`"
            "\n\n" + "\n".join(lines) + "\n")
    print(text)
    if args.out:
        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
