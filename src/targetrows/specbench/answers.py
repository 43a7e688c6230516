"""Spec-Bench answers out: decoding prompts files with one decoder, at each budget condition,
into answer JSONL (`targetrows decode`).

An answer line carries Spec-Bench's fields (``question_id``, ``category``, ``model_id``,
``choices: [{index, turns, new_tokens, wall_time, decoding_steps, accept_lengths}]``) plus
targetrows' own: the decoder, its condition and per-round statistics.

The models load once for every prompts file, and `--budgets auto` picks one budget and depth
for all of them; every budget condition runs over every prompt (MT-bench's second turn is
asked after the decoder's own first answer, as in Spec-Bench). Each finished (prompt, budget)
answer is appended to ``OUT.partial`` at once, so an interrupted job resumes where it stopped;
a complete answers file appears under its final name only when its prompts are done (temp
file, then rename).
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
from collections.abc import Iterable, Sequence

from targetrows.core.atomic import atomic_write_text, remove_stale_temps
from targetrows.cost.calibration import auto_budget
from targetrows.decoding.config import DecodeConfig
from targetrows.decoding.loop import DecodeResult, generate
from targetrows.decoding.registry import get_decoder

from .questions import Question, check_prompt, read_questions


def prompt_key(question: Question) -> str:
    """How rerankers (and row-log scores) name a question: "task/question_id"."""
    return f"{question.category}/{question.question_id}"


def derive_seed(seed: int, question_id, turn: int, budget: int) -> int:
    return zlib.crc32(f"{seed}:{question_id}:{turn}:{budget}".encode())


def positions_needed(config: DecodeConfig) -> int:
    """Positions past the prompt a turn may reach: its new tokens, and for a tree decoder the
    last round's t0 and tree (verified before the answer is cut to max_new_tokens)."""
    extra = config.pool.depth + 1 if get_decoder(config.decoder).drafts else 0
    return config.max_new_tokens + extra


def check_question(target, draft, question: Question, turn: int, ids, config: DecodeConfig):
    check_prompt(question.question_id, turn, ids, (target, draft), positions_needed(config),
                 "shorten the prompt or lower --max-new-tokens")


def decode_question(target, draft, tokenizer, question: Question, config: DecodeConfig):
    """(answer texts, DecodeResults) for every turn of one question; errors name the question."""
    from .chat import encode_conversation

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
    """One `decode` job: its decoder, temperature, new tokens, seed and pool (`decode`; its
    budget is replaced by each condition's), the budget conditions, and what identifies the
    run (an interrupted run's answers are reused only when every field here and the prompts
    match)."""

    decode: DecodeConfig
    budgets: tuple = (59,)  # ints, or "auto" (the cost model's pick on this machine)
    model_id: str = "target"  # model_id in the answers
    draft_name: str | None = None  # the draft's name or path
    dtype: str = "auto"
    progress: bool = True

    def fingerprint(self, prompts_digest: str) -> str:
        d, pool = self.decode, self.decode.pool
        reranker = "" if d.reranker is None else f"|{d.reranker.digest}"
        return (f"{self.model_id}|{self.draft_name}|{d.decoder}|{d.temperature}|"
                f"{d.max_new_tokens}|{d.seed}|{pool.top_k}|{pool.depth}|{self.dtype}|"
                f"{prompts_digest}{reranker}")


@dataclasses.dataclass
class _Job:
    """One prompts file and the answers file it becomes, with what an interrupted run left."""

    prompts: str
    out: str
    questions: list
    fingerprint: str
    interrupted: list

    @property
    def partial(self) -> str:
        return self.out + ".partial"


def _open_job(prompts_path: str, out: str, s: AnswerSettings) -> _Job:
    # answers in OUT.partial are reused only under the same settings and the same prompts file
    with open(prompts_path, "rb") as f:
        fingerprint = s.fingerprint(hashlib.sha256(f.read()).hexdigest()[:16])
    for path in (out, out + ".partial"):  # a job killed mid-write (SIGKILL) left its temp file
        remove_stale_temps(path)
    return _Job(prompts_path, out, read_questions(prompts_path), fingerprint,
                list(_partial_records(out + ".partial")))


