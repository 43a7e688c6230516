"""Snakemake job: one decoder on one target x task x temperature, all its budget conditions.

Claims its GPUs (gpu_lock.py), resolves fts's `matched` budgets from pearl's runs, and calls
`targetrows decode`, which resumes an interrupted job from OUT.partial and writes OUT atomically.
"""

import json
import sys

from targetrows.pipeline.gpu_lock import run_claimed


def mean_nodes(paths: list[str], budget: int) -> float:
    """Mean non-root nodes verified per round over pearl's answers at `budget`."""
    total, rounds = 0, 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                if record.get("budget") == budget:
                    nodes = record["rounds"].get("nodes", []) if record.get("rounds") else []
                    total += sum(nodes)
                    rounds += len(nodes)
    if rounds == 0:
        raise ValueError(f"no pearl rounds at budget {budget} in {len(paths)} file(s) "
                         f"(first: {paths[0] if paths else 'none'}); cannot match fts's budget")
    return total / rounds


def matched(mean: float) -> int:
    """The budget matched to a mean tree size (tables.py pairs conditions with the same rule)."""
    return max(1, round(mean))


def resolve_budgets(budgets: list, base: list[int], pearl: list[str]) -> list[int]:
    """fts's conditions: 'matched' at entry i takes pearl's mean tree size at base[i]."""
    return [matched(mean_nodes(pearl, base[i])) if b == "matched" else int(b)
            for i, b in enumerate(budgets)]


def command(smk, budgets: list[int]):
    def argv(target_device: str, draft_device: str) -> list[str]:
        return [
            sys.executable, "-m", "targetrows.cli", "decode",
            "--target", smk.input.target, "--draft", smk.input.draft,
            "--target-device", target_device, "--draft-device", draft_device,
            "--dtype", smk.params.dtype,
            "--prompts", smk.input.prompts, "--decoder", smk.wildcards.decoder,
            "--budgets", *map(str, budgets), "--temperature", smk.wildcards.temperature,
            "--max-new-tokens", str(smk.params.max_new_tokens), "--seed", str(smk.params.seed),
            "--top-k", str(smk.params.top_k), "--depth", str(smk.params.depth),
            "--model-id", smk.wildcards.target, "--no-progress",
            *smk.params.trust, *smk.params.args, "--out", smk.output[0],
        ]
    return argv


def main(smk) -> None:
    budgets = smk.params.budgets
    if "matched" in budgets:
        budgets = resolve_budgets(budgets, smk.params.base_budgets, list(smk.input.pearl))
        with open(smk.log[0], "w") as log:
            print(f"fts budgets {smk.params.budgets} -> {budgets} (pearl's mean tree sizes)",
                  file=log)
    else:
        open(smk.log[0], "w").close()
    rc = run_claimed(command(smk, budgets), smk.resources.gpu, smk.log[0],
                     smk.params.lock_dir or None)
    if rc:
        sys.exit(f"targetrows decode failed with status {rc}; see {smk.log[0]}")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
