"""`targetrows train-reranker ROWLOG... --out DIR`: the learned rules' models, fitted on row logs
of one pair and temperature, cross-fitted by prompt: the rerankers (`targetrows.train.reranker`)
and Sequoia's acceptance vector (`targetrows.train.sequoia`); writes DIR/<rule>.json and
DIR/report.md (held-out expected accepted and paired gains)."""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from targetrows.core.rules.learned import LEARNED_RULES
    from targetrows.train.reranker import MODEL_RULES, RerankerConfig

    d = RerankerConfig()
    parser.add_argument("logs", nargs="+", metavar="ROWLOG", help="row logs from `record`")
    parser.add_argument("--out", required=True, help="folder for the models and the report")
    parser.add_argument("--rules", nargs="+", default=list(LEARNED_RULES), choices=MODEL_RULES,
                        help="the learned rules whose models to fit (sequoia: its acceptance "
                        "vector)")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(d.budgets),
                        help="budgets whose expected acceptance the fit maximises and the "
                        "report shows")
    parser.add_argument("--folds", type=int, default=d.folds,
                        help="cross-fitting folds (prompts; each scored by a model without it)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--n-boot", type=int, default=d.n_boot, help="bootstrap replicates")


def run(args: argparse.Namespace) -> int:
    from targetrows.core.checks import check_budget, check_count
    from targetrows.rowlog import format as rowlog
    from targetrows.train.reranker import (
        RerankerConfig,
        held_out_report,
        round_microseconds,
        train_reranker,
        write_report,
    )

    for b in args.budgets:
        check_budget(b, "--budgets")
    config = RerankerConfig(tuple(args.budgets), check_count(args.folds, "--folds"), args.seed,
                            n_boot=check_count(args.n_boot, "--n-boot"))
    logs = [rowlog.read(p) for p in args.logs]
    models = {}
    for rule in args.rules:
        models[rule], meta = train_reranker(logs, rule, config)
        print(f"train-reranker: {rule}: {meta['prompts']} prompts, {meta['positions']} "
              f"positions, fitted in {meta['train_seconds']} s", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    for rule, model in models.items():
        model.save(os.path.join(args.out, f"{rule}.json"))
    report = held_out_report(logs, models, list(args.budgets), config.n_boot, config.seed)
    write_report(args.out, models, report, args.logs,
                 {rule: round_microseconds(m) for rule, m in models.items()})
    print(f"train-reranker: wrote {args.out}", file=sys.stderr)
    return 0
