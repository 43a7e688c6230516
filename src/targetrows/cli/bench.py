"""`targetrows bench --target T --draft D --prompts Q.jsonl`: our decoders against Hugging Face
generation on one pair and machine, interleaved prompt by prompt (`targetrows.bench.run`); a
tidy CSV and a Markdown report under --out-dir."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from .common import add_decoding_arguments, add_model_arguments, budget_arg, check_draft


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help="prompts JSONL (Spec-Bench question format; first turns)")
    src.add_argument("--prompt", action="append", help="a user message (repeat for several)")
    parser.add_argument("--num-prompts", type=int, default=None, help="the first N of --prompts")
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0],
                        help="one condition each (0: greedy; > 0: pure sampling)")
    parser.add_argument("--budget", type=budget_arg, default="auto",
                        help="non-root nodes per tree, or auto (picked per decoder from timings)")
    add_decoding_arguments(parser, max_new_tokens=64)
    parser.add_argument("--no-hf", dest="hf", action="store_false",
                        help="skip the Hugging Face baselines")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out-dir", default="benchmarks/results")
    parser.add_argument("--name", default=None, help="file stem (default: bench_<date-time>)")
    parser.add_argument("--note", default="", help="a line for the report's header")


def _questions(args) -> list[tuple[str, str, str]]:
    """(question_id, category, first user message) of each prompt to time."""
    from targetrows.decoding.answers import read_questions

    if args.prompts:
        questions = read_questions(args.prompts)
        if args.num_prompts is not None:
            if args.num_prompts < 1:
                raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
            questions = questions[: args.num_prompts]
        items = [(str(q.question_id), q.category, q.turns[0]) for q in questions]
    else:
        items = [(f"prompt-{i}", "", text) for i, text in enumerate(args.prompt)]
    for qid, _, text in items:
        if not text.strip():
            raise ValueError(f"prompt {qid} is empty: give the text of a user message")
    return items


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from targetrows.bench import report
    from targetrows.bench.run import BenchPrompt, BenchSettings, run_bench
    from targetrows.decoding.chat import encode_prompt, stop_ids

    from .common import load_from_args

    # assisted generation warns, every call, about its own internal generation config
    transformers.logging.set_verbosity_error()
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    settings = BenchSettings(  # checks budget, temperatures and decoders
        decoders=tuple(args.decoders), temperatures=tuple(args.temperature), budget=args.budget,
        max_new_tokens=args.max_new_tokens, top_k=args.top_k, depth=args.depth, seed=args.seed,
        hf=args.hf,
    )
    check_draft(args.decoders, args.draft)
    items = _questions(args)
    target, draft, tokenizer = load_from_args(args)
    prompts = [BenchPrompt(qid, cat, tuple(encode_prompt(tokenizer, text)))
               for qid, cat, text in items]
    settings = dataclasses.replace(settings, stop_ids=frozenset(stop_ids(tokenizer, target)))

    def progress(row):
        print(f"{row['question_id']:>12} T={row['temperature']:g} {row['method']:>12}: "
              f"{row['new_tokens']:4d} tokens {row['tokens_per_s']:8.1f} tokens/s",
              file=sys.stderr, flush=True)

    rows, context = run_bench(target, draft, prompts, settings, progress)
    prog = os.path.basename(sys.argv[0])
    prog = "targetrows" if prog in ("cli.py", "__main__.py") else prog  # python -m targetrows.cli
    head = report.header(settings, target, draft, len(prompts),
                         command=" ".join([prog] + sys.argv[1:]), note=args.note)
    paths = report.write(args.out_dir, args.name, rows, context, head, settings)
    print(report.summary_markdown(report.summarize(rows, settings), settings))
    print(f"wrote {paths[0]} and {paths[1]}")
    return 0
