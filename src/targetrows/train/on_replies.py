"""What both trainings on a target's replies share (`targetrows distill`, `targetrows
train-eagle3`): the output folder refused unless forced, the target loaded (and its output head
checked), its replies read from a folder or generated now, a model built and fitted within an
optional time cap, a report of what it reached and cost, and the folder written whole (a temp
folder, then a rename).

A training says only what differs (`Training`): how its model is built from the target and the
training replies, how it is fitted, what its report adds, and how it is saved.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import torch

from targetrows.core.atomic import new_folder

from .replies import RepliesConfig, TeacherData, load_target, replies_for
from .reply_generation import check_head


class Training(Protocol):
    config: object  # a dataclass: its fields go into the report; `train_minutes` caps fitting
    report_name: str  # the report's file in the output folder
    data: RepliesConfig  # the replies to generate when no folder is given
    device: str  # where the model trains, and the target runs when it generates the replies now
    seed: int | None  # torch's global seed before anything is loaded, if the training wants one

    def build(self, target, tokenizer, train: TeacherData):
        """The model to fit, and whatever else `fit`, `describe` and `save` need."""

    def fit(self, state, train: TeacherData, deadline: float | None) -> list[float]:
        """Fit the model in place; the loss of each step taken (none after `deadline`)."""

    def describe(self, state, target, train: TeacherData, held: TeacherData) -> dict:
        """The report's own figures (agreement on the held-out replies, costs)."""

    def save(self, state, tokenizer, folder: Path) -> None:
        """Write the model into `folder`."""


def train_on_replies(training: Training, target_dir: str, out: str | Path,
                     replies: str | Path | None = None, force: bool = False) -> dict:
    """Train `training`'s model for the target at `target_dir` on the replies folder `replies`
    (or replies generated now) into folder `out`; return the report (also in the folder). The
    target runs on `training.device` when it generates the replies now; with a replies folder it
    is only read (its weights, its cost timed), on the CPU, and `training.build` moves what the
    model trains with to its device."""
    out = Path(out)
    if out.exists() and not force:
        raise ValueError(f"{out} already exists; pass --force to replace it")
    start = time.perf_counter()
    if training.seed is not None:
        torch.manual_seed(training.seed)
    tokenizer, target = load_target(target_dir, training.device if replies is None else "cpu")
    check_head(target)  # before the replies, which may take minutes to generate
    train, held, data_summary = replies_for(target, tokenizer, replies, training.data)
    data_s = time.perf_counter() - start

    state = training.build(target, tokenizer, train)
    train_start = time.perf_counter()
    minutes = training.config.train_minutes
    losses = training.fit(state, train, None if minutes is None else train_start + 60 * minutes)
    train_s = time.perf_counter() - train_start

    report = {
        "target": str(target_dir), "config": asdict(training.config),
        "replies": str(replies) if replies is not None else None, "data": data_summary,
        **training.describe(state, target, train, held),
        "train_prompts": len(train.sequences), "train_positions": len(train.hidden),
        "steps_done": len(losses), "loss_first": losses[0] if losses else None,
        "loss_last": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "data_seconds": data_s, "train_seconds": train_s,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    report["total_seconds"] = time.perf_counter() - start
    with new_folder(out, force) as tmp:
        training.save(state, tokenizer, tmp)
        (tmp / training.report_name).write_text(json.dumps(report, indent=2) + "\n")
    return report
