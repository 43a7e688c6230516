"""`targetrows compare --target T --draft D --prompt "..."`: the decoders on one prompt, side by
side, with the temperature-0 check that each reproduced `ar`'s tokens (`targetrows.bench.compare`)."""

from __future__ import annotations

import argparse
import json
import sys

from targetrows.core.rows import greedy
from targetrows.decoding.budget import Auto, Fixed
from targetrows.decoding.registry import get_decoder

from . import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_model_arguments(parser)
    parser.add_argument("--prompt", required=True, help="the user message")
    parser.add_argument("--temperature", type=float, default=common.DECODE.temperature)
    parser.add_argument("--budget", type=common.budget_type("--budget"),
                        default=Fixed(common.DECODE.budget),
                        help="non-root nodes per tree, or auto: the budget and pool depth (at "
                             "most --depth) of the best predicted tokens/s on this machine for "
                             "the first tree decoder listed")
    common.add_decoding_arguments(parser)
    common.add_batch_argument(parser)
    common.add_reranker_argument(parser)
    parser.add_argument("--json", dest="json_out", default=None,
                        help="also write the results, with token ids and text, to this file")


def _checked(args: argparse.Namespace):
    """(rerankers, decoder names) of the options, every one checked before the models load."""
    if not args.prompt.strip():
        raise ValueError("--prompt is empty: give the text of a user message")
    common.check_temperatures([args.temperature])
    common.batch_size_from(args)  # a bad --batch-size fails before the models load
    rerankers = common.rerankers_from(args)
    decoders = common.decoders_from(args, rerankers)
    common.check_draft(decoders, args.draft)
    common.drop_unneeded_draft(args, decoders)
    if args.json_out:
        common.check_output_file(args.json_out, "--json")
    return rerankers, decoders


def run(args: argparse.Namespace) -> int:
    from targetrows.bench.compare import (
        compare,
        decoder_configs,
        format_table,
        lossless_report,
        table_rows,
    )
    from targetrows.core.atomic import atomic_write_text
    from targetrows.cost.calibration import auto_budget
    from targetrows.specbench.chat import encode_prompt, stop_ids

    rerankers, decoders = _checked(args)
    target, draft, tokenizer = common.load_from_args(args)
    prompt_ids = encode_prompt(tokenizer, args.prompt)
    # the first tree decoder's config: every decoder's, with its own entry (ar's: no budget)
    trees = [d for d in decoders if get_decoder(d).drafts]
    config = common.decode_config(args, trees[0] if trees else "ar",
                                  stop_ids=frozenset(stop_ids(tokenizer, target)))
    batch_size = config.batch_size  # --batch-size
    # the (budget, depth) every tree decoder runs at: auto's pick for the first of them, which
    # is (NO_TREE, NO_TREE) where no tree beats ar: each then runs as ar
    condition = None
    if trees:
        config = config.for_decoder(trees[0], rerankers)
        if isinstance(args.budget, Auto):
            choice = auto_budget(target, draft, config, [prompt_ids])
            print(f"{trees[0]}: {choice.describe()}", file=sys.stderr)
            condition = choice.condition()
        else:
            condition = (args.budget.nodes, config.pool.depth)
    budget, depth = condition or (config.budget, config.pool.depth)
    configs = decoder_configs(decoders, config, rerankers, condition)
    results = compare(target, draft, prompt_ids, configs)
    rows = table_rows(results, configs)
    print(format_table(rows))
    status = 0
    if greedy(args.temperature) and "ar" in results:
        status, lines = lossless_report(target, prompt_ids, results, batch_size)
        print("\n".join(lines), file=sys.stderr if status else sys.stdout)
    if args.json_out:
        for row in rows:
            res = results[row["decoder"]]
            row["token_ids"] = res.tokens
            row["text"] = tokenizer.decode(res.tokens, skip_special_tokens=True)
            row["rounds"] = [r.__dict__ for r in res.rounds]
        document = {"prompt": args.prompt, "temperature": args.temperature,
                    "budget": budget, "depth": depth,
                    "budget_auto": bool(trees) and isinstance(args.budget, Auto), "seed": args.seed,
                    "batch_size": batch_size, "decoders": rows}
        atomic_write_text(args.json_out, json.dumps(document, indent=1) + "\n")
    return status
