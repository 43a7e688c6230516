"""`targetrows part-times --target T [--draft D] --prompts Q.jsonl... --out parts.json`: time what
decode jobs on this machine are made of (`targetrows.cost.job_time.measure_pair`): the pair's
passes, the prefill of the longest prompt a turn may have, the prompt turns, and the start
(imports and loading both models). The
pipeline runs it once per target, on the machine its decode jobs run on, and asks the cluster
for each decode job's wall time from it (config key resources.runtime.decode: auto)."""

from __future__ import annotations

import argparse
import json

from targetrows.core.checks import check_count

from . import STARTED, common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_model_arguments(parser)
    parser.add_argument("--prompts", required=True, nargs="+", help="prompts JSONL files")
    parser.add_argument("--max-new-tokens", type=int, default=common.DECODE.max_new_tokens)
    parser.add_argument("--budgets", type=int, nargs="*", default=[],
                        help="the largest trees the jobs verify (auto's candidates are added)")
    common.add_pool_arguments(parser, auto=False)
    parser.add_argument("--repeats", type=int, default=3, help="timings per pass size")
    parser.add_argument("--out", required=True, help="JSON to write")


def prompt_turns(tokenizer, questions, max_new_tokens: int) -> tuple[list[list[int]], int, int]:
    """(first turns' token ids, prompt turns, tokens of the longest prompt a turn may have): a
    later turn's prompt holds the earlier answers, each counted as `max_new_tokens` tokens."""
    from targetrows.specbench.chat import encode_conversation

    answer = " ".join(["x"] * max_new_tokens)  # about one token per word
    firsts, turns, longest = [], 0, 0
    for q in questions:
        conversation = []
        for i, user in enumerate(q.turns):
            conversation.append(("user", user))
            ids = encode_conversation(tokenizer, conversation)
            if i == 0:
                firsts.append(ids)
            turns, longest = turns + 1, max(longest, len(ids))
            conversation.append(("assistant", answer))
    return firsts, turns, longest


def run(args: argparse.Namespace) -> int:
    import time

    from targetrows.core.atomic import atomic_write_text
    from targetrows.cost.job_time import measure_pair
    from targetrows.specbench.questions import read_questions

    for value, option in ((args.max_new_tokens, "--max-new-tokens"), (args.top_k, "--top-k"),
                          (args.repeats, "--repeats"), *((b, "--budgets") for b in args.budgets)):
        check_count(value, option)
    questions = [q for path in args.prompts for q in read_questions(path)]
    if not questions:
        raise ValueError(f"--prompts {' '.join(args.prompts)}: no questions to time")
    target, draft, tokenizer = common.load_from_args(args)
    load_s = time.perf_counter() - STARTED  # a decode job starts and loads the same way
    firsts, turns, longest = prompt_turns(tokenizer, questions, args.max_new_tokens)
    pair = measure_pair(target, draft, firsts, turns, longest, args.max_new_tokens,
                        args.budgets, args.top_k, load_s, args.repeats)
    atomic_write_text(args.out, json.dumps(pair.to_json(), indent=1) + "\n")
    print(f"part times of {args.target}: one-token target pass "
          f"{1e3 * float(pair.parts.target(1)):.1f} ms, prefill of {longest} tokens "
          f"{pair.prefill_s:.2f} s, {turns} prompt turns, load {load_s:.0f} s -> {args.out}")
    return 0
