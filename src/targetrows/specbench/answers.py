"""Spec-Bench answer files: one JSON line per prompt and budget condition.

An answer line carries Spec-Bench's fields (``question_id``, ``category``, ``model_id``,
``choices: [{index, turns, new_tokens, wall_time, decoding_steps, accept_lengths}]``) plus
targetrows' own: the decoder, its condition (budget, pool depth, whether `auto` picked them;
`ar`, which verifies no tree, records budget 0 and depth 0), how it drafted (`draft_kind`:
eagle3, standalone or none; `overlap`: its root pass ran alongside drafting), the token ids of
each turn and per-round statistics. `targetrows.jobs.decode` writes them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Sequence

from targetrows.core.atomic import atomic_write_text
from targetrows.decoding.loop import DecodeResult

from .questions import Question


def answer_record(
    question: Question,
    model_id: str,
    condition: dict,
    texts: list[str],
    results: list[DecodeResult],
) -> dict:
    """One answer line: Spec-Bench's fields, then the decoder's condition and statistics."""
    rounds = [dataclasses.asdict(r) for res in results for r in res.rounds]
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


def partial_records(path: str) -> Iterator[dict]:
    """The records of a file being appended to (an interrupted run's OUT.partial): a torn last
    line, the one being written when the job was killed, is dropped."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                return


def read_answers(paths: Sequence[str]) -> list[dict]:
    """Every answer record of complete answer files, in order."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records
