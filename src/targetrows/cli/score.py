"""`targetrows score rows.npz --budgets 2 4 8 --out scores.csv`: every selection rule at every
budget on row logs, NumPy only (`targetrows.rowlog.score`)."""

from __future__ import annotations

import argparse

from targetrows.decoding.registry import rule_names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="row log(s) from `record`")
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8, 16, 32, 59])
    parser.add_argument("--rules", nargs="+", default=list(rule_names()), choices=rule_names())
    parser.add_argument("--pair", default=None,
                        help="pair name in the table (default: target+draft from the log)")
    parser.add_argument("--out", required=True, help="table to write: .csv (or .npz)")


def run(args: argparse.Namespace) -> int:
    from targetrows.rowlog import format as rowlog
    from targetrows.rowlog.score import concat_tables, score_log, write_table

    tables = [score_log(rowlog.read(p), args.budgets, tuple(args.rules), args.pair)
              for p in args.logs]
    write_table(concat_tables(tables), args.out)
    return 0
