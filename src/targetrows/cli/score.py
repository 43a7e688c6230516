"""`targetrows score rows.npz --budgets 2 4 8 --out scores.csv`: every selection rule at every
budget on row logs, NumPy only (`targetrows.rowlog.score`); the learned rules too with their
--reranker files, and the draft-free decoders (racer, recycle)."""

from __future__ import annotations

import argparse

from targetrows.decoding.registry import draft_free_decoders, rule_names

from .common import add_reranker_argument, rerankers_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="row log(s) from `record`")
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8, 16, 32, 59])
    parser.add_argument("--rules", nargs="+", default=None,
                        choices=rule_names() + draft_free_decoders(),
                        help="rules, and draft-free decoders scored along the logged path "
                             "(default: every rule, the learned ones when --reranker gives "
                             "them, and the draft-free decoders when the log holds their rows)")
    add_reranker_argument(parser)
    parser.add_argument("--pair", default=None,
                        help="pair name in the table (default: target+draft from the log)")
    parser.add_argument("--out", required=True, help="table to write: .csv (or .npz)")


def run(args: argparse.Namespace) -> int:
    from targetrows.rowlog import format as rowlog
    from targetrows.rowlog.score import concat_tables, score_log, write_table

    rerankers = rerankers_from(args)
    tables = [score_log(rowlog.read(p), args.budgets, args.rules, args.pair,
                        rerankers=rerankers) for p in args.logs]
    write_table(concat_tables(tables), args.out)
    return 0
