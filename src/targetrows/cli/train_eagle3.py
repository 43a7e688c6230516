"""`targetrows train-eagle3 --target T --out DIR [--replies R]`: an EAGLE-3 head trained on the
target's own replies, written in the EAGLE layout (`targetrows.build.eagle3_train`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from .replies import add_replies_arguments, replies_config, set_threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from targetrows.build.eagle3_train import Eagle3TrainConfig

    d = Eagle3TrainConfig()
    parser.add_argument("--target", required=True, help="target model folder")
    parser.add_argument("--out", required=True, help="output folder for the head")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--replies", default=None,
                        help="replies folder from `targetrows replies` (default: generate them "
                        "now with the reply options below)")
    add_replies_arguments(parser)
    for name, kind, help_text in [
        ("seed", int, "seed of the head's initialisation and of the batches"),
        ("coverage", float, "share of the target's top tokens the draft vocabulary covers"),
        ("vocab-top-k", int, "count tokens among the target's top-k at each reply position (1: "
                             "the reply tokens)"),
        ("ttt-steps", int, "steps the head is unrolled on its own outputs (training-time test)"),
        ("ttt-decay", float, "weight of unrolled step k's loss: decay ** k"),
        ("steps", int, "training steps"), ("batch-size", int, "sequences per training step"),
        ("lr", float, "AdamW peak learning rate"), ("warmup", int, "linear warm-up steps"),
        ("weight-decay", float, "AdamW weight decay"), ("clip", float, "gradient norm clip"),
        ("feature-noise", float, "Gaussian noise on the target's features in training, in "
                                 "units of each feature's standard deviation"),
        ("eval-depth", int, "chain depths reported on held-out replies"),
    ]:
        key = name.replace("-", "_")
        parser.add_argument(f"--{name}", type=kind, default=getattr(d, key),
                            help=f"{help_text} (default {getattr(d, key)})")
    parser.add_argument("--no-init-from-target", dest="init_from_target", action="store_false",
                        help="start lm_head and norm at random, not from the target's")
    parser.add_argument("--no-init-layer", dest="init_layer", action="store_false",
                        help="start the head's layer at random, not as a copy of the target "
                        "layer that reads the last feature layer")
    parser.add_argument("--freeze-lm-head", dest="train_lm_head", action="store_false",
                        help="keep lm_head at the target's rows (with its initialisation)")
    parser.add_argument("--device", default=d.device,
                        help="where the target and the head run: cpu, cuda, cuda:1 (default cpu)")
    parser.add_argument("--autocast", default=d.autocast,
                        help="dtype of the training's matrix products (autocast; float32 weights "
                        "and labels): auto (bfloat16 on a GPU or a CPU with AMX or AVX512-BF16, "
                        f"else float32), float32, bfloat16 (default {d.autocast})")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default: torch's choice, one per core)")
    parser.add_argument("--train-minutes", type=float, default=None,
                        help="time cap on training (makes the result machine-dependent)")


def run(args: argparse.Namespace) -> int:
    from targetrows.build.eagle3_train import Eagle3TrainConfig, train_eagle3

    set_threads(args.threads)
    names = {f.name for f in dataclasses.fields(Eagle3TrainConfig)}
    config = Eagle3TrainConfig(**{k: v for k, v in vars(args).items() if k in names})
    if config.steps < 1 or config.batch_size < 1 or config.ttt_steps < 1 or config.eval_depth < 1:
        raise ValueError("--steps, --batch-size, --ttt-steps and --eval-depth must be >= 1")
    report = train_eagle3(args.target, args.out, config, replies=args.replies,
                          data=replies_config(args, features=True), force=args.force)
    cost = report["forward_cost"]
    print(f"train-eagle3: held-out top-1 agreement {report['heldout_top1_agreement']:.3f} "
          f"({report['heldout_positions']} positions), draft vocabulary "
          f"{report['draft_vocab_size']}, head step {cost['ratio']:.3f}x a target step; wrote "
          f"{args.out}", file=sys.stderr)
    return 0
