"""The rules at batch sizes 1, 2, 4, 8 and 16: throughput of every decoder decoding the prompts
N at a time (`targetrows bench --batch-size N`, `targetrows.bench.batched`), the budget the cost
model picks at each N, and each rule's gain over draft_rank (EAGLE-2) at the same N.

At batch N a verify pass holds N x nodes tokens, so a node costs more of the round as N grows:
the question is whether the target-row rules' advantage, largest at small budgets at batch 1,
holds where serving runs. Each batch size runs every method over the same prompts (the first
turn of the first --per-file questions of each prompts file), greedy, beside Hugging Face's
batched `generate()`.

    python benchmarks/batch_sweep.py --target resources/models/smollm2-135m-instruct \
        --draft resources/models/smollm2-135m-eagle3 --prompts config/prompts/*.jsonl \
        --out benchmarks/results/batch_sweep.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from report_out import emit

from targetrows.bench.batched import run_batched_bench
from targetrows.bench.plan import BenchPrompt, BenchSettings
from targetrows.core.pool import PoolShape
from targetrows.decoding.budget import Auto, parse_budget
from targetrows.decoding.config import DecodeConfig
from targetrows.hf.loading import load_pair
from targetrows.specbench.chat import encode_conversation, stop_ids
from targetrows.specbench.questions import read_questions

BASELINE = "draft_rank"


def prompts_of(files, per_file: int, tokenizer) -> list[BenchPrompt]:
    out = []
    for path in files:
        for q in read_questions(path)[:per_file]:
            ids = encode_conversation(tokenizer, [("user", q.turns[0])])
            out.append(BenchPrompt(str(q.question_id), q.category, tuple(ids)))
    return out


def sweep(target, draft, prompts, settings, batch_sizes, runs=1) -> dict[int, list[dict]]:
    rows = {}
    for n in batch_sizes:
        t = time.perf_counter()
        rows[n] = run_batched_bench(target, draft, prompts, settings.at_batch_size(n),
                                    runs=runs)
        print(f"batch {n}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return rows


def tables(rows: dict[int, list[dict]], auto: bool) -> str:
    sizes = list(rows)
    methods = [r["method"] for r in rows[sizes[0]]]
    by = {(n, r["method"]): r for n in sizes for r in rows[n]}
    head = "| method | " + " | ".join(f"N={n}" for n in sizes) + " |"
    rule = "|---|" + "---|" * len(sizes)
    ran = ("the cost model picked at that batch size" if auto else
           "each tree decoder ran at")
    out = [f"Total tokens/s (budget and pool depth {ran}):", "", head, rule]
    for m in methods:
        cells = []
        for n in sizes:
            r = by[n, m]
            pick = f" ({r['budget']}, d{r['depth']})" if r["budget"] != "" else ""
            cells.append(f"{r['tokens_per_s']:.1f}{pick}")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    out += ["", f"Each decoder over {BASELINE} at the same batch size (tokens/s ratio) and over "
            "Hugging Face's batched generate:", "", head, rule]
    for m in methods:
        cells = []
        for n in sizes:
            r, base = by[n, m], by.get((n, BASELINE))
            over = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
            cells.append(f"{over:.2f} / {r['x_hf_generate']:.2f}")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    out += ["", "Tokens per round, sequences per batched pass, and the share of prompts whose "
            "tokens equal ar's at that batch size:", "", head, rule]
    for m in methods:
        cells = []
        for n in sizes:
            r = by[n, m]
            tpr = r.get("tokens_per_round")
            cells.append("-" if tpr is None else
                         f"{tpr:.2f}, {r['sequences_per_pass']:.1f}, {r.get('same_as_ar', 1):.2f}")
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    out += ["", "Median per-sequence latency, seconds:", "", head, rule]
    for m in methods:
        out.append(f"| {m} | " + " | ".join(f"{by[n, m]['latency_median_s']:.1f}"
                                            for n in sizes) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("--per-file", type=int, default=3, help="first questions of each file")
    parser.add_argument("--decoders", nargs="+",
                        default=["ar", "draft_rank", "rerank", "fts", "pearl"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--budget", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=PoolShape().top_k)
    parser.add_argument("--depth", type=int, default=PoolShape().depth)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs of every method, in turn; each row is its median run")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    target, draft, tokenizer = load_pair(args.target, args.draft, "cpu", dtype=args.dtype)
    prompts = prompts_of(args.prompts, args.per_file, tokenizer)
    decode = DecodeConfig(max_new_tokens=args.max_new_tokens,
                          pool=PoolShape(top_k=args.top_k, depth=args.depth),
                          stop_ids=frozenset(stop_ids(tokenizer, target)))
    settings = BenchSettings(decode=decode, decoders=tuple(args.decoders), temperatures=(0.0,),
                             budget=parse_budget(args.budget, "--budget"))
    start = time.perf_counter()
    rows = sweep(target, draft, prompts, settings, args.batch_sizes, args.runs)
    command = " ".join(sys.argv[1:] if argv is None else argv)
    head = (f"# The rules at batch sizes {', '.join(map(str, args.batch_sizes))}\n\n"
            f"- command: `python benchmarks/batch_sweep.py {command}`\n"
            f"- date: {time.strftime('%Y-%m-%d')}; machine: {platform.platform()}; target "
            f"{target.dtype}; {len(prompts)} prompts ({args.per_file} per file), "
            f"{args.max_new_tokens} new tokens, greedy; top_k {args.top_k}, depth {args.depth}, "
            f"budget {args.budget}; each row the median of {args.runs} runs, the methods in "
            f"turn; {time.perf_counter() - start:.0f} s in all\n\n")
    emit(head + tables(rows, isinstance(settings.budget, Auto)), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
