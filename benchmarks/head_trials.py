"""What raises an EAGLE-3 head's agreement with its target on prompts its training never read, per
minute of CPU: each trial builds a head (`targetrows replies` with the trial's data options, or
the replies of an earlier trial, then `targetrows train-eagle3` with its training options) and
measures it with `targetrows agreement` on the bundled task prompts, split in two: questions 4-5
of each task choose between trials (dev: teacher-forced, 96 greedy tokens each), questions 1-3
report (test, the prompts the bench uses: online at budget 1 and teacher-forced, 48 tokens).

    python benchmarks/head_trials.py --target resources/models/smollm2-135m-instruct \
        --work /tmp/trials --trial base --trial ttt4 --train-args "--ttt-steps 4 --steps 700"
    python benchmarks/head_trials.py --work /tmp/trials --report benchmarks/results/head_trials.md

A trial is run once: its line in WORK/trials.jsonl (settings, times, both figures) is kept, and
--report renders every line as a table. Replies are cached by their options in WORK/replies/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK_FILES = sorted((ROOT / "config" / "prompts").glob("*.jsonl"))
SPLITS = {"dev": slice(3, 5), "test": slice(0, 3)}
MAX_NEW_TOKENS = {"dev": 96, "test": 48}  # greedy tokens per prompt measured


def split_prompts(work: Path) -> dict[str, list[str]]:
    """{split: prompt files}: each task's questions cut by `SPLITS` (in file order)."""
    out = {}
    for name, cut in SPLITS.items():
        folder = work / "prompts" / name
        folder.mkdir(parents=True, exist_ok=True)
        for path in TASK_FILES:
            lines = path.read_text().splitlines()[cut]
            (folder / path.name).write_text("".join(line + "\n" for line in lines))
        out[name] = sorted(str(p) for p in folder.glob("*.jsonl"))
    return out


def targetrows(*args: str, log: Path) -> float:
    """Run `targetrows ARGS` with this Python, its output to `log`; the seconds it took."""
    argv = [sys.executable, "-m", "targetrows.cli", *map(str, args)]
    start = time.perf_counter()
    with open(log, "w") as f:
        print("$ " + shlex.join(argv), file=f, flush=True)
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        raise SystemExit(f"targetrows {args[0]} failed ({rc}); see {log}")
    return time.perf_counter() - start


def run_trial(args, name: str, work: Path, splits: dict) -> dict:
    replies_args = shlex.split(args.replies_args)
    key = hashlib.sha256(json.dumps([args.target, replies_args]).encode()).hexdigest()[:12]
    replies = work / "replies" / key
    trial = work / "trials" / name
    trial.mkdir(parents=True, exist_ok=True)
    replies_s = None
    if not replies.exists():
        replies_s = targetrows("replies", "--target", args.target, "--out", replies,
                               "--threads", args.threads, *replies_args, log=trial / "replies.log")
    head = trial / "head"
    train_s = targetrows("train-eagle3", "--target", args.target, "--replies", replies,
                         "--out", head, "--force", "--threads", args.threads,
                         *shlex.split(args.train_args), log=trial / "train.log")
    figures = {}
    for split, files in splits.items():  # dev: teacher-forced only (the cheap figure)
        out = trial / f"agreement_{split}.json"
        targetrows("agreement", "--target", args.target, "--draft", head, "--prompts", *files,
                   "--max-new-tokens", MAX_NEW_TOKENS[split], "--threads", args.threads,
                   *([] if split == "test" else ["--no-online"]), "--json", out,
                   log=trial / f"agreement_{split}.log")
        figures[split] = json.loads(out.read_text())
    report = json.loads((head / "train_eagle3_report.json").read_text())
    with open(replies / "replies.json") as f:
        data = json.load(f)
    return {
        "trial": name, "replies_args": args.replies_args, "train_args": args.train_args,
        "replies_seconds": replies_s if replies_s is not None else data.get("seconds"),
        "train_seconds": train_s, "train_positions": report["train_positions"],
        "handwritten_top1": report["heldout_top1_agreement"],
        **{f"{split}_{key}": figures[split].get(key) for split in splits
           for key in ("online_b1", "teacher_forced_top1", "chain_acceptance_by_depth")},
        "threads": args.threads, "note": args.note,
    }


def f(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def by_task(rows: list[dict], work: Path) -> list[str]:
    """Online B=1 on the test prompts per task, from each trial's agreement report kept in
    WORK (three prompts a task: a coarse figure, which shows where a change lands)."""
    reports = {r["trial"]: work / "trials" / r["trial"] / "agreement_test.json" for r in rows}
    reports = {k: json.loads(p.read_text()) for k, p in reports.items() if p.exists()}
    if not reports:
        return []
    tasks = sorted({t for rep in reports.values() for t in rep["tasks"]})
    lines = ["", "Test online B=1 by task (three prompts each):", "",
             "| trial | " + " | ".join(tasks) + " |", "|" + "---|" * (len(tasks) + 1)]
    for name, rep in reports.items():
        cells = [f(rep["tasks"].get(t, {}).get("online_b1")) for t in tasks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def render(rows: list[dict], work: Path | None = None) -> str:
    lines = ["Each trial: `targetrows replies` (its options) and `targetrows train-eagle3` (its "
             "options) on the embedded target, 2 threads; minutes: the two jobs' wall time. "
             "Top-1: teacher-forced agreement on the target's greedy replies (dev: 96 tokens of "
             "questions 4-5 of each task; test: 48 tokens of questions 1-3); online B=1: "
             "accepted draft tokens per round of `draft_rank` at budget 1 on the test prompts; "
             "test chain 2: both of a 2-token greedy chain right. Hand-written: the training "
             "report's figure on its 64 held-out prompts.", "",
             "| trial | replies options | training options | data + training minutes | "
             "hand-written top-1 | dev top-1 | test top-1 | test online B=1 | test chain 2 |",
             "|" + "---|" * 9]
    for r in rows:
        minutes = ((r["replies_seconds"] or 0) + r["train_seconds"]) / 60
        chain = r.get("test_chain_acceptance_by_depth") or [None, None]
        lines.append(f"| {r['trial']} | `{r['replies_args'] or 'default'}` | "
                     f"`{r['train_args'] or 'default'}` | {minutes:.1f} | "
                     f"{f(r['handwritten_top1'])} | {f(r['dev_teacher_forced_top1'])} | "
                     f"{f(r['test_teacher_forced_top1'])} | "
                     f"{f(r['test_online_b1'])} | {f(chain[1])} |")
    if work is not None:
        lines += by_task(rows, work)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="resources/models/smollm2-135m-instruct")
    p.add_argument("--work", required=True, help="folder for replies, heads and trials.jsonl")
    p.add_argument("--trial", default=None, help="name of the trial to run")
    p.add_argument("--replies-args", default="", help="targetrows replies options")
    p.add_argument("--train-args", default="", help="targetrows train-eagle3 options")
    p.add_argument("--threads", default="2")
    p.add_argument("--note", default="")
    p.add_argument("--report", default=None, help="render trials.jsonl as Markdown here")
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "trials.jsonl"
    if args.trial:
        row = run_trial(args, args.trial, work, split_prompts(work))
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    table = render(rows, work)
    print(table)
    if args.report:
        from targetrows.core.atomic import atomic_write_text

        atomic_write_text(args.report, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
