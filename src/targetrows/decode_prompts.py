"""`targetrows decode`: decode a prompts file with one decoder, at each budget, into answer JSONL.

The models load once; every budget condition runs over every prompt (MT-bench's second turn is
asked after the decoder's own first answer, as in Spec-Bench). Each finished (prompt, budget)
answer is appended to ``OUT.partial`` at once, so an interrupted job resumes where it stopped;
the complete file appears under its final name only at the end (temp file, then rename).
Seeds are derived per prompt, turn and budget, so a resumed run writes the same tokens as an
uninterrupted one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import zlib

from .decode import DECODERS, DecodeConfig, generate
from .specbench import Question, answer_record, read_questions, write_jsonl_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .loading import add_model_arguments

    add_model_arguments(parser)
    parser.add_argument("--prompts", required=True, help="prompts JSONL (Spec-Bench question format)")
    parser.add_argument("--decoder", required=True, choices=DECODERS)
    parser.add_argument("--budgets", type=int, nargs="+", default=[59],
                        help="non-root nodes per tree, one condition each (ignored by ar)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--model-id", default=None, help="model_id in the answers (default: target name)")
    parser.add_argument("--out", required=True, help="answers JSONL to write")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)


def derive_seed(seed: int, question_id, turn: int, budget: int) -> int:
    return zlib.crc32(f"{seed}:{question_id}:{turn}:{budget}".encode())


def context_limit(model) -> int | None:
    config = getattr(getattr(model, "model", None), "config", None)
    return getattr(config, "max_position_embeddings", None)


def decode_question(target, draft, tokenizer, question: Question, config: DecodeConfig,
                    limit: int | None):
    """(answer texts, DecodeResults) for every turn of one question."""
    from .loading import encode_conversation

    conversation, texts, results = [], [], []
    for turn, user in enumerate(question.turns):
        conversation.append(("user", user))
        ids = encode_conversation(tokenizer, conversation)
        if limit is not None and len(ids) + config.max_new_tokens > limit:
            raise ValueError(
                f"question {question.question_id!r} turn {turn}: {len(ids)} prompt tokens + "
                f"{config.max_new_tokens} new tokens exceed the model's context window ({limit}); "
                "shorten the prompt or lower --max-new-tokens"
            )
        seed = derive_seed(config.seed, question.question_id, turn, config.budget)
        turn_config = dataclasses.replace(config, seed=seed)
        result = generate(target, draft, ids, turn_config)
        text = tokenizer.decode(result.tokens, skip_special_tokens=True)
        conversation.append(("assistant", text))
        texts.append(text)
        results.append(result)
    return texts, results


def _load_partial(path: str, keys: set) -> dict:
    """Answers already finished by an interrupted run (a torn last line is dropped)."""
    done = {}
    if not os.path.exists(path):
        return done
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # the line being written when the job was killed
            key = (str(record.get("question_id")), record.get("budget"), record.get("fingerprint"))
            if key in keys:
                done[key] = record
    return done


def run(args: argparse.Namespace) -> int:
    from .loading import load_from_args, stop_ids

    questions = read_questions(args.prompts)  # a bad file fails before any model loads
    budgets = [0] if args.decoder == "ar" else sorted(set(args.budgets), reverse=True)
    for b in budgets:
        if args.decoder != "ar" and b < 1:
            raise ValueError(f"--budgets must be >= 1, got {b}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    if args.decoder != "ar" and not args.draft:
        raise ValueError(f"decoder {args.decoder} needs --draft")
    target, draft, tokenizer = load_from_args(args)
    stops = frozenset(stop_ids(tokenizer, target))
    model_id = args.model_id or os.path.basename(os.path.normpath(args.target))
    fingerprint = f"{model_id}|{args.draft}|{args.temperature}|{args.max_new_tokens}|{args.seed}|" \
                  f"{args.top_k}|{args.depth}"
    keys = {(str(q.question_id), b, fingerprint) for q in questions for b in budgets}
    partial = args.out + ".partial"
    done = _load_partial(partial, keys)
    with open(partial, "w", encoding="utf-8") as f:  # rewrite what survived, then append
        for record in done.values():
            f.write(json.dumps(record) + "\n")
    todo = [(b, q) for b in budgets for q in questions if (str(q.question_id), b, fingerprint) not in done]
    bar = _progress(len(todo), args.progress, f"{args.decoder} {model_id}")
    limit = context_limit(target)
    for budget, question in todo:
        config = DecodeConfig(
            decoder=args.decoder, budget=max(budget, 1), temperature=args.temperature,
            max_new_tokens=args.max_new_tokens, top_k=args.top_k, depth=args.depth,
            seed=args.seed, stop_ids=stops,
        )
        texts, results = decode_question(target, draft if args.decoder != "ar" else None,
                                         tokenizer, question, config, limit)
        condition = {"decoder": args.decoder, "budget": budget, "temperature": args.temperature,
                     "seed": args.seed, "fingerprint": fingerprint}
        record = answer_record(question, model_id, condition, texts, results)
        with open(partial, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        done[(str(question.question_id), budget, fingerprint)] = record
        bar.update(1)
    bar.close()
    ordered = [done[(str(q.question_id), b, fingerprint)] for b in budgets for q in questions]
    write_jsonl_atomic(args.out, ordered)
    os.unlink(partial)
    return 0


def _progress(total: int, enabled: bool, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # the base install has no tqdm: no bar
        enabled = False
    if not enabled:
        class _Silent:
            def update(self, n):
                pass

            def close(self):
                pass

        return _Silent()
    return tqdm(total=total, desc=desc, file=sys.stderr, unit="answer")
