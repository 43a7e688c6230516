"""Spec-Bench prompts in: a prompts file is JSONL in Spec-Bench's question format, one question a
line: ``question_id``, ``category``, ``turns`` (the user messages; MT-bench has two), so
Spec-Bench's own ``question.jsonl`` works as it is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass


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
            if isinstance(qid, bool) or not (isinstance(qid, int) or (isinstance(qid, str)
                                                                      and qid.strip())):
                raise ValueError(f"{where}: question_id must be a whole number or a non-empty "
                                 f"string, got {qid!r}: answers are matched to questions by it")
            if qid in seen:
                raise ValueError(f"{where}: question_id {qid!r} appears twice")
            seen.add(qid)
            questions.append(Question(qid, str(obj.get("category", "")), tuple(turns)))
    if not questions:
        raise ValueError(f"prompts file {path} holds no questions")
    return questions


def check_prompt(question_id, turn: int, ids, models, extra: int, shorten: str) -> None:
    """ValueError naming the question when the prompt `ids` plus `extra` further positions do
    not fit a model's context window or its cache (`max_entries`, which `--max-context` sets),
    or holds a token id the model cannot embed (a tokenizer that does not belong to the
    model). Models without these attributes (the toy) pass."""
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
        room = getattr(model, "max_entries", None)
        if room is not None and len(ids) + extra > room:
            raise ValueError(
                f"{where}: {len(ids)} prompt tokens + {extra} further positions exceed the "
                f"{room} entries a sequence of {name} may hold; raise --max-context (config: "
                f"decode.max_context) or {shorten}"
            )
