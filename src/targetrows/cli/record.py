"""`targetrows record --target T --draft D --prompts Q.jsonl... --out rows.npz...`: the target
decodes each prompt alone and its rows on the draft's candidate pools are logged, one row log per
prompts file, the models loaded once (`targetrows.rowlog.record`).
``--target toy[:VOCAB[:SEED]] --draft toy[:CLOSENESS]`` records the NumPy toy pair, which needs
no torch."""

from __future__ import annotations

import argparse
import os

from .common import (
    DECODE,
    UsageError,
    add_pool_arguments,
    check_outputs,
    check_temperatures,
    draft_label,
    pool_from,
)


def toy_pair(target: str, draft: str | None):
    """``--target toy[:VOCAB[:SEED]] --draft toy[:CLOSENESS]``: the NumPy toy pair."""
    from targetrows.core.toy import ToyPair
    from targetrows.rowlog.record import ToyEncoder

    try:
        t = [int(x) for x in target.split(":")[1:]]
        d = [float(x) for x in (draft or "toy").split(":")[1:]]
        pair = ToyPair(vocab_size=(t + [32])[0], seed=(t[1:] + [0])[0],
                       closeness=(d + [0.8])[0])
    except ValueError as err:
        raise ValueError(f"bad toy pair {target!r} / {draft!r}: {err} (use --target "
                         "toy:VOCAB:SEED --draft toy:CLOSENESS)") from err
    return pair.target, pair.draft, ToyEncoder(pair.vocab_size), frozenset()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from .common import add_model_arguments

        add_model_arguments(parser)
    except ImportError:  # no torch: only the toy pair can record
        parser.add_argument("--target", required=True, help="toy[:VOCAB[:SEED]] (torch missing)")
        parser.add_argument("--draft", default=None, help="toy[:CLOSENESS]")
    parser.add_argument("--prompts", required=True, nargs="+",
                        help="Spec-Bench question JSONL files (one row log each)")
    parser.add_argument("--temperature", type=float, default=DECODE.temperature)
    add_pool_arguments(parser, auto=False)
    parser.add_argument("--stride", type=int, default=1, help="log every S-th position")
    parser.add_argument("--max-new-tokens", type=int, default=128,
                        help="positions per turn (the trajectory runs --depth tokens further)")
    parser.add_argument("--root-top", type=int, default=32, help="root-row entries kept")
    parser.add_argument("--path-top-k", type=int, default=8,
                        help="the target's top ids kept at every prompt and trajectory position "
                             "(what the draft-free decoders' tables are scored from)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, nargs="+",
                        help="row logs to write (.npz), one per --prompts file, in their order")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    from targetrows.rowlog.record import ChatEncoder, RecordConfig, read_prompts, record_file

    check_outputs(args.prompts, args.out, "row log")
    for out in args.out:
        if os.path.exists(out) and not args.overwrite:
            raise UsageError(f"row log {out} exists; pass --overwrite or choose another --out")
    if args.draft is None and not args.target.startswith("toy"):
        raise UsageError("record needs --draft (the model whose pools are logged)")
    check_temperatures([args.temperature])
    pool = pool_from(args)
    for path in args.prompts:  # a bad prompts file fails before any model loads
        read_prompts(path)
    if args.target.startswith("toy"):
        target, draft, encoder, stops = toy_pair(args.target, args.draft)
    else:
        try:
            from targetrows.specbench.chat import stop_ids

            from .common import load_from_args
        except ImportError as err:
            raise UsageError(f"recording Hugging Face models needs torch and transformers "
                             f"(pip install 'targetrows[decode]'): {err}") from err
        target, draft, tokenizer = load_from_args(args)
        encoder, stops = ChatEncoder(tokenizer), frozenset(stop_ids(tokenizer, target))
    config = RecordConfig(
        temperature=args.temperature, pool=pool, stride=args.stride,
        max_new_tokens=args.max_new_tokens, root_top=args.root_top,
        path_top_k=args.path_top_k, seed=args.seed,
        stop_ids=stops,
    )
    for prompts, out in zip(args.prompts, args.out, strict=True):  # the models load once
        record_file(target, draft, encoder, prompts, out, config,
                    names=(args.target, draft_label(args) or "toy"), quiet=args.quiet)
    return 0
