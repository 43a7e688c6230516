"""`targetrows distill --target T --out DIR [--replies R]`: a small standalone draft distilled
from a target on its own replies (`targetrows.train.distill`)."""

from __future__ import annotations

import argparse
import sys

from .replies import add_training_arguments, config_from, replies_config, set_threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from targetrows.train.distill import DistillConfig

    add_training_arguments(parser, DistillConfig(), [
        ("seed", int, "seed of batches and sampled vocabulary"),
        ("layers", int, "decoder layers of the draft (copied from the target's first ones)"),
        ("steps", int, "training steps"), ("batch-size", int, "sequences per training step"),
        ("warmup", int, "linear warm-up steps"),
        ("n-random", int, "random vocabulary entries in the loss"),
        ("lr", float, "AdamW peak lr"),
    ], "draft")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="train without torch.compile (slower; no C++ compiler needed)")


def run(args: argparse.Namespace) -> int:
    from targetrows.train.distill import DistillConfig, distill

    set_threads(args.threads)
    report = distill(args.target, args.out, config_from(args, DistillConfig),
                     replies=args.replies, data=replies_config(args, features=False),
                     force=args.force)
    print(f"distill: held-out top-1 agreement {report['heldout_top1_agreement']:.3f} "
          f"({report['heldout_positions']} positions); wrote {args.out}", file=sys.stderr)
    return 0
