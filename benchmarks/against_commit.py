"""This checkout's decoding speed against another commit's, on the same machine in one run:
`targetrows bench` of each, taking turns (A B A B ...), so that the machine's drift falls on
both alike. Each run is a process of its own with its code first on the path
(`PYTHONPATH=<checkout>/src`); tokens/s of a decoder is its new tokens over its wall time,
all prompts together, and the figure quoted is the median over the runs, with new / old per
pair of runs.

    git worktree add ../old <commit>
    python benchmarks/against_commit.py --old ../old --target T --draft D \
        --prompts config/prompts/*.jsonl --out benchmarks/results/against_<commit>.md

Settings (each a bench of its own): batch 1, `ar` and `draft_rank` at --budget; and batch 8,
`ar` alone; each in every --dtype.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = (("batch 1", ["ar", "draft_rank"], 1), ("batch 8", ["ar"], 8))


def bench_once(checkout: Path, args, dtype: str, decoders: list[str], batch: int,
               out_dir: str) -> dict[str, float]:
    """tokens/s per decoder of one `targetrows bench` run of `checkout`'s code."""
    env = dict(os.environ, PYTHONPATH=str(checkout / "src"), OMP_NUM_THREADS=str(args.threads))
    command = [sys.executable, "-m", "targetrows.cli", "bench", "--target", args.target,
               "--draft", args.draft, "--prompts", *args.prompts, "--num-prompts",
               str(args.num_prompts), "--decoders", *decoders, "--budget", str(args.budget),
               "--max-new-tokens", str(args.max_new_tokens), "--temperature", "0", "--no-hf",
               "--dtype", dtype, "--batch-size", str(batch), "--threads", str(args.threads),
               "--out-dir", out_dir, "--name", "run"]
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    made, seconds = {}, {}
    with open(os.path.join(out_dir, "run.csv")) as f:
        for row in csv.DictReader(f):
            method = row["method"]
            made[method] = made.get(method, 0) + int(row["new_tokens"])
            seconds[method] = seconds.get(method, 0.0) + float(row["wall_time"])
    return {m: made[m] / seconds[m] for m in made}


def compare(args) -> list[str]:
    """The report's table rows: each setting, dtype and decoder, old and new medians."""
    rows = []
    for dtype in args.dtype:
        for label, decoders, batch in SETTINGS:
            runs = {"old": [], "new": []}
            for _ in range(args.repeats):
                for side, checkout in (("old", args.old), ("new", HERE.parent)):
                    with tempfile.TemporaryDirectory() as out:
                        runs[side].append(bench_once(checkout, args, dtype, decoders, batch,
                                                     out))
            for method in runs["new"][0]:
                old = [r[method] for r in runs["old"]]
                new = [r[method] for r in runs["new"]]
                ratios = [n / o for n, o in zip(new, old, strict=True)]
                rows.append(f"| {label} | {dtype} | {method} | {statistics.median(old):.1f} | "
                            f"{statistics.median(new):.1f} | {statistics.median(ratios):.3f} "
                            f"({min(ratios):.3f}-{max(ratios):.3f}) |")
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


def _machine() -> str:
    """The CPU's name and core count, and the instruction set torch's kernels use here."""
    import torch

    name = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{name} ({os.cpu_count()} CPUs, torch {torch.__version__} kernels "
            f"{torch.backends.cpu.get_cpu_capability()})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", type=Path, required=True, help="the other commit's checkout")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--prompts", nargs="+", required=True)
    p.add_argument("--num-prompts", type=int, default=7)
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", nargs="+", default=["float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    old = subprocess.run(["git", "-C", str(args.old), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    new = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    start = time.time()
    rows = compare(args)
    text = "\n".join([
        f"# Decoding speed: {new} against {old}", "",
        f"`python benchmarks/against_commit.py` on {_machine()}, {args.threads} threads, "
        f"{args.num_prompts} prompts of "
        f"{' '.join(Path(p).name for p in args.prompts)}, greedy, {args.max_new_tokens} new "
        f"tokens, budget {args.budget}, draft {Path(args.draft).name}; {args.repeats} runs of "
        f"each, taking turns; {time.time() - start:.0f} s in all.", "",
        "| setting | dtype | decoder | old tokens/s | new tokens/s | new / old (range) |",
        "|---|---|---|---|---|---|", *rows, ""])
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
