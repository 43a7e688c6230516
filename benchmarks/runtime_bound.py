"""Does the wall time the pipeline asks a cluster for hold? The bound of
`targetrows.cost.job_time` (one token per round, each round as dear as it can be) against
decode jobs run as the pipeline runs them.

    python benchmarks/runtime_bound.py --target resources/models/smollm2-135m-instruct \
        --draft resources/models/smollm2-135m-eagle3 --prompts config/prompts/*.jsonl \
        --out benchmarks/results/runtime_bound.md

As the pipeline does: `targetrows part-times` times the pair, then each decoder's
`targetrows decode` job runs over the first --per-file questions of each file (both turns of a
two-turn one), each condition in --budgets, and its whole wall time (start, load, calibration,
decoding) is set against the bound, computed with margin 1 and no floor.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from report_out import emit

from targetrows.core.pool import PoolShape
from targetrows.cost.job_time import MeasuredPair, decode_minutes, decode_seconds, decode_work
from targetrows.decoding.budget import Fixed, parse_budget
from targetrows.decoding.registry import get_decoder
from targetrows.specbench.questions import read_questions


def cli(*args: str) -> float:
    """Seconds `targetrows ARGS` took as a process of its own (what a job runs)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "targetrows.cli", *args], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def first_questions(files, per_file: int, folder: str) -> list[str]:
    out = []
    for path in files:
        kept = os.path.join(folder, os.path.basename(path))
        with open(kept, "w", encoding="utf-8") as f:
            for q in read_questions(path)[:per_file]:
                f.write(json.dumps({"question_id": q.question_id, "category": q.category,
                                    "turns": q.turns}) + "\n")
        out.append(kept)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--per-file", type=int, default=2, help="first questions of each file")
    parser.add_argument("--decoders", nargs="+", default=["ar", "draft_rank", "fts", "racer"])
    parser.add_argument("--budgets", nargs="+", default=["16", "auto"])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="questions each decode job decodes at once (decode.batch_size)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    pool = PoolShape()
    budgets = [parse_budget(b, "--budgets") for b in args.budgets]
    fixed = [str(b.nodes) for b in budgets if isinstance(b, Fixed)]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        prompts = first_questions(args.prompts, args.per_file, work)
        parts_json = os.path.join(work, "parts.json")
        model = ["--target", args.target, "--dtype", args.dtype]
        parts_s = cli("part-times", *model, "--draft", args.draft, "--prompts", *prompts,
                      "--max-new-tokens", str(args.max_new_tokens), "--budgets", *fixed,
                      "--out", parts_json)
        with open(parts_json, encoding="utf-8") as f:
            pair = MeasuredPair.from_json(json.load(f))
        for name in args.decoders:
            decoder = get_decoder(name)
            draft = ["--draft", args.draft] if decoder.needs_draft else []
            conds = ["--budgets", *args.budgets] if decoder.drafts else []
            outs = [os.path.join(work, f"{name}-{i}.jsonl") for i in range(len(prompts))]
            actual = cli("decode", *model, *draft, "--prompts", *prompts, "--decoder", name,
                         *conds, "--max-new-tokens", str(args.max_new_tokens),
                         "--batch-size", str(args.batch_size), "--no-progress", "--out", *outs)
            job = decode_work(decoder, budgets if decoder.drafts else [], args.max_new_tokens,
                              pool, args.batch_size)
            bound = decode_seconds(pair, job) + pair.load_s
            rows.append((name, actual, bound, decode_minutes(pair, job)))
            print(f"{name}: {actual:.0f} s against a bound of {bound:.0f} s", file=sys.stderr)
    lines = [
        "# The runtime bound against decode jobs", "",
        f"- command: `python benchmarks/runtime_bound.py {' '.join(argv or sys.argv[1:])}`",
        f"- date: {time.strftime('%Y-%m-%d')}; machine: {platform.platform()}, "
        f"{os.cpu_count()} CPUs",
        f"- part times: {pair.turns} prompt turns, longest {pair.longest_turn} tokens; one-token "
        f"target pass {1e3 * float(pair.parts.target(1)):.1f} ms, prefill "
        f"{pair.prefill_s:.2f} s, load {pair.load_s:.1f} s; the part-times job took "
        f"{parts_s:.0f} s",
        f"- each job: every question's turns at each of the budgets {', '.join(args.budgets)} "
        f"(one run for a decoder without a tree), {args.max_new_tokens} new tokens, greedy, "
        f"batch size {args.batch_size}", "",
        "| decoder | job wall time (s) | bound (s) | job / bound | minutes asked (margin 1.5) |",
        "|---|---|---|---|---|"]
    for name, actual, bound, minutes in rows:
        lines.append(f"| {name} | {actual:.0f} | {bound:.0f} | {actual / bound:.2f} | "
                     f"{minutes} |")
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
