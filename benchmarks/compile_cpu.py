"""Does `torch.compile` speed the CPU passes? The embedded target's passes (a one-token step and
tree passes of 8 and 64 nodes on a cached 300-token context, `time_passes`) four ways:

- **eager**: as the CPU runs them today (`--graphs off`: the lean forward over the live
  entries, prepacked linears);
- **padded**: the passes `--graphs on` replays as CUDA graphs on a GPU (`PassShape` with `pad`
  and `full_span`), run eagerly: every pass padded to a bucket, over the whole cache of
  --capacity entries;
- **compiled**: those padded passes with each bucket's pass (`Lanes.compute`) compiled once
  by inductor (`dynamic=False`: a bucket's shapes never change, which is what padding is for);
- **frozen**: compiled with inductor's `freezing` (weights taken as constants, so inductor
  prepacks them for oneDNN as our eager path does), its setting for CPU inference.

and whether greedy `ar` and `fts` (EAGLE-3 head) keep the eager tokens in each mode.

    python benchmarks/compile_cpu.py --target resources/models/smollm2-135m-instruct \
        --draft resources/models/smollm2-135m-eagle3 --out benchmarks/results/compile_cpu.md

Two things the compiled mode needs, both measured failures of the straightforward way:
- plain linear layers (`packed=False`): inductor lowers our oneDNN prepacked products only for
  weights it holds as constants (an AssertionError in its `mkldnn_lowerings` otherwise); with
  `freezing` it packs plain weights itself;
- no `torch.inference_mode` inside a compiled pass: dynamo (torch 2.13) fails with "Cannot set
  version_counter for inference tensor" when inference-mode tensors meet the model's own. The
  script therefore runs the library with `inference_mode` read as `no_grad` (same values, no
  autograd either), in every mode, so the modes differ only in how their passes run.

Each bucket is compiled before anything is timed (`time_passes` at every bucket once), from an
empty inductor cache, and the compile seconds are reported apart; --compile-limit stops it.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import tempfile
import time
from contextlib import contextmanager

import numpy as np
import torch

torch.inference_mode = lambda mode=True: torch.no_grad()  # see the docstring; before the imports

from report_out import emit  # noqa: E402

from targetrows.cost.parttimes import time_passes  # noqa: E402
from targetrows.decoding.config import DecodeConfig  # noqa: E402
from targetrows.decoding.loop import generate  # noqa: E402
from targetrows.hf.loading import load_pair  # noqa: E402
from targetrows.hf.pass_builder import BUCKETS, PassShape  # noqa: E402
from targetrows.specbench.chat import encode_conversation  # noqa: E402

MODES = ("eager", "padded", "compiled", "frozen")
COMPILED = ("compiled", "frozen")
SIZES = (1, 8, 64)
DECODERS = ("ar", "fts")


def compile_buckets(model, buckets, options: dict) -> dict[int, float]:
    """Run each bucket's padded pass of `model`'s own sequence (what `generate` and
    `time_passes` decode with) through its own `torch.compile` (inductor with `options`; a
    pass wider than every bucket, a long prompt's prefill, stays eager). Returns the seconds
    each bucket's first pass took, filled in as they run: the compilation."""
    passes = model.pass_group  # its `Lanes`: every pass of the sequence goes through
    eager = passes.compute
    compiled, first_s = {}, {}

    def compute(inputs):
        width = inputs.width
        if width not in buckets:
            return eager(inputs)
        if width in compiled:
            return compiled[width](inputs)
        compiled[width] = torch.compile(eager, dynamic=False, options=options)
        t = time.perf_counter()
        out = compiled[width](inputs)
        first_s[width] = time.perf_counter() - t
        return out

    passes.compute = compute
    return first_s


def set_up(mode: str, args, shape: PassShape, context) -> tuple:
    """(target, draft, tokenizer, note) for `mode`; a compiled mode's buckets are compiled here,
    and the note says how long that took, or why it failed (then the target is None)."""
    target, draft, tokenizer = load_pair(args.target, args.draft, "cpu", dtype=args.dtype,
                                         packed=mode not in COMPILED)
    if mode == "eager":
        return target, draft, tokenizer, ""
    target.set_pass_shape(shape)
    if mode not in COMPILED:
        return target, draft, tokenizer, ""
    first_s = compile_buckets(target, shape.buckets, {"freezing": mode == "frozen"})
    t = time.perf_counter()
    try:
        with deadline(args.compile_limit):
            time_passes(target, context, shape.buckets, repeats=1)  # each bucket's first pass
    except Exception as err:  # torch.compile refusing the pass is the finding
        why = (f"did not finish in {args.compile_limit:.0f} s" if _timed_out(err) else
               f"failed after {time.perf_counter() - t:.0f} s: {_first_line(err)}")
        return None, None, tokenizer, f"{mode}: compiling {why}"
    return target, draft, tokenizer, (
        f"{mode}: compiling {len(first_s)} buckets took {sum(first_s.values()):.0f} s "
        f"({np.median(list(first_s.values())):.0f} s each, median)")


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


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--capacity", type=int, default=512,
                   help="entries of the padded passes' cache (context, answer and a round's "
                   "tree)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--compile-limit", type=float, default=1800.0,
                   help="seconds compiling every bucket may take")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    # a compiled bucket per width and mode: more than dynamo's default of 8 per code object
    torch._dynamo.config.cache_size_limit = 4 * len(BUCKETS)
    # compile time as a first run sees it: not from an earlier run's cache
    with tempfile.TemporaryDirectory(prefix="compile_cpu_") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        return _measure(args)


