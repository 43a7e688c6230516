"""`targetrows drift --target T --prompts Q.jsonl... --reference ar.jsonl... --answers A.jsonl...
--out drift.csv`: where each greedy decoder's answers part from ar's, and whether rounding
explains it (`targetrows.bench.answer_drift`); one CSV row per answer."""

from __future__ import annotations

import argparse
import csv
import io
import json

from . import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_model_arguments(parser, draft=False)
    parser.add_argument("--prompts", required=True, nargs="+",
                        help="prompts JSONL files the answers were decoded from")
    parser.add_argument("--reference", required=True, nargs="+",
                        help="ar's answers (temperature 0), for every task of --answers")
    parser.add_argument("--answers", required=True, nargs="+",
                        help="the other decoders' answers at temperature 0")
    parser.add_argument("--pair", default=None, help="pair name in the table (default: target)")
    parser.add_argument("--out", required=True, help="CSV to write")


def read_records(paths) -> list[dict]:
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def run(args: argparse.Namespace) -> int:
    import os

    from targetrows.bench.answer_drift import FIELDS, answer_drift
    from targetrows.core.atomic import atomic_write_text
    from targetrows.specbench.questions import read_questions

    questions = [q for path in args.prompts for q in read_questions(path)]
    reference, runs = read_records(args.reference), read_records(args.answers)
    if any(r["decoder"] != "ar" for r in reference):
        raise ValueError("--reference takes ar's answers only")
    target, _, tokenizer = common.load_from_args(args)
    rows = answer_drift(target, tokenizer, questions, reference, runs)
    pair = args.pair or os.path.basename(os.path.normpath(args.target))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=("pair", *FIELDS), restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows({"pair": pair, **r} for r in rows)
    atomic_write_text(args.out, out.getvalue())
    return 0
