"""A resumable decode job (`targetrows decode`): prompts files in, Spec-Bench answer files out
(`targetrows.specbench.answers`), one decoder at each of its budget conditions.

The models load once for every prompts file, and an `Auto` budget is picked once for all of
them (`auto_condition`); every condition runs over every prompt (MT-bench's second turn is asked
after the decoder's own first answer, as in Spec-Bench). Each finished (prompt, condition)
answer is appended to ``OUT.partial`` at once, so an interrupted job resumes where it stopped;
a complete answers file appears under its final name only when its prompts are done (temp
file, then rename). Seeds are derived per prompt, turn and budget, so a resumed run writes the
same tokens as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import zlib
from collections.abc import Sequence

from targetrows.core.atomic import remove_stale_temps
from targetrows.core.passes import Passes
from targetrows.cost.calibration import auto_budget
from targetrows.cost.parttimes import mean_context_len
from targetrows.cost.rounds import DEFAULT_BUDGETS
from targetrows.decoding.batch import check_batchable
from targetrows.decoding.budget import (
    NO_TREE,
    Auto,
    Budget,
    Fixed,
    condition_text,
)
from targetrows.decoding.config import DecodeConfig, condition_config
from targetrows.decoding.loop import decode_passes, new_state
from targetrows.decoding.model import draft_kind, overlaps
from targetrows.decoding.schedule import run_batched
from targetrows.specbench.answers import answer_record, partial_records, write_jsonl_atomic
from targetrows.specbench.chat import encode_conversation, stop_ids
from targetrows.specbench.questions import Question, check_prompt, read_questions

Condition = tuple[int, int]  # (budget, pool depth) a set of answers ran at
NO_DRAFTING = {"draft_kind": "none", "overlap": False}  # how answers with no tree drafted


def prompt_key(question: Question) -> str:
    """How rerankers (and row-log scores) name a question: "task/question_id"."""
    return f"{question.category}/{question.question_id}"


def derive_seed(seed: int, question_id, turn: int, budget: int | None) -> int:
    # ar (no budget) seeds as budget 1, as every run did before a budget could be absent
    return zlib.crc32(f"{seed}:{question_id}:{turn}:{budget or 1}".encode())


def positions_needed(config: DecodeConfig) -> int:
    """Positions past the prompt a turn may reach: its new tokens, and for a tree decoder the
    last round's t0 and tree (verified before the answer is cut to max_new_tokens): a pool's
    depth, or a draft-free tree's budget (a chain of B nodes at most; under `auto`, the
    largest budget it may pick)."""
    if not config.decoder.drafts:
        return config.max_new_tokens
    if config.decoder.needs_draft:
        return config.max_new_tokens + config.pool.depth + 1
    return config.max_new_tokens + max(config.budget or 0, *DEFAULT_BUDGETS) + 1


def check_question(target, draft, question: Question, turn: int, ids, config: DecodeConfig):
    check_prompt(question.question_id, turn, ids, (target, draft), positions_needed(config),
                 "shorten the prompt or lower --max-new-tokens")


def decode_question(target, draft, tokenizer, question: Question, config: DecodeConfig,
                    state=None) -> Passes:
    """(answer texts, DecodeResults) for every turn of one question, as steps that ask for
    their passes (`targetrows.decoding.batch` runs them); errors name the question. `state`: a
    draft-free decoder's state kept from question to question (`generate`)."""
    conversation, texts, results = [], [], []
    for turn, user in enumerate(question.turns):
        conversation.append(("user", user))
        ids = encode_conversation(tokenizer, conversation)
        check_question(target, draft, question, turn, ids, config)
        seed = derive_seed(config.seed, question.question_id, turn, config.budget)
        try:
            result = yield from decode_passes(target, draft, ids,
                                              dataclasses.replace(config, seed=seed), state)
        except ValueError as err:  # e.g. NaN logits, which name the position: add the prompt
            raise ValueError(f"question {question.question_id!r} turn {turn}: {err}") from err
        text = tokenizer.decode(result.tokens, skip_special_tokens=True)
        conversation.append(("assistant", text))
        texts.append(text)
        results.append(result)
    return texts, results


@dataclasses.dataclass(frozen=True)
class DecodeJobSettings:
    """One decode job: its decoder, temperature, new tokens, seed and pool (`decode`; its
    budget is replaced by each condition's), the budget conditions, and what identifies the
    run (an interrupted run's answers are reused only when every field here and the prompts
    match)."""

    decode: DecodeConfig
    budgets: tuple[Budget, ...] = (Fixed(59),)  # Fixed or Auto; a decoder without a tree: none
    model_id: str = "target"  # model_id in the answers
    draft_name: str | None = None  # the draft's name or path
    dtype: str = "auto"
    progress: bool = True

    def fingerprint(self, prompts_digest: str) -> str:
        d, pool = self.decode, self.decode.pool
        reranker = "" if d.reranker is None else f"|{d.reranker.digest}"
        recycled = ("" if d.decoder.new_state is None else
                    f"|k{d.recycle_k}|{'kept' if d.keep_across_prompts else 'fresh'}")
        batched = "" if d.batch_size == 1 else f"|batch{d.batch_size}"
        return (f"{self.model_id}|{self.draft_name}|{d.name}|{d.temperature}|"
                f"{d.max_new_tokens}|{d.seed}|{pool.top_k}|{pool.depth}|{self.dtype}|"
                f"{prompts_digest}{reranker}{recycled}{batched}")