def _measure(args) -> int:
    start = time.perf_counter()
    context = np.random.default_rng(0).integers(1000, 20000, size=300).tolist()
    shape = PassShape(capacity=args.capacity, pad=True, full_span=True)  # graphs: a GPU's
    pairs, notes = {}, []
    for mode in MODES:
        target, draft, tokenizer, note = set_up(mode, args, shape, context)
        notes += [note] if note else []
        if target is not None:
            pairs[mode] = target, draft
    prompt = encode_conversation(tokenizer, [("user", "Name three colours and say why.")])
    # the modes take turns, so that a slow spell of the machine slows one sample of each
    passes = {mode: {n: [] for n in SIZES} for mode in pairs}
    for _ in range(args.repeats):
        for mode, (target, _) in pairs.items():
            curve = time_passes(target, context, SIZES, repeats=1)
            for n, seconds in zip(SIZES, curve.seconds, strict=True):
                passes[mode][n].append(seconds)
    speeds, tokens = {}, {}
    for repeat in range(args.decode_repeats + 1):  # the first run of each warms it up
        for mode, (target, draft) in pairs.items():
            for name in DECODERS:
                config = DecodeConfig(decoder=name, budget=16, max_new_tokens=args.max_new_tokens)
                t = time.perf_counter()
                result = generate(target, draft if name != "ar" else None, prompt, config)
                if repeat:
                    tokens[mode, name] = result.tokens
                    speeds.setdefault((mode, name), []).append(
                        len(result.tokens) / (time.perf_counter() - t))
    lines = ["# torch.compile on the CPU passes\n",
             f"- command: `python benchmarks/compile_cpu.py {' '.join(sys.argv[1:])}`",
             f"- date: {time.strftime('%Y-%m-%d')}; machine: {platform.platform()}; torch "
             f"{torch.__version__}; {torch.get_num_threads()} threads; target {args.dtype}; "
             f"context 300 tokens; padded passes' capacity {args.capacity}; {args.repeats} repeats; "
             f"{'; '.join(notes)}; {time.perf_counter() - start:.0f} s in all", "",
             f"Median ms of a pass feeding n nodes ({args.repeats} samples, the modes in turn):",
             "",
             "| passes | " + " | ".join(f"{n} fed" for n in SIZES) + " |",
             "|---|" + "---|" * len(SIZES)]
    for mode, samples in passes.items():
        lines.append(f"| {mode} | " + " | ".join(f"{np.median(samples[n]) * 1e3:.1f}"
                                                 for n in SIZES) + " |")
    lines += ["", f"Greedy decoding, budget 16, {args.max_new_tokens} new tokens: median tokens/s "
              f"of {args.decode_repeats} runs, the modes in turn, after one to warm up:", "",
              "| mode | " + " | ".join(f"{d} tokens/s | {d} same tokens as eager"
                                       for d in DECODERS) + " |",
              "|---|" + "---|---|" * len(DECODERS)]
    for mode in pairs:
        lines.append(f"| {mode} | " + " | ".join(
            f"{np.median(speeds[mode, d]):.1f} | {tokens[mode, d] == tokens['eager', d]}"
            for d in DECODERS) + " |")
    emit("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
