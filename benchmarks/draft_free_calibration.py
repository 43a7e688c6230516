"""How well the cost model's calibration of the draft-free decoders (racer, recycle) predicts
what they commit, budget by budget: `targetrows.cost.draft_free` (every budget's state side
by side along one decode of each prompt, their trees' union verified in one pass) against
decoding each prompt at each budget on its own.

The calibration runs over the first question of each prompts file, as `targetrows decode`
calibrates, once as far as the runs go (--max-new-tokens) and once over --short tokens (the
stretch the draft decoders' calibration covers); the decodes run on the same prompts, so the
difference is the method's, not the prompts'. Figures per round, each decode's last round (cut
at the token limit) left out.

    python benchmarks/draft_free_calibration.py --target resources/models/smollm2-135m-instruct \
        --prompts resources/prompts/*.jsonl --out benchmarks/results/draft_free_calibration.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import replace

import numpy as np
from report_out import emit

from targetrows.cost.draft_free import draft_free_curves
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.hf.loading import load_pair
from targetrows.specbench.chat import encode_conversation
from targetrows.specbench.questions import read_questions


def measured(target, prompts, config, budgets):
    """(committed, nodes) per round at each budget, each prompt decoded on its own."""
    committed, nodes = [], []
    for b in budgets:
        rounds = [r for p in prompts
                  for r in generate(target, None, p, replace(config, budget=b)).rounds[:-1]]
        committed.append(np.mean([r.committed for r in rounds]))
        nodes.append(np.mean([r.nodes for r in rounds]))
    return np.array(committed), np.array(nodes)


def report(target, prompts, decoders, budgets, max_new, short, temperature) -> str:
    lines = ["| decoder | figure | " + " | ".join(f"B={b}" for b in budgets) + " | seconds |",
             "|---|---|" + "---|" * (len(budgets) + 1)]
    for name in decoders:
        config = DecodeConfig(name, temperature=temperature, max_new_tokens=max_new)
        rows = []
        for label, tokens in ((f"calibrated over {max_new} tokens", max_new),
                              (f"calibrated over {short} tokens", short)):
            t = time.perf_counter()
            c, n = draft_free_curves(target, prompts, [config] * len(prompts), budgets, tokens)
            rows.append((label, c[0], n[0], time.perf_counter() - t))
        t = time.perf_counter()
        c, n = measured(target, prompts, config, budgets)
        rows.append(("decoded at each budget", c, n, time.perf_counter() - t))
        for label, c, n, seconds in rows:
            for what, values in (("committed", c), ("nodes", n)):
                cells = " | ".join(f"{v:.2f}" for v in values)
                lines.append(f"| {name} | {what}, {label} | {cells} | {seconds:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--prompts", nargs="+", required=True, help="prompts files (first question each)")
    parser.add_argument("--decoders", nargs="+", default=["racer", "recycle"])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    target, _, tokenizer = load_pair(args.target, None, "cpu", dtype=args.dtype)
    prompts = [encode_conversation(tokenizer, [("user", read_questions(p)[0].turns[0])])
               for p in args.prompts]
    table = report(target, prompts, args.decoders, args.budgets, args.max_new_tokens, args.short,
                   args.temperature)
    head = (f"# Draft-free calibration against decoding\n\n- command: `python "
            f"benchmarks/draft_free_calibration.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n"
            f"- machine: {platform.platform()}; target dtype {target.dtype}; "
            f"temperature {args.temperature}; {len(prompts)} prompts\n"
            "- committed: tokens per round; nodes: non-root nodes verified per round; seconds: "
            "what producing the row took\n\n")
    emit(head + table, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
