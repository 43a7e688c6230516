"""Decoding a prompts file with one decoder, at each budget, into answer JSONL (`targetrows decode`).

The models load once; every budget condition runs over every prompt (MT-bench's second turn is
asked after the decoder's own first answer, as in Spec-Bench). Each finished (prompt, budget)
answer is appended to ``OUT.partial`` at once, so an interrupted job resumes where it stopped;
the complete file appears under its final name only at the end (temp file, then rename).
Seeds are derived per prompt, turn and budget, so a resumed run writes the same tokens as an
uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import zlib

from targetrows.core.atomic import remove_stale_temps

from .answers import Question, answer_record, check_prompt, read_questions, write_jsonl_atomic
from .costmodel import auto_budget
from .loop import DecodeConfig, generate
from .registry import get_decoder


def derive_seed(seed: int, question_id, turn: int, budget: int) -> int:
    return zlib.crc32(f"{seed}:{question_id}:{turn}:{budget}".encode())


def positions_needed(config: DecodeConfig) -> int:
    """Positions past the prompt a turn may reach: its new tokens, and for a tree decoder the
    last round's t0 and tree (verified before the answer is cut to max_new_tokens)."""
    return config.max_new_tokens + (config.depth + 1 if get_decoder(config.decoder).drafts else 0)


def check_question(target, draft, question: Question, turn: int, ids, config: DecodeConfig):
    check_prompt(question.question_id, turn, ids, (target, draft), positions_needed(config),
                 "shorten the prompt or lower --max-new-tokens")


def decode_question(target, draft, tokenizer, question: Question, config: DecodeConfig):
    """(answer texts, DecodeResults) for every turn of one question; errors name the question."""
    from targetrows.decoding.chat import encode_conversation

    conversation, texts, results = [], [], []
    for turn, user in enumerate(question.turns):
        conversation.append(("user", user))
        ids = encode_conversation(tokenizer, conversation)
        check_question(target, draft, question, turn, ids, config)
        seed = derive_seed(config.seed, question.question_id, turn, config.budget)
        turn_config = dataclasses.replace(config, seed=seed)
        try:
            result = generate(target, draft, ids, turn_config)
        except ValueError as err:  # e.g. NaN logits, which name the position: add the prompt
            raise ValueError(f"question {question.question_id!r} turn {turn}: {err}") from err
        text = tokenizer.decode(result.tokens, skip_special_tokens=True)
        conversation.append(("assistant", text))
        texts.append(text)
        results.append(result)
    return texts, results


