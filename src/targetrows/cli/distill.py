"""`targetrows distill --target T --out DIR`: a small standalone draft distilled from a target
on its own replies (`targetrows.build.distill`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from targetrows.build.distill import DistillConfig

    d = DistillConfig()
    parser.add_argument("--target", required=True, help="target model folder")
    parser.add_argument("--out", required=True, help="output folder for the draft")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    for name, help_text in [
        ("seed", "seed of prompts, batches and sampled vocabulary"),
        ("layers", "decoder layers of the draft (copied from the target's first ones)"),
        ("prompts", "distinct training prompts"), ("heldout", "held-out prompts to evaluate on"),
        ("max-new-tokens", "reply length cap"), ("gen-batch", "prompts per generation batch"),
        ("steps", "training steps"), ("batch-size", "sequences per training step"),
        ("warmup", "linear warm-up steps"), ("top-k", "target's top tokens in the loss"),
        ("n-random", "random vocabulary entries in the loss"),
    ]:
        key = name.replace("-", "_")
        parser.add_argument(f"--{name}", type=int, default=getattr(d, key),
                            help=f"{help_text} (default {getattr(d, key)})")
    parser.add_argument("--lr", type=float, default=d.lr, help=f"AdamW peak lr (default {d.lr})")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="train without torch.compile (slower; no C++ compiler needed)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default: torch's choice, one per core); on a busy "
                        "machine 1 avoids threads waiting on each other")
    parser.add_argument("--data-minutes", type=float, default=None,
                        help="time cap on generating data (makes the result machine-dependent)")
    parser.add_argument("--train-minutes", type=float, default=None,
                        help="time cap on training (makes the result machine-dependent)")


def run(args: argparse.Namespace) -> int:
    import torch

    from targetrows.build.distill import DistillConfig, distill

    if args.threads < 0:
        raise ValueError(f"--threads {args.threads} must be 0 (torch's default) or more")
    if args.threads:
        torch.set_num_threads(args.threads)
    names = {f.name for f in dataclasses.fields(DistillConfig)}
    config = DistillConfig(**{k: v for k, v in vars(args).items() if k in names})
    report = distill(args.target, args.out, config, force=args.force)
    print(f"distill: held-out top-1 agreement {report['heldout_top1_agreement']:.3f} "
          f"({report['heldout_positions']} positions); wrote {args.out}", file=sys.stderr)
    return 0
