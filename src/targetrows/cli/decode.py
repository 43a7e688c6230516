"""`targetrows decode --decoder D --prompts Q.jsonl... --out A.jsonl...`: one decoder over prompts
files, at each budget condition, into Spec-Bench answer lines (`targetrows.jobs.decode`)."""

from __future__ import annotations

import argparse
import os

from targetrows.decoding.budget import Fixed
from targetrows.decoding.registry import decoder_names

from . import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_model_arguments(parser)
    parser.add_argument("--prompts", required=True, nargs="+",
                        help="prompts JSONL files (Spec-Bench question format)")
    parser.add_argument("--decoder", required=True, choices=decoder_names())
    parser.add_argument("--budgets", type=common.budget_type("--budgets"), nargs="+",
                        default=[Fixed(common.DECODE.budget)],
                        help="non-root nodes per tree, one condition each (ignored by ar); "
                             "auto: the budget and pool depth (at most --depth) of the best "
                             "predicted tokens/s on this machine, one for all --prompts files")
    parser.add_argument("--temperature", type=float, default=common.DECODE.temperature)
    common.add_decoding_arguments(parser, decoders=False)
    common.add_batch_argument(parser)
    common.add_reranker_argument(parser)
    parser.add_argument("--model-id", default=None, help="model_id in the answers (default: target name)")
    parser.add_argument("--out", required=True, nargs="+",
                        help="answers JSONL to write, one per --prompts file, in their order")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)


def run(args: argparse.Namespace) -> int:
    from targetrows.jobs.decode import DecodeJobSettings, answer_files
    from targetrows.specbench.questions import read_questions

    common.check_outputs(args.prompts, args.out, "answers file")
    for path in args.prompts:  # a bad file fails before any model loads
        read_questions(path)
    common.check_temperatures([args.temperature])
    common.check_draft([args.decoder], args.draft)
    common.drop_unneeded_draft(args, [args.decoder])
    rerankers = common.rerankers_from(args)
    common.decoders_from(argparse.Namespace(decoders=[args.decoder]), rerankers)
    decode = common.decode_config(args).for_decoder(args.decoder, rerankers)
    settings = DecodeJobSettings(
        decode=decode, budgets=tuple(args.budgets),
        model_id=args.model_id or os.path.basename(os.path.normpath(args.target)),
        draft_name=common.draft_label(args), dtype=args.dtype, progress=args.progress,
    )
    target, draft, tokenizer = common.load_from_args(args)
    answer_files(target, draft, tokenizer, list(zip(args.prompts, args.out, strict=True)), settings)
    return 0
