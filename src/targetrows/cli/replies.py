"""`targetrows replies --target T --out DIR`: the target's greedy replies to many chat prompts,
with the hidden states and features both trainings read (`targetrows.train.replies`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys


def add_replies_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the reply generation (also used by `distill` and `train-eagle3` when they
    generate their replies themselves)."""
    from targetrows.train.replies import RepliesConfig

    d = RepliesConfig()
    for name, help_text in [
        ("prompts", "distinct template training prompts, one greedy reply each"),
        ("self-prompts", "training prompts the target writes itself (user turns sampled from "
                         "its chat template), one greedy reply each"),
        ("sampled", "replies sampled at temperature 1 besides the greedy ones, to training "
                    "prompts spread over the list (more than the prompts: several each)"),
        ("library-passages", "functions and classes from Python's standard library source, "
                             "each given as a user's message and labelled at every position"),
        ("library-reply-tokens", "greedy reply length after each library passage"),
        ("heldout", "held-out prompts to evaluate on"),
        ("max-new-tokens", "training reply length cap"),
        ("heldout-max-new-tokens", "held-out reply length cap"),
        ("gen-batch", "prompts per generation batch"),
        ("top-k", "target's top tokens kept per position"),
    ]:
        key = name.replace("-", "_")
        parser.add_argument(f"--{name}", type=int, default=getattr(d, key),
                            help=f"{help_text} (default {getattr(d, key)})")
    parser.add_argument("--data-seed", type=int, default=d.seed,
                        help=f"which training prompts, of both kinds (default {d.seed})")
    parser.add_argument("--reply-dtype", dest="dtype", default=d.dtype,
                        help="dtype the target generates the training replies in: auto (what "
                        "the decoders use: bfloat16 where it is fast, else float32), float32, bfloat16 "
                        f"(default {d.dtype}); held-out replies are always float32")
    parser.add_argument("--write-dtype", dest="write_dtype", default=d.write_dtype,
                        help="dtype the target writes its own prompts in (only their text is "
                        "kept): auto (bfloat16 on a GPU or a CPU with AMX or AVX512-BF16, else "
                        f"float32), float32, bfloat16 (default {d.write_dtype})")
    parser.add_argument("--data-minutes", type=float, default=None,
                        help="time cap on generating replies (makes the data machine-dependent)")
    parser.add_argument("--thinking", choices=["on", "off"], default=None,
                        help="render the chat template with thinking on or off (its "
                        "enable_thinking variable); default: the template's own")
    parser.add_argument("--replies-only", dest="learn_prompts", action="store_false",
                        help="label the replies only, not also the training prompts' own text "
                        "after the chat header they share")


def replies_config(args: argparse.Namespace, features: bool):
    from targetrows.train.replies import RepliesConfig

    names = {f.name for f in dataclasses.fields(RepliesConfig)} - {"seed", "features", "thinking"}
    thinking = getattr(args, "thinking", None)
    return RepliesConfig(seed=args.data_seed, features=features,
                         thinking=None if thinking is None else thinking == "on",
                         **{k: v for k, v in vars(args).items() if k in names})


def add_training_arguments(parser: argparse.ArgumentParser, defaults, fields, what: str) -> None:
    """What `distill` and `train-eagle3` share: --target --out --force --replies, the reply
    options, one typed option per training field (`fields`: (name, type, help), each default
    read from the `defaults` config), --threads and --train-minutes."""
    parser.add_argument("--target", required=True, help="target model folder")
    parser.add_argument("--out", required=True, help=f"output folder for the {what}")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    parser.add_argument("--replies", default=None,
                        help="replies folder from `targetrows replies` (default: generate them "
                        "now with the reply options below)")
    add_replies_arguments(parser)
    for name, kind, help_text in fields:
        key = name.replace("-", "_")
        parser.add_argument(f"--{name}", type=kind, default=getattr(defaults, key),
                            help=f"{help_text} (default {getattr(defaults, key)})")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default: torch's choice, one per core); on a busy "
                        "machine 1 avoids threads waiting on each other")
    parser.add_argument("--train-minutes", type=float, default=None,
                        help="time cap on training (makes the result machine-dependent)")


def config_from(args: argparse.Namespace, cls):
    """A training config (dataclass `cls`) from the options named as its fields."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def set_threads(threads: int) -> None:
    import torch

    if threads < 0:
        raise ValueError(f"--threads {threads} must be 0 (torch's default) or more")
    if threads:
        torch.set_num_threads(threads)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model folder")
    parser.add_argument("--out", required=True, help="output folder for the replies")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    add_replies_arguments(parser)
    parser.add_argument("--no-features", dest="features", action="store_false",
                        help="skip the EAGLE-3 feature layers (enough for distill only)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default: torch's choice, one per core)")
    parser.add_argument("--device", default="cpu",
                        help="where the training replies and self prompts are written: cpu, "
                        "cuda, cuda:1, or cuda:0,1 (the target spread evenly over those GPUs) "
                        "(default cpu); the held-out replies are the float32 target's, on the "
                        "CPU")


def run(args: argparse.Namespace) -> int:
    from targetrows.train.replies import make_replies

    set_threads(args.threads)
    summary = make_replies(args.target, args.out, replies_config(args, args.features),
                           force=args.force, device=args.device)
    print(f"replies: {summary['train_prompts']} training and {summary['heldout_prompts']} "
          f"held-out replies; wrote {args.out}", file=sys.stderr)
    return 0
