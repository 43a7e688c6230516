"""Where the head's build spends its time on this CPU: one batch of the target's training
replies (`generate_batch`, as `targetrows replies` makes them) and a few of the head's training
steps (`fit_head`, as `targetrows train-eagle3` takes them), each timed and profiled by torch's
profiler, operator by operator.

The two are most of the default run on a small CPU (docs/measurements.md, the default run).
Run it with the environment the run has (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 hold
torch and oneDNN to AVX2, where `dtype: auto` runs float32):

    python benchmarks/build_profile.py --target resources/models/smollm2-135m-instruct \
        --replies resources/replies/smollm2-135m-instruct --threads 2 \
        --out benchmarks/results/build_profile.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import replace

import torch
from report_out import emit
from torch.profiler import ProfilerActivity, profile

from targetrows.hf.loading import resolve_dtype
from targetrows.specbench.chat import encode_prompt, stop_ids
from targetrows.train.chat_prompts import training_prompts
from targetrows.train.eagle3_train import Eagle3TrainConfig, HeadTraining, fit_head
from targetrows.train.replies import (
    RepliesConfig,
    default_feature_layers,
    in_dtype,
    load_target,
    read_replies,
)
from targetrows.train.reply_generation import generate_batch

TOP_OPS = 10


def op_table(prof, wall: float) -> list[str]:
    """The operators with the most time of their own (children excluded), as shares of the
    profiled wall time."""
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    lines = ["| operator | calls | seconds (own) | share of wall |", "|---|---|---|---|"]
    for e in events[:TOP_OPS]:
        own = e.self_cpu_time_total / 1e6
        lines.append(f"| `{e.key}` | {e.count} | {own:.2f} | {own / wall:.0%} |")
    return lines


def profiled(work):
    """(work's result, wall seconds, profiler) of one profiled call."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        out = work()
        wall = time.perf_counter() - start
    return out, wall, prof


def replies_batch(target, tokenizer, config: RepliesConfig) -> list[str]:
    """One batch of greedy training replies (the run's first: its batch size and reply cap)."""
    stop = stop_ids(tokenizer, target)
    generator = in_dtype(target, resolve_dtype(config.dtype, str(target.device)))
    prompts = [encode_prompt(tokenizer, p)
               for p in training_prompts(config.gen_batch, config.seed)]
    layers = default_feature_layers(target.config.num_hidden_layers)
    generate_batch(generator, prompts, 4, stop, config.top_k, layers)  # warm-up
    out, wall, prof = profiled(lambda: generate_batch(generator, prompts, config.max_new_tokens,
                                                      stop, config.top_k, layers))
    tokens = sum(len(r[0]) for r in out)
    dtype = str(generator.dtype).removeprefix("torch.")
    return [f"## Training replies: one batch of {len(prompts)} prompts ({dtype})", "",
            f"{wall:.1f} s: {len(prompts) / wall:.2f} prompts/s, {tokens / wall:.0f} reply "
            f"tokens/s ({tokens} tokens, at most {config.max_new_tokens} a reply).", "",
            *op_table(prof, wall)]


def training_steps(target, tokenizer, replies: str, steps: int) -> list[str]:
    """`steps` of the head's training on the run's replies, after two warm-up steps."""
    train, _, _ = read_replies(replies)
    config = Eagle3TrainConfig()
    state = HeadTraining(config).build(target, tokenizer, train)
    short = replace(config, steps=2, warmup=1)
    fit_head(state.head, state.embed, train, short, state.target_w)  # warm-up
    short = replace(config, steps=steps, warmup=1)
    _, wall, prof = profiled(lambda: fit_head(state.head, state.embed, train, short,
                                              state.target_w))
    dtype = str(resolve_dtype(config.autocast, config.device)).removeprefix("torch.")
    return [f"## The head's training: {steps} steps (products in {dtype})", "",
            f"{wall / steps:.2f} s a step; the default run takes {config.steps} steps "
            f"(about {config.steps * wall / steps / 60:.0f} minutes at this rate).", "",
            *op_table(prof, wall)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="the target's folder")
    p.add_argument("--replies", required=True, help="a replies folder made for it")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="training steps profiled")
    p.add_argument("--out", default=None, help="Markdown file (default: print only)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer, target = load_target(args.target)
    lines = [f"- command: `python benchmarks/build_profile.py {' '.join(argv or sys.argv[1:])}`",
             f"- machine: {platform.platform()}, {args.threads} torch threads, torch "
             f"{torch.__version__}, kernels at {torch.backends.cpu.get_cpu_capability()}", ""]
    lines += replies_batch(target, tokenizer, RepliesConfig())
    lines += [""] + training_steps(target, tokenizer, args.replies, args.steps)
    text = "\n".join(lines) + "\n"
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
