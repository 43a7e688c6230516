"""`targetrows agreement --target T --draft D --prompts config/prompts/*.jsonl`: how often a draft
agrees with its target, per task, on prompts its training never read (`targetrows.train.agreement`):
online as `compare --budget 1` measures it and, for an EAGLE-3 head, teacher-forced with chain
acceptance by depth. Prints the table; --json and --table write the report and the table."""

from __future__ import annotations

import argparse
import json
import os

from targetrows.core.checks import check_count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from targetrows.train.agreement import AgreementConfig

    d = AgreementConfig()
    parser.add_argument("--target", required=True, help="target folder, .gguf or hub id")
    parser.add_argument("--draft", required=True, help="EAGLE-3 head or standalone draft")
    parser.add_argument("--prompts", required=True, nargs="+",
                        help="Spec-Bench prompt files (the first turn of each question)")
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                        help=f"greedy tokens per prompt (default {d.max_new_tokens})")
    parser.add_argument("--depth", type=int, default=d.depth,
                        help=f"teacher-forced chain depths reported (default {d.depth})")
    parser.add_argument("--no-online", dest="online", action="store_false",
                        help="teacher-forced figures only (no round loop)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--thinking", choices=["on", "off"], default=None,
                        help="the chat template's thinking (enable_thinking); default: its own")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run model code shipped with the checkpoints (only if you trust it)")
    parser.add_argument("--json", default=None, help="write the whole report here (JSON)")
    parser.add_argument("--table", default=None, help="write the table here (Markdown)")


def run(args: argparse.Namespace) -> int:
    from targetrows.core.atomic import atomic_write_text
    from targetrows.train.agreement import AgreementConfig, agreement_report, markdown

    from .replies import set_threads

    check_count(args.max_new_tokens, "--max-new-tokens")
    check_count(args.depth, "--depth")
    for path in args.prompts:
        if not os.path.isfile(path):
            raise ValueError(f"--prompts {path}: no such file")
    set_threads(args.threads)
    config = AgreementConfig(args.max_new_tokens, args.depth, args.online,
                             None if args.thinking is None else args.thinking == "on")
    report = agreement_report(args.target, args.draft, args.prompts, config,
                              trust_remote_code=args.trust_remote_code)
    table = markdown(report)
    print(table, end="")
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=1) + "\n")
    if args.table:
        atomic_write_text(args.table, table)
    return 0
