"""Does `torch.compile` speed the CPU passes? The embedded target's passes (a one-token step and
tree passes of 8 and 60 nodes on a cached context, `time_passes`) through the lean forward as it
runs today, and through `torch.compile` of it (inductor, `dynamic=True`: every pass has its own
shape), plus whether greedy `ar` and `fts` keep their tokens.

    python benchmarks/compile_cpu.py --target resources/models/smollm2-135m-instruct \
        --draft resources/models/smollm2-135m-eagle3 --out benchmarks/results/compile_cpu.md

Each mode's passes are timed interleaved (`time_passes`: each size once per repeat, median).
Compilation time is reported apart and not in the pass times; a compilation that takes longer
than --compile-limit is stopped and reported as such.
"""

from __future__ import annotations

import argparse
import platform
import signal
import sys
import time
from contextlib import contextmanager

import numpy as np
import torch
from report_out import emit

from targetrows.cost.parttimes import time_passes
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import generate
from targetrows.hf.loading import load_pair
from targetrows.specbench.chat import encode_conversation

SIZES = (1, 8, 60)


def compiled(target):
    """`target` with its lean forward run through `torch.compile`; the seconds the first
    passes took (compilation) are measured by the caller's warm-up."""
    lean = target.engine.lean
    if lean is None:
        raise SystemExit("compile_cpu: the target has no lean forward here (not a Llama, Qwen2 "
                         "or Qwen3 on the CPU)")
    call = type(lean).__call__
    fast = torch.compile(lambda *a: call(lean, *a), dynamic=True)
    lean.__class__ = type("CompiledLean", (type(lean),), {"__call__": lambda self, *a: fast(*a)})
    return target


@contextmanager
def deadline(seconds: float):
    """TimeoutError in the main thread once `seconds` have passed inside the block (compiling
    is Python, which a signal interrupts)."""
    def expire(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _timed_out(err: BaseException | None) -> bool:
    while err is not None:
        if isinstance(err, TimeoutError):
            return True
        err = err.__cause__ or err.__context__
    return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--compile-limit", type=float, default=600.0,
                   help="seconds the first compiled passes may take")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    start = time.perf_counter()
    target, draft, tokenizer = load_pair(args.target, args.draft, "cpu", dtype=args.dtype)
    rng = np.random.default_rng(0)
    context = rng.integers(1000, 20000, size=300).tolist()
    prompt = encode_conversation(tokenizer, [("user", "Name three colours and say why.")])
    rows, tokens, compile_note = {}, {}, ""
    for mode in ("eager", "compiled"):
        if mode == "compiled":
            t = time.perf_counter()
            compiled(target)
            try:
                with deadline(args.compile_limit):
                    time_passes(target, context, SIZES, repeats=1)  # compiles each shape
            except Exception as err:  # torch.compile refusing the forward is the finding
                if _timed_out(err):  # dynamo may wrap the deadline's error in its own
                    compile_note = (f"compiling the first passes did not finish in "
                                    f"{args.compile_limit:.0f} s; nothing compiled was timed")
                else:
                    first = (str(err).strip().splitlines() or [""])[0][:200]
                    compile_note = (f"compiling failed after {time.perf_counter() - t:.0f} s: "
                                    f"{type(err).__name__}: {first}; nothing compiled was timed")
                break
            compile_note = f"compile (first passes) {time.perf_counter() - t:.0f} s"
        rows[mode] = time_passes(target, context, SIZES, repeats=args.repeats)
        for name in ("ar", "fts"):
            config = DecodeConfig(decoder=name, budget=16, max_new_tokens=args.max_new_tokens)
            t = time.perf_counter()
            result = generate(target, draft if name != "ar" else None, prompt, config)
            tokens[mode, name] = (result.tokens, len(result.tokens) / (time.perf_counter() - t))
    lines = ["# torch.compile on the CPU passes\n",
             f"- command: `python benchmarks/compile_cpu.py {' '.join(sys.argv[1:])}`",
             f"- date: {time.strftime('%Y-%m-%d')}; machine: {platform.platform()}; torch "
             f"{torch.__version__}; {torch.get_num_threads()} threads; target {target.dtype}; "
             f"context 300 tokens; {args.repeats} repeats; {compile_note}; "
             f"{time.perf_counter() - start:.0f} s in all", "",
             "| passes | " + " | ".join(f"{n} fed" for n in SIZES) + " |",
             "|---|" + "---|" * len(SIZES)]
    for mode, curve in rows.items():
        lines.append(f"| {mode} | " + " | ".join(f"{s * 1e3:.1f} ms" for s in curve.seconds)
                     + " |")
    lines += ["", "| decoder | eager tokens/s | compiled tokens/s | same tokens |",
              "|---|---|---|---|"]
    for name in ("ar", "fts"):
        a, ta = tokens["eager", name]
        b, tb = tokens.get(("compiled", name), (None, float("nan")))
        lines.append(f"| {name} | {ta:.1f} | {tb:.1f} | {'-' if b is None else a == b} |")
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