def _partial_records(path: str):
    """The records of an interrupted run's OUT.partial (a torn last line is dropped)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                return  # the line being written when the job was killed


def _depth_of(record: dict, depth: int) -> int:
    """The pool depth a record's condition ran at: records written before `--budgets auto`
    picked the depth have no field, and ran at --depth (part of the fingerprint)."""
    return int(record.get("depth", depth))


def _auto_choice_of(records: list[dict], fingerprint: str, depth: int) -> tuple[int, int] | None:
    """The (budget, depth) that `--budgets auto` chose in the interrupted run, if any."""
    for record in records:
        if record.get("fingerprint") == fingerprint and record.get("budget_auto"):
            return int(record["budget"]), _depth_of(record, depth)
    return None


def _finished(records: list[dict], keys: set, depth: int) -> dict:
    """Answers already finished by an interrupted run, by (question_id, budget, depth,
    fingerprint)."""
    done = {}
    for record in records:
        key = (str(record.get("question_id")), record.get("budget"), _depth_of(record, depth),
               record.get("fingerprint"))
        if key in keys:
            done[key] = record
    return done


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


@dataclasses.dataclass(frozen=True)
class AnswerSettings:
    """One `decode` job: a decoder and its budget conditions, and what identifies the run (an
    interrupted run's answers are reused only when every field here and the prompts match)."""

    decoder: str
    budgets: tuple = (59,)  # ints, or "auto" (the cost model's pick on this machine)
    temperature: float = 0.0
    max_new_tokens: int = 128
    seed: int = 0
    top_k: int = 10
    depth: int = 6  # pool levels of every budget; "auto" picks its own depth, at most this
    model_id: str = "target"  # model_id in the answers
    draft_name: str | None = None  # the draft's name or path
    dtype: str = "auto"
    progress: bool = True


def answer_file(target, draft, tokenizer, prompts_path: str, out: str,
                s: AnswerSettings) -> None:
    """Decode every question of `prompts_path` at every budget condition into the answers file
    `out` (one line per question and budget), resuming from ``out.partial``. A condition is a
    (budget, pool depth): an integer budget runs at `s.depth`, "auto" at the depth it picks."""
    from .chat import encode_conversation, stop_ids

    questions = read_questions(prompts_path)
    drafts = get_decoder(s.decoder).drafts
    budgets = list(dict.fromkeys(s.budgets)) if drafts else [0]  # ar: one condition, budget 0
    if not drafts:
        draft = None
    shape = DecodeConfig(decoder=s.decoder, max_new_tokens=s.max_new_tokens,
                         top_k=s.top_k, depth=s.depth)
    for q in questions:  # first turns too long for the models fail before anything is written
        ids = encode_conversation(tokenizer, [("user", q.turns[0])])
        check_question(target, draft, q, 0, ids, shape)
    model_id = s.model_id
    # answers in OUT.partial are reused only under the same settings and the same prompts file
    with open(prompts_path, "rb") as f:
        prompts_digest = hashlib.sha256(f.read()).hexdigest()[:16]
    fingerprint = f"{model_id}|{s.draft_name}|{s.decoder}|{s.temperature}|" \
                  f"{s.max_new_tokens}|{s.seed}|{s.top_k}|{s.depth}|{s.dtype}|" \
                  f"{prompts_digest}"
    partial = out + ".partial"
    for path in (out, partial):  # a job killed mid-write (SIGKILL) left its temp file behind
        remove_stale_temps(path)
    interrupted = list(_partial_records(partial))
    auto = None  # the (budget, depth) that --budgets auto chose
    if "auto" in budgets:
        # timings differ from run to run: a resumed run keeps the interrupted run's choice
        auto = _auto_choice_of(interrupted, fingerprint, s.depth)
        if auto is not None:
            print(f"{s.decoder}: budget auto -> {auto[0]} at depth {auto[1]}, as chosen by the "
                  f"interrupted run ({partial})", file=sys.stderr)
        else:  # timed and calibrated on the first question's first turn
            first = encode_conversation(tokenizer, [("user", questions[0].turns[0])])
            choice = auto_budget(target, draft, first, s.decoder, s.temperature,
                                 s.top_k, s.depth)
            print(f"{s.decoder}: {choice.describe()}", file=sys.stderr)
            auto = (choice.budget, choice.depth)
    conditions = sorted({auto if b == "auto" else (b, s.depth) for b in budgets}, reverse=True)
    stops = frozenset(stop_ids(tokenizer, target))
    keys = {(str(q.question_id), b, d, fingerprint) for q in questions for b, d in conditions}
    done = _finished(interrupted, keys, s.depth)
    # keep what survived (atomically: a kill now must not lose it), then append; a run that
    # fails before its first answer leaves no file behind
    if done:
        write_jsonl_atomic(partial, done.values())
    elif os.path.exists(partial):
        os.unlink(partial)
    todo = [(b, d, q) for b, d in conditions for q in questions
            if (str(q.question_id), b, d, fingerprint) not in done]
    bar = _progress(len(todo), s.progress, f"{s.decoder} {model_id}")
    for budget, depth, question in todo:
        config = DecodeConfig(
            decoder=s.decoder, budget=max(budget, 1), temperature=s.temperature,
            max_new_tokens=s.max_new_tokens, top_k=s.top_k, depth=depth,
            seed=s.seed, stop_ids=stops,
        )
        texts, results = decode_question(target, draft, tokenizer, question, config)
        condition = {"decoder": s.decoder, "budget": budget, "depth": depth,
                     "budget_auto": (budget, depth) == auto, "temperature": s.temperature,
                     "seed": s.seed, "fingerprint": fingerprint}
        record = answer_record(question, model_id, condition, texts, results)
        with open(partial, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        done[(str(question.question_id), budget, depth, fingerprint)] = record
        bar.update(1)
    bar.close()
    ordered = [done[(str(q.question_id), b, d, fingerprint)] for b, d in conditions
               for q in questions]
    write_jsonl_atomic(out, ordered)
    if os.path.exists(partial):
        os.unlink(partial)
