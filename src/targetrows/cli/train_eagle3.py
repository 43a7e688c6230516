"""`targetrows train-eagle3 --target T --out DIR [--replies R]`: an EAGLE-3 head trained on the
target's own replies, written in the EAGLE layout (`targetrows.train.eagle3_train`)."""

from __future__ import annotations

import argparse
import sys

from targetrows.core.checks import check_count

from .replies import add_training_arguments, config_from, replies_config, set_threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from targetrows.train.eagle3_train import Eagle3TrainConfig

    d = Eagle3TrainConfig()
    add_training_arguments(parser, d, [
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
    ], "head")
    parser.add_argument("--no-init-from-target", dest="init_from_target", action="store_false",
                        help="start lm_head and norm at random, not from the target's")
    parser.add_argument("--no-init-layer", dest="init_layer", action="store_false",
                        help="start the head's layer at random, not as a copy of the target "
                        "layer that reads the last feature layer")
    parser.add_argument("--mask-outside-vocab", action="store_true",
                        help="leave out of the loss the positions whose target argmax is outside "
                        "the draft vocabulary (as EAGLE and SpecForge train)")
    parser.add_argument("--freeze-lm-head", dest="train_lm_head", action="store_false",
                        help="keep lm_head at the target's rows (with its initialisation)")
    parser.add_argument("--device", default=d.device,
                        help="where the head trains: cpu, cuda, cuda:1 (default cpu); the "
                        "target runs there when it generates the replies now, and with "
                        "--replies stays on the CPU (only its weights are read)")
    parser.add_argument("--autocast", default=d.autocast,
                        help="dtype of the training's matrix products (autocast; float32 weights "
                        "and labels): auto (bfloat16 on a GPU or a CPU with AMX or AVX512-BF16, "
                        f"else float32), float32, bfloat16 (default {d.autocast})")


def run(args: argparse.Namespace) -> int:
    from targetrows.train.eagle3_train import Eagle3TrainConfig, train_eagle3

    set_threads(args.threads)
    config = config_from(args, Eagle3TrainConfig)
    for name in ("steps", "batch_size", "ttt_steps", "eval_depth"):
        check_count(getattr(config, name), "--" + name.replace("_", "-"))
    report = train_eagle3(args.target, args.out, config, replies=args.replies,
                          data=replies_config(args, features=True), force=args.force)
    cost = report["forward_cost"]
    print(f"train-eagle3: held-out top-1 agreement {report['heldout_top1_agreement']:.3f} "
          f"({report['heldout_positions']} positions), draft vocabulary "
          f"{report['draft_vocab_size']}, head step {cost['ratio']:.3f}x a target step; wrote "
          f"{args.out}", file=sys.stderr)
    return 0
