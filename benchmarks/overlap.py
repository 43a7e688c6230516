"""The root pass beside drafting against one after the other, on a real pair: each part of a
round for every decoder with a root pass (`targetrows.bench.overlap`), the drafts' and the
target's passes on one device.

    python benchmarks/overlap.py --target resources/models/smollm2-135m-instruct \
        --draft resources/models/smollm2-135m-eagle3 --prompts config/prompts/*.jsonl \
        --out benchmarks/results/overlap_cpu.md

The draft is a standalone model or an EAGLE-3 head (`load_pair` tells them apart). Prompts: the
first turn of the first --per-file questions of each file, greedy. On a GPU the same table comes
from `benchmarks/gpu_check.py` (random weights at the paper's shapes).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from batch_sweep import prompts_of
from report_out import emit

from targetrows.bench.overlap import measure_overlap, overlap_markdown, root_pass_decoders
from targetrows.core.pool import PoolShape
from targetrows.decoding.config import DecodeConfig
from targetrows.hf.loading import load_pair
from targetrows.specbench.chat import stop_ids


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--per-file", type=int, default=1, help="first questions of each file")
    parser.add_argument("--decoders", nargs="+", default=root_pass_decoders())
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    target, draft, tokenizer = load_pair(args.target, args.draft, args.device, dtype=args.dtype)
    prompts = [p.ids for p in prompts_of(args.prompts, args.per_file, tokenizer)]
    config = DecodeConfig(budget=args.budget, max_new_tokens=args.max_new_tokens,
                          pool=PoolShape(), stop_ids=frozenset(stop_ids(tokenizer, target)))
    start = time.perf_counter()
    rows = measure_overlap(target, draft, prompts, config, args.decoders)
    command = " ".join(sys.argv[1:] if argv is None else argv)
    head = (f"- command: `python benchmarks/overlap.py {command}`\n"
            f"- date: {time.strftime('%Y-%m-%d')}; machine: {platform.platform()}, "
            f"{args.device}; target {target.dtype}; {len(prompts)} prompts, "
            f"{args.max_new_tokens} new tokens, greedy, budget {args.budget}, default pool; "
            f"{time.perf_counter() - start:.0f} s in all\n\n")
    title = f"Root pass alongside drafting on one device ({args.device})"
    heading, table = overlap_markdown(rows, title).split("\n\n", 1)
    emit(f"{heading}\n\n{head}{table}\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
