"""Each task's prompts in Spec-Bench's question format (question_id, category, turns).

`bundled`: the first n prompts of config/prompts/{task}.jsonl (written for this project).
`datasets`: n prompts of the task's dataset on the Hugging Face hub (or the mirror named by
HF_ENDPOINT), a seeded sample kept in dataset order (all of them, in order, when the split has no
more than n), each turned into the user message(s) below. MT-bench keeps its two turns; every
other task has one.
"""

import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    path: str  # dataset on the Hugging Face hub
    name: str | None  # its configuration
    split: str
    id_base: int  # question_id = id_base + row index (MT-bench keeps its own ids)
    turns: Callable[[dict], list[str]]


def _humaneval(row):
    return ["Complete the following Python function. Reply with the whole function in one code "
            f"block.\n\n```python\n{row['prompt']}```"]


def _nq(row):
    question = row["question"].strip()
    return [question[:1].upper() + question[1:] + ("" if question.endswith("?") else "?")]


SOURCES = {
    "mt_bench": Source("HuggingFaceH4/mt_bench_prompts", None, "train", 0,
                       lambda row: list(row["prompt"])),
    "humaneval": Source("openai/openai_humaneval", None, "test", 100_000, _humaneval),
    "gsm8k": Source("openai/gsm8k", "main", "test", 200_000, lambda row: [row["question"]]),
    "alpaca": Source("tatsu-lab/alpaca", None, "train", 300_000,
                     lambda row: [row["instruction"]
                                  + (f"\n\n{row['input']}" if row["input"] else "")]),
    "cnn_dailymail": Source("abisee/cnn_dailymail", "3.0.0", "test", 400_000,
                            lambda row: ["Summarize the following news article in a few "
                                         f"sentences.\n\n{row['article']}"]),
    "natural_questions": Source("google-research-datasets/nq_open", None, "validation", 500_000,
                                _nq),
    "wmt14_de_en": Source("wmt/wmt14", "de-en", "test", 600_000,
                          lambda row: ["Translate the following German text into English.\n\n"
                                       + row["translation"]["de"]]),
}


def check_record(record: dict, where: str, task: str) -> dict:
    """A Spec-Bench question; MT-bench prompts have two turns, the others at least one."""
    missing = {"question_id", "category", "turns"} - set(record)
    if missing:
        raise ValueError(f"{where}: missing field(s) {sorted(missing)}")
    turns = record["turns"]
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip()
                                                           for t in turns):
        raise ValueError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    if task == "mt_bench" and len(turns) != 2:
        raise ValueError(f"{where}: an MT-bench prompt has two turns, found {len(turns)}")
    return record


def bundled(path: str, task: str, n: int) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    records = [check_record(json.loads(line), f"{path}:{i + 1}", task)
               for i, line in enumerate(lines)]
    return records[:n]


def sample_rows(size: int, n: int, seed: int) -> list[int]:
    """n row indices of a split of `size` rows, seeded, in dataset order."""
    if size <= n:
        return list(range(size))
    return sorted(random.Random(seed).sample(range(size), n))


def load_split(src: Source, tries: int = 4, backoff_s: float = 10.0, log=sys.stderr):
    """The split of `src`, with transient hub failures retried (as for model downloads) and
    other failures explained with the dataset's name."""
    import datasets

    from targetrows.fetch.hub import explain, is_transient, redact

    for attempt in range(1, tries + 1):
        try:
            return datasets.load_dataset(src.path, src.name, split=src.split)
        except Exception as err:  # classified below
            if not is_transient(err) or attempt == tries:
                message = explain(err, src.path, gated=False,
                                  check="that the hub or mirror (HF_ENDPOINT) holds this dataset")
                raise RuntimeError(f"dataset {src.path} ({src.name or 'default'} / {src.split}): "
                                   f"{message}") from None
            wait = backoff_s * 2 ** (attempt - 1)
            print(redact(f"attempt {attempt}/{tries} to load {src.path} failed "
                         f"({type(err).__name__}: {err}); retrying in {wait:.0f} s"),
                  file=log, flush=True)
            time.sleep(wait)


def from_dataset(task: str, n: int, seed: int, log=sys.stderr) -> list[dict]:
    src = SOURCES[task]
    data = load_split(src, log=log)
    records = []
    for i in sample_rows(len(data), n, seed):
        row = data[i]
        qid = int(row["prompt_id"]) if task == "mt_bench" else src.id_base + i
        records.append(check_record({"question_id": qid, "category": task,
                                     "turns": src.turns(row)}, f"{src.path}[{i}]", task))
    return records


def write_jsonl(records: list[dict], out: str) -> None:
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, out)


def prepare(task: str, source: str, n: int, seed: int, out: str, bundled_path: str | None = None,
            log=sys.stderr) -> list[dict]:
    """Write `task`'s prompts to `out` (atomically) and return them."""
    records = bundled(bundled_path, task, n) if source == "bundled" else from_dataset(task, n, seed, log)
    if len(records) < n:
        print(f"{task}: {len(records)} prompts available, fewer than n={n}", file=log)
    write_jsonl(records, out)
    print(f"{task}: wrote {len(records)} prompts to {out}", file=log)
    return records
