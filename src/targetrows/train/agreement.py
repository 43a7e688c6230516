"""How often a draft agrees with its target on prompts that no part of its training drew from or
resembles by construction: Spec-Bench prompt files (the bundled task prompts,
`config/prompts/*.jsonl`, which the pipeline decodes and training never reads), per task
(`targetrows agreement`).

Two figures, both on the target's own greedy path from each prompt's first turn, both models in
float32 on plain linear layers (so the figures do not depend on the machine):

- **online**: the round loop as `targetrows compare --budget 1` runs it (`draft_rank`, budget 1,
  a one-level pool of one token): accepted draft tokens per round, i.e. how often the draft's
  one guess is the target's next token at the positions decoding visits;
- **teacher-forced** (EAGLE-3 heads): the head's top-1 agreement at every position of the
  target's greedy replies, and the acceptance of a greedy chain 1..`depth` tokens deep drafted
  there (`eagle3_train.evaluate`, the figure the training reports on its hand-written held-out
  prompts).

Tasks are pooled weighting each by its positions (teacher-forced) or rounds (online).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from targetrows.specbench.questions import read_questions

from .replies import RepliesConfig, teacher_data


@dataclass(frozen=True)
class AgreementConfig:
    max_new_tokens: int = 48  # greedy tokens per prompt
    depth: int = 4  # teacher-forced chain depths reported
    online: bool = True  # also run the round loop (the `compare --budget 1` figure)
    thinking: bool | None = None  # the chat template's enable_thinking (None: its default)


def task_prompts(tokenizer, paths: Sequence[str]) -> dict[str, list[list[int]]]:
    """{task: the chat-template ids of each question's first turn} of Spec-Bench files."""
    from targetrows.specbench.chat import encode_prompt

    out: dict[str, list[list[int]]] = defaultdict(list)
    for path in paths:
        for q in read_questions(path):
            out[q.category].append(encode_prompt(tokenizer, q.turns[0]))
    if not out:
        raise ValueError(f"no prompts in {list(paths)}")
    return dict(out)


def teacher_forced(target, draft, prompts: dict[str, list[list[int]]], stop: set[int],
                   config: AgreementConfig) -> dict[str, dict]:
    """{task: `eagle3_train.evaluate` on the target's greedy replies} (`target`, `draft`: an
    `HFModel` and the `Eagle3Draft` bound to it)."""
    from .eagle3_train import evaluate

    replies = RepliesConfig(max_new_tokens=config.max_new_tokens, gen_batch=64, top_k=1)
    embed = target.model.get_input_embeddings()
    out = {}
    for task, ids in prompts.items():
        data = teacher_data(target.model, ids, replies, stop, f"greedy replies ({task})",
                            layers=draft.feature_layers)
        out[task] = evaluate(draft.head, embed, data, config.depth)
    return out


def online(target, draft, prompts: dict[str, list[list[int]]], stop: set[int],
           config: AgreementConfig) -> dict[str, dict]:
    """{task: accepted draft tokens per round of `draft_rank` at budget 1 on a one-token pool,
    greedy} through the round loop (any `Model` draft)."""
    from targetrows.core.pool import PoolShape
    from targetrows.decoding.config import DecodeConfig
    from targetrows.decoding.loop import generate

    decode = DecodeConfig("draft_rank", budget=1, max_new_tokens=config.max_new_tokens,
                          pool=PoolShape(top_k=1, depth=1), stop_ids=frozenset(stop))
    out = {}
    for task, ids in prompts.items():
        accepted = rounds = 0
        for p in ids:
            result = generate(target, draft, p, decode)
            accepted += sum(r.accepted for r in result.rounds)
            rounds += len(result.rounds)
        out[task] = {"online_b1": accepted / max(rounds, 1), "rounds": rounds}
    return out


def pooled(per_task: dict[str, dict], value: str, weight: str) -> float:
    total = sum(t[weight] for t in per_task.values())
    return sum(t[value] * t[weight] for t in per_task.values()) / max(total, 1)


def agreement_report(target_dir: str, draft_dir: str, prompt_files: Sequence[str],
                     config: AgreementConfig = AgreementConfig(), **load) -> dict:
    """Both figures for the draft at `draft_dir` (a head or a standalone model) and the target
    at `target_dir`; `load`: more `load_pair` arguments (trust_remote_code, allow_pickle)."""
    from targetrows.hf.eagle3 import Eagle3Draft
    from targetrows.hf.loading import load_pair
    from targetrows.specbench.chat import set_thinking, stop_ids

    start = time.perf_counter()
    target, draft, tokenizer = load_pair(target_dir, draft_dir, "cpu", "cpu", dtype="float32",
                                         draft_dtype="float32", packed=False, **load)
    set_thinking(tokenizer, config.thinking)
    prompts = task_prompts(tokenizer, prompt_files)
    stop = stop_ids(tokenizer, target.model)
    tasks = {task: {"prompts": len(ids)} for task, ids in prompts.items()}
    report = {"target": target_dir, "draft": draft_dir, "prompt_files": list(prompt_files),
              "config": asdict(config), "tasks": tasks}
    if isinstance(draft, Eagle3Draft):
        with torch.inference_mode():
            forced = teacher_forced(target, draft, prompts, stop, config)
        for task, f in forced.items():
            tasks[task].update(teacher_forced_top1=f["top1_agreement"], positions=f["positions"],
                               chain_acceptance_by_depth=f["chain_acceptance_by_depth"])
        report["teacher_forced_top1"] = pooled(tasks, "teacher_forced_top1", "positions")
        report["chain_acceptance_by_depth"] = [
            pooled({t: {"v": v["chain_acceptance_by_depth"][d], "n": v["positions"]}
                    for t, v in tasks.items()}, "v", "n") for d in range(config.depth)]
    if config.online:
        runs = online(target, draft, prompts, stop, config)
        for task, run in runs.items():
            tasks[task].update(run)
        report["online_b1"] = pooled(runs, "online_b1", "rounds")
    report["seconds"] = time.perf_counter() - start
    return report


def markdown(report: dict) -> str:
    """The per-task table: online agreement at B=1, teacher-forced top-1, chain acceptance."""
    depth = len(report.get("chain_acceptance_by_depth", []))
    head = ["task", "prompts", "online B=1", "teacher-forced top-1",
            *(f"chain {d + 1}" for d in range(depth))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    def row(name: str, prompts: int, values: dict) -> None:
        chain = values.get("chain_acceptance_by_depth") or [None] * depth
        cells = [name, str(prompts), cell(values.get("online_b1")),
                 cell(values.get("teacher_forced_top1")), *map(cell, chain)]
        lines.append("| " + " | ".join(cells) + " |")

    for task, t in report["tasks"].items():
        row(task, t["prompts"], t)
    row("all", sum(t["prompts"] for t in report["tasks"].values()), report)
    return "\n".join(lines) + "\n"
