"""Temperature-0 drift of decode answers: every decoder's answers against `ar`'s, token by
token, and at each parting the gap between the target's logits of the two tokens there against
what rounding between pass shapes moves its rows (`targetrows.bench.drift.explain_parting`).
What `targetrows drift` writes and the pipeline's `drift` table reads.

Answers are matched by task, question and turn. A multi-turn question is compared turn by turn
until its first parting: the next turn's prompt holds each decoder's own first answer, so
after a parting the two no longer answer the same prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from targetrows.specbench.chat import encode_conversation
from targetrows.specbench.questions import Question

from .drift import explain_parting

FIELDS = ("task", "question_id", "decoder", "budget", "depth", "budget_auto", "turns",
          "identical", "turn", "position", "gap", "gap_steps", "threshold_steps", "near_tie",
          "dtype")


def _key(record: Mapping) -> tuple[str, str]:
    return str(record["category"]), str(record["question_id"])


def record_drift(target, tokenizer, question: Question, reference: Mapping,
                 record: Mapping) -> dict:
    """One answer record against `ar`'s record of the same question: identical, or where its
    tokens first part from ar's (turn, new token) and whether rounding explains it there."""
    row = {"task": question.category, "question_id": str(question.question_id),
           "decoder": record["decoder"], "budget": record["budget"], "depth": record["depth"],
           "budget_auto": record.get("budget_auto", False), "turns": len(question.turns),
           "identical": True}
    conversation = []
    for turn, user in enumerate(question.turns):
        conversation.append(("user", user))
        ours, theirs = record["token_ids"][turn], reference["token_ids"][turn]
        if ours != theirs:
            prompt = encode_conversation(tokenizer, conversation)
            # a run decoded in batches rounds by the batch's shapes too
            p = explain_parting(target, prompt, theirs, ours,
                                max(int(record.get("batch_size", 1)),
                                    int(reference.get("batch_size", 1))))
            row.update(identical=False, turn=turn, position=p.position, gap=p.gap,
                       gap_steps=p.gap_steps, threshold_steps=p.threshold_steps,
                       near_tie=p.near_tie, dtype=p.dtype)
            return row
        conversation.append(("assistant", reference["choices"][0]["turns"][turn]))
    return row


def answer_drift(target, tokenizer, questions: Iterable[Question], reference: Iterable[Mapping],
                 runs: Iterable[Mapping]) -> list[dict]:
    """A row per answer record in `runs` (any decoders, tasks and conditions; ar's own records
    are left out) against `reference`, ar's records, matched by task and question id. A record
    whose question or reference answer is missing raises, naming it."""
    by_key = {(q.category, str(q.question_id)): q for q in questions}
    ref = {_key(r): r for r in reference}
    rows = []
    for record in runs:
        if record["decoder"] == "ar":
            continue
        key = _key(record)
        if key not in by_key or key not in ref:
            missing = "question" if key not in by_key else "ar answer"
            raise ValueError(f"{record['decoder']} answer to {key[0]}/{key[1]} has no "
                             f"{missing} to compare with; pass its prompts file and ar's answers")
        if record.get("temperature", 0) != 0:
            raise ValueError(f"{record['decoder']} answer to {key[0]}/{key[1]} was decoded at "
                             f"temperature {record['temperature']}; drift compares greedy runs")
        rows.append(record_drift(target, tokenizer, by_key[key], ref[key], record))
    return rows