def _auto_choice(target, draft, tokenizer, jobs: list[_Job], s: AnswerSettings):
    """The (budget, depth) of the "auto" condition, one for every prompts file: an interrupted
    run's choice (timings differ from run to run, so a resumed run keeps it), else the cost
    model's pick (`auto_budget`), timed and calibrated on each file's first question."""
    from .chat import encode_conversation

    depth = s.decode.pool.depth
    for job in jobs:
        auto = _auto_choice_of(job.interrupted, job.fingerprint, depth)
        if auto is not None:
            print(f"{s.decode.decoder}: budget auto -> {auto[0]} at depth {auto[1]}, as chosen "
                  f"by the interrupted run ({job.partial})", file=sys.stderr)
            return auto
    firsts = [encode_conversation(tokenizer, [("user", job.questions[0].turns[0])])
              for job in jobs]
    choice = auto_budget(target, draft, s.decode, firsts)
    print(f"{s.decode.decoder}: {choice.describe()}", file=sys.stderr)
    return choice.budget, choice.depth


def answer_files(target, draft, tokenizer, files: Sequence[tuple[str, str]],
                 s: AnswerSettings) -> None:
    """Decode every question of each (prompts file, answers file) pair at every budget condition
    into its answers file (one line per question and condition), resuming from ``OUT.partial``.
    A condition is a (budget, pool depth): an integer budget runs at the pool's depth, "auto" at
    the budget and depth the cost model picks once for all the files. Each answers file appears
    complete under its name (temp file, then rename) as soon as its prompts are done."""
    from .chat import encode_conversation

    base, depth = s.decode, s.decode.pool.depth
    drafts = get_decoder(base.decoder).drafts
    budgets = list(dict.fromkeys(s.budgets)) if drafts else [0]  # ar: one condition, budget 0
    if not drafts:
        draft = None
    jobs = [_open_job(prompts, out, s) for prompts, out in files]
    for job in jobs:  # first turns too long for the models fail before anything is written
        for q in job.questions:
            ids = encode_conversation(tokenizer, [("user", q.turns[0])])
            check_question(target, draft, q, 0, ids, base)
    auto = _auto_choice(target, draft, tokenizer, jobs, s) if "auto" in budgets else None
    conditions = sorted({auto if b == "auto" else (b, depth if drafts else 0) for b in budgets},
                        reverse=True)  # ar's one condition: budget 0, no pool
    for job in jobs:
        _answer_job(target, draft, tokenizer, job, conditions, auto, s)


def _answer_job(target, draft, tokenizer, job: _Job, conditions, auto, s: AnswerSettings):
    from .chat import stop_ids

    base, depth, questions, fingerprint = s.decode, s.decode.pool.depth, job.questions, \
        job.fingerprint
    stops = frozenset(stop_ids(tokenizer, target))
    keys = {(str(q.question_id), b, d, fingerprint) for q in questions for b, d in conditions}
    done = _finished(job.interrupted, keys, depth)
    # keep what survived (atomically: a kill now must not lose it), then append; a run that
    # fails before its first answer leaves no file behind
    if done:
        write_jsonl_atomic(job.partial, done.values())
    elif os.path.exists(job.partial):
        os.unlink(job.partial)
    todo = [(b, d, q) for b, d in conditions for q in questions
            if (str(q.question_id), b, d, fingerprint) not in done]
    bar = _progress(len(todo), s.progress, f"{base.decoder} {s.model_id}")
    for budget, at_depth, question in todo:
        config = dataclasses.replace(base, budget=max(budget, 1), stop_ids=stops)
        if at_depth:  # (ar's condition has no pool: depth 0)
            config = dataclasses.replace(config, pool=dataclasses.replace(base.pool,
                                                                          depth=at_depth))
        if base.reranker is not None:  # cross-fitted: a model that never saw this question
            config = dataclasses.replace(config, reranker=base.reranker.for_prompt(
                prompt_key(question)))
        texts, results = decode_question(target, draft, tokenizer, question, config)
        condition = {"decoder": base.decoder, "budget": budget, "depth": at_depth,
                     "budget_auto": (budget, at_depth) == auto, "temperature": base.temperature,
                     "seed": base.seed, "fingerprint": fingerprint}
        record = answer_record(question, s.model_id, condition, texts, results)
        with open(job.partial, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        done[(str(question.question_id), budget, at_depth, fingerprint)] = record
        bar.update(1)
    bar.close()
    ordered = [done[(str(q.question_id), b, d, fingerprint)] for b, d in conditions
               for q in questions]
    write_jsonl_atomic(job.out, ordered)
    if os.path.exists(job.partial):
        os.unlink(job.partial)


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
