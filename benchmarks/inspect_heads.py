"""`targetrows inspect-head` on the paper's three published heads, as the scaled-down fixtures of
tests/published_heads.py (their published config.json keys and tensor names, random weights,
hidden size 64, 120 of 272 tokens) against an 8-layer tiny target, and on any trained head
given; the outputs as Markdown (docs/eagle3.md links the report).

    python benchmarks/inspect_heads.py --head resources/models/smollm2-135m-eagle3 \
        --target resources/models/smollm2-135m-instruct --out benchmarks/results/inspect_heads.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from report_out import emit

TESTS = Path(__file__).resolve().parents[1] / "tests"


def inspect(head: str, target: str, *extra: str, cwd: str | None = None) -> str:
    argv = ["targetrows", "inspect-head", head, "--target", target, *extra]
    out = subprocess.run([sys.executable, "-m", "targetrows.cli", *argv[1:]], cwd=cwd,
                         capture_output=True, text=True, check=False)
    if out.returncode not in (0, 1):  # 1: the head does not fit (the output says why)
        raise SystemExit(out.stderr)
    return "```\n$ " + " ".join(argv) + "\n" + out.stdout.rstrip("\n") + "\n```\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head", default=None, help="also inspect this head (a folder)")
    p.add_argument("--target", default=None, help="the target --head is for")
    p.add_argument("--out", default=None, help="Markdown file (default: print only)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    import published_heads
    import tiny_models

    parts = []
    with tempfile.TemporaryDirectory() as work:
        tiny_models.save_tiny(os.path.join(work, "tiny-target"), "llama", seed=2, n_layers=8)
        for name in ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "WhiFlash/Qwen3-4B-EAGLE3",
                     "Tengyunw/qwen3_8b_eagle3"):
            published_heads.write(os.path.join(work, "published", name), name)
            parts.append(inspect(f"published/{name}", "tiny-target", "--no-weights", cwd=work))
    if args.head:
        parts.append(inspect(args.head, args.target or args.head, "--no-weights"))
    text = "\n".join(parts)
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
