"""Spec-Bench-compatible records: prompts in (question format), answers out (answer format).

A prompts file is JSONL, one question a line: ``question_id``, ``category``, ``turns`` (the user
messages; MT-bench has two). Answers are JSONL too, one line per prompt and condition, with
Spec-Bench's fields (``question_id``, ``category``, ``model_id``,
``choices: [{index, turns, new_tokens, wall_time, decoding_steps, accept_lengths}]``) plus
targetrows' own: the decoder, its condition and per-round statistics.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from targetrows.core.atomic import atomic_write_text

from .loop import DecodeResult


@dataclass(frozen=True)
class Question:
    question_id: str | int
    category: str
    turns: tuple[str, ...]


def read_questions(path: str) -> list[Question]:
    """All questions of a prompts file, or ValueError naming the file, line and field."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompts file {path} does not exist")
    questions, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: each line must be a JSON object")
            for key in ("question_id", "turns"):
                if key not in obj:
                    raise ValueError(f"{where}: missing field {key!r}")
            turns = obj["turns"]
            if isinstance(turns, str) or not isinstance(turns, list) or not turns:
                raise ValueError(f"{where}: 'turns' must be a non-empty list of strings")
            for i, turn in enumerate(turns):
                if not isinstance(turn, str) or not turn.strip():
                    raise ValueError(f"{where}: turn {i} is empty or not a string")
            qid = obj["question_id"]
            if qid in seen:
                raise ValueError(f"{where}: question_id {qid!r} appears twice")
            seen.add(qid)
            questions.append(Question(qid, str(obj.get("category", "")), tuple(turns)))
    if not questions:
        raise ValueError(f"prompts file {path} holds no questions")
    return questions


def check_prompt(question_id, turn: int, ids, models, extra: int, shorten: str) -> None:
    """ValueError naming the question when the prompt `ids` plus `extra` further positions do
    not fit a model's context window, or holds a token id the model cannot embed (a tokenizer
    that does not belong to the model). Models without these attributes (the toy) pass."""
    where = f"question {question_id!r} turn {turn}"
    for model in models:
        if model is None:
            continue
        name = getattr(model, "name", "model")
        embeddings = getattr(model, "n_embeddings", None)
        if embeddings is not None and ids and max(ids) >= embeddings:
            raise ValueError(
                f"{where}: token id {max(ids)} is past the {embeddings} embeddings of {name}: "
                "its tokenizer does not match the model; use the model's own tokenizer files"
            )
        window = getattr(model, "context_window", None)
        if window is not None and len(ids) + extra > window:
            raise ValueError(
                f"{where}: {len(ids)} prompt tokens + {extra} further positions exceed the "
                f"context window of {name} ({window}); {shorten}"
            )


def answer_record(
    question: Question,
    model_id: str,
    condition: dict,
    texts: list[str],
    results: list[DecodeResult],
) -> dict:
    """One answer line: Spec-Bench's fields, then the decoder's condition and statistics."""
    rounds = [asdict(r) for res in results for r in res.rounds]
    return {
        "question_id": question.question_id,
        "category": question.category,
        "model_id": model_id,
        "choices": [
            {
                "index": 0,
                "turns": texts,
                "new_tokens": [len(r.tokens) for r in results],
                "wall_time": [r.wall_time for r in results],
                "decoding_steps": [len(r.rounds) for r in results],
                "accept_lengths": [s["committed"] for s in rounds],
            }
        ],
        **condition,
        "token_ids": [r.tokens for r in results],
        "stop_reasons": [r.stop_reason for r in results],
        "rounds": {key: [s[key] for s in rounds] for key in (rounds[0] if rounds else {})},
    }


def write_jsonl_atomic(path: str, records: Iterable[dict]) -> None:
    """Write all records as JSONL under `path`, atomically (temp file, then rename)."""
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