@dataclasses.dataclass
class _File:
    """One prompts file and the answers file it becomes, with what an interrupted run left."""

    prompts: str
    out: str
    questions: list
    fingerprint: str
    interrupted: list

    @property
    def partial(self) -> str:
        return self.out + ".partial"


def _open_file(prompts_path: str, out: str, s: DecodeJobSettings) -> _File:
    # answers in OUT.partial are reused only under the same settings and the same prompts file
    with open(prompts_path, "rb") as f:
        fingerprint = s.fingerprint(hashlib.sha256(f.read()).hexdigest()[:16])
    for path in (out, out + ".partial"):  # a job killed mid-write (SIGKILL) left its temp file
        remove_stale_temps(path)
    return _File(prompts_path, out, read_questions(prompts_path), fingerprint,
                 list(partial_records(out + ".partial")))


def _depth_of(record: dict, depth: int) -> int:
    """The pool depth a record's condition ran at: records written before `--budgets auto`
    picked the depth have no field, and ran at --depth (part of the fingerprint)."""
    return int(record.get("depth", depth))


def auto_condition(target, draft, tokenizer, files: list[_File],
                   s: DecodeJobSettings) -> Condition:
    """The (budget, depth) of the `Auto` condition, one for every prompts file: an interrupted
    run's choice (timings differ from run to run, so a resumed run keeps it), else the cost
    model's pick (`auto_budget`), timed at the mean context of the job's runs and calibrated on
    each file's first question. (NO_TREE, NO_TREE) where no tree beats ar's one pass per
    token: the condition then decodes as ar (`_condition_config`)."""
    depth = s.decode.pool.depth
    for file in files:
        for record in file.interrupted:
            if record.get("fingerprint") == file.fingerprint and record.get("budget_auto"):
                auto = int(record["budget"]), _depth_of(record, depth)
                print(f"{s.decode.name}: budget auto -> {condition_text(*auto)}, as chosen "
                      f"by the interrupted run ({file.partial})", file=sys.stderr)
                return (NO_TREE, NO_TREE) if auto[0] == NO_TREE else auto
    firsts = [file.questions[0] for file in files]
    ids = [encode_conversation(tokenizer, [("user", q.turns[0])]) for q in firsts]
    # a learned rule calibrates each prompt with the fold model that never saw it, as it decodes
    configs = [_condition_config(s.decode, s.decode.budget, 0, q, s.decode.stop_ids)
               for q in firsts]
    lengths = [len(encode_conversation(tokenizer, [("user", q.turns[0])]))
               for file in files for q in file.questions]
    choice = auto_budget(target, draft, s.decode, ids, prompt_configs=configs,
                         context_len=mean_context_len(lengths, s.decode.max_new_tokens))
    print(f"{s.decode.name}: {choice.describe()}", file=sys.stderr)
    return choice.condition()


def conditions_of(s: DecodeJobSettings, auto: Condition | None) -> list[Condition]:
    """The job's (budget, depth) conditions, largest budget first: each Fixed budget at the
    pool's depth, Auto at its pick (no tree: (0, 0), last); a decoder without a tree (ar) has
    one, (0, 0)."""
    if not s.decode.decoder.drafts:
        return [(NO_TREE, NO_TREE)]
    depth = s.decode.pool.depth
    return sorted({auto if isinstance(b, Auto) else (b.nodes, depth) for b in s.budgets},
                  reverse=True)


def answer_files(target, draft, tokenizer, files: Sequence[tuple[str, str]],
                 s: DecodeJobSettings) -> None:
    """Decode every question of each (prompts file, answers file) pair at every budget condition
    into its answers file (one line per question and condition), resuming from ``OUT.partial``.
    Each answers file appears complete under its name (temp file, then rename) as soon as its
    prompts are done."""
    if not s.decode.decoder.needs_draft:
        draft = None
    opened = [_open_file(prompts, out, s) for prompts, out in files]
    for file in opened:  # first turns too long for the models fail before anything is written
        for q in file.questions:
            ids = encode_conversation(tokenizer, [("user", q.turns[0])])
            check_question(target, draft, q, 0, ids, s.decode)
    check_batchable([s.decode], s.decode.batch_size)
    wants_auto = s.decode.decoder.drafts and any(isinstance(b, Auto) for b in s.budgets)
    auto = auto_condition(target, draft, tokenizer, opened, s) if wants_auto else None
    # a draft-free decoder's state per condition, carried over every prompts file's questions
    # when the config keeps it across prompts (else each question starts afresh anyway)
    states = {c: new_state(target, s.decode) for c in conditions_of(s, auto)}
    for file in opened:
        _answer_file(target, draft, tokenizer, file, conditions_of(s, auto), auto, s, states)


