"""Long prompts for `targetrows bench`: the questions of a Spec-Bench question file whose first
turn, in the target's chat template, is between --min-tokens and --max-tokens tokens long.

Spec-Bench's summarization (CNN/DailyMail articles) and retrieval (Natural Questions with their
passages) questions run to 500-1,000 tokens: where attention's cost over the context shows,
and where the cost model must price passes at the context the prompts have. The questions are
public benchmark data that nothing here was trained on or written to resemble.

    git clone https://github.com/hemingkx/Spec-Bench  # data/spec_bench/question.jsonl
    python benchmarks/long_prompts.py --questions Spec-Bench/data/spec_bench/question.jsonl \
        --target resources/models/smollm2-135m-instruct --categories summarization rag \
        --per-category 6 --out long_prompts.jsonl
    targetrows bench --target ... --draft ... --prompts long_prompts.jsonl --budget auto
"""

from __future__ import annotations

import argparse
import json
import sys

from targetrows.core.atomic import atomic_write_text
from targetrows.hf.loading import load_tokenizer
from targetrows.specbench.chat import encode_conversation
from targetrows.specbench.questions import read_questions


def long_questions(questions, tokenizer, categories, low: int, high: int, per_category: int):
    """(question, prompt tokens) of the first `per_category` questions of each category, in file
    order, whose first turn encodes to low..high tokens."""
    taken: dict[str, int] = {c: 0 for c in categories}
    out = []
    for q in questions:
        if q.category not in taken or taken[q.category] >= per_category:
            continue
        n = len(encode_conversation(tokenizer, [("user", q.turns[0])]))
        if low <= n <= high:
            out.append((q, n))
            taken[q.category] += 1
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", required=True, help="a Spec-Bench question.jsonl")
    parser.add_argument("--target", required=True, help="the target model folder (its tokenizer)")
    parser.add_argument("--categories", nargs="+", default=["summarization", "rag"])
    parser.add_argument("--min-tokens", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--per-category", type=int, default=6)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.target)
    picked = long_questions(read_questions(args.questions), tokenizer, args.categories,
                            args.min_tokens, args.max_tokens, args.per_category)
    if not picked:
        print(f"no question of {args.categories} has {args.min_tokens}-{args.max_tokens} prompt "
              "tokens", file=sys.stderr)
        return 1
    atomic_write_text(args.out, "".join(
        json.dumps({"question_id": q.question_id, "category": q.category,
                    "turns": [q.turns[0]]}) + "\n" for q, _ in picked))
    lengths = ", ".join(f"{q.category} {q.question_id}: {n}" for q, n in picked)
    print(f"{len(picked)} prompts ({lengths} tokens) -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
