"""Per-prompt totals of the online runs: one row per pair x task x temperature x decoder x
budget x prompt, from the decoders' Spec-Bench-style answer files.

Columns: pair, task, temperature, decoder, budget, prompt_id, new_tokens, wall_time (seconds,
all turns), rounds, committed, accepted (accepted draft tokens), nodes (non-root nodes verified),
target_passes, draft_passes.
"""

import json
import sys

import pandas as pd
from outputs import write_csv

ROUND_SUMS = ["committed", "accepted", "nodes", "target_passes", "draft_passes"]


def answer_rows(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            rec = json.loads(line)
            try:
                choice = rec["choices"][0]
                rounds = rec.get("rounds") or {}
                row = {
                    "pair": rec["model_id"], "task": rec["category"],
                    "temperature": float(rec["temperature"]), "decoder": rec["decoder"],
                    "budget": int(rec["budget"]), "prompt_id": str(rec["question_id"]),
                    "new_tokens": int(sum(choice["new_tokens"])),
                    "wall_time": float(sum(choice["wall_time"])),
                    "rounds": len(rounds.get("committed", [])),
                }
                row.update({k: float(sum(rounds.get(k, []))) for k in ROUND_SUMS})
            except (KeyError, TypeError, IndexError) as err:
                raise ValueError(f"{path}:{lineno}: not a targetrows answer record "
                                 f"({err!r})") from None
            rows.append(row)
    return rows


def summarise(paths: list[str]) -> pd.DataFrame:
    rows = [row for path in paths for row in answer_rows(path)]
    if not rows:
        raise ValueError("no answers to summarise")
    return pd.DataFrame(rows)


def main(smk) -> None:
    with open(smk.log[0], "w") as log:
        sys.stderr = log
        summary = summarise(list(smk.input))
        write_csv(summary, smk.output[0])
        print(f"{len(summary)} answers from {len(smk.input)} files", file=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