def _finished(file: _File, keys: set, depth: int) -> dict:
    """Answers already finished by an interrupted run, by (question_id, budget, depth,
    fingerprint)."""
    done = {}
    for record in file.interrupted:
        key = (str(record.get("question_id")), record.get("budget"), _depth_of(record, depth),
               record.get("fingerprint"))
        if key in keys:
            done[key] = record
    return done


def _answer_file(target, draft, tokenizer, file: _File, conditions: list[Condition],
                 auto: Condition | None, s: DecodeJobSettings, states: dict) -> None:
    base, depth, fingerprint = s.decode, s.decode.pool.depth, file.fingerprint
    stops = frozenset(stop_ids(tokenizer, target))
    keys = {(str(q.question_id), b, d, fingerprint) for q in file.questions for b, d in conditions}
    done = _finished(file, keys, depth)
    # keep what survived (atomically: a kill now must not lose it), then append; a run that
    # fails before its first answer leaves no file behind
    if done:
        write_jsonl_atomic(file.partial, done.values())
    elif os.path.exists(file.partial):
        os.unlink(file.partial)
    # every answer in order, those done marked not needed: the batch scheduler runs the
    # segments that hold one still to do whole, so their batches are those of an
    # uninterrupted run, and a resumed run writes the same tokens (`run_batched`)
    every = [(b, d, q) for b, d in conditions for q in file.questions]
    needed = [(str(q.question_id), b, d, fingerprint) not in done for b, d, q in every]
    bar = _progress(sum(needed), s.progress, f"{base.name} {s.model_id}")
    # how this run drafts, for the tables: the claims about speed hold only with the root pass
    # alongside drafting, and some only with a standalone draft
    setup = {"draft_kind": draft_kind(draft),
             "overlap": base.decoder.root_pass and overlaps(target, draft, base.overlap)}

    def job(budget: int, at_depth: int, question: Question):
        config = _condition_config(base, budget, at_depth, question, stops)
        # a state kept from question to question runs at batch size 1 (`check_batchable`);
        # in a batch each question starts afresh, as it does at batch 1 without keeping
        state = states[budget, at_depth] if base.batch_size == 1 else None
        return lambda t, d: decode_question(t, d, tokenizer, question, config, state)

    def answered(j: int, out) -> None:  # written as each finishes: a killed run keeps it
        budget, at_depth, question = every[j]
        if not needed[j]:  # done before, redone as a companion of answers still to do
            return
        texts, results = out
        condition = {"decoder": base.name, "budget": budget, "depth": at_depth,
                     "budget_auto": (budget, at_depth) == auto, "temperature": base.temperature,
                     "seed": base.seed, "batch_size": base.batch_size,
                     **(NO_DRAFTING if budget == NO_TREE else setup),
                     "fingerprint": fingerprint}
        record = answer_record(question, s.model_id, condition, texts, results)
        with open(file.partial, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        done[(str(question.question_id), budget, at_depth, fingerprint)] = record
        bar.update(1)

    def failed(j: int, err: Exception) -> None:  # its neighbours run on (`run_batched`)
        budget, at_depth, question = every[j]
        print(f"{base.name}: question {question.question_id!r} at "
              f"{condition_text(budget, at_depth)} failed: {err}", file=sys.stderr)

    run_batched(target, draft, [job(*x) for x in every], base.batch_size, on_done=answered,
                needed=needed, on_failed=failed)
    bar.close()
    write_jsonl_atomic(file.out, [done[(str(q.question_id), b, d, fingerprint)]
                                  for b, d in conditions for q in file.questions])
    if os.path.exists(file.partial):
        os.unlink(file.partial)


def _condition_config(base: DecodeConfig, budget: int, depth: int, question: Question,
                      stops: frozenset) -> DecodeConfig:
    """The config of one question at one condition: its budget and pool depth (ar: none), the
    tokenizer's stop tokens, and a learned rule's model that never saw this question. A tree
    decoder's condition of no tree (`auto` found none faster) decodes as ar
    (`condition_config`)."""
    config = condition_config(dataclasses.replace(base, stop_ids=stops), budget, depth)
    if config.reranker is not None:  # cross-fitted: a model that never saw this question
        config = dataclasses.replace(config, reranker=config.reranker.for_prompt(
            prompt_key(question)))
    return config


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
