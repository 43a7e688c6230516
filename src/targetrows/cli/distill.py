"""`targetrows distill --target T --out DIR [--replies R]`: a small standalone draft distilled
from a target on its own replies (`targetrows.build.distill`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from .replies import add_replies_arguments, replies_config, set_threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from targetrows.build.distill import DistillConfig

    d = DistillConfig()
    parser.add_argument("--target", required=True, help="target model folder")
    parser.add_argument("--out", required=True, help="output folder for the draft")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--replies", default=None,
                        help="replies folder from `targetrows replies` (default: generate them "
                        "now with the reply options below)")
    add_replies_arguments(parser)
    for name, help_text in [
        ("seed", "seed of batches and sampled vocabulary"),
        ("layers", "decoder layers of the draft (copied from the target's first ones)"),
        ("steps", "training steps"), ("batch-size", "sequences per training step"),
        ("warmup", "linear warm-up steps"), ("n-random", "random vocabulary entries in the loss"),
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
    parser.add_argument("--train-minutes", type=float, default=None,
                        help="time cap on training (makes the result machine-dependent)")


def run(args: argparse.Namespace) -> int:
    from targetrows.build.distill import DistillConfig, distill

    set_threads(args.threads)
    names = {f.name for f in dataclasses.fields(DistillConfig)}
    config = DistillConfig(**{k: v for k, v in vars(args).items() if k in names})
    report = distill(args.target, args.out, config, replies=args.replies,
                     data=replies_config(args, features=False), force=args.force)
    print(f"distill: held-out top-1 agreement {report['heldout_top1_agreement']:.3f} "
          f"({report['heldout_positions']} positions); wrote {args.out}", file=sys.stderr)
    return 0
