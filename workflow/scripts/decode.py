"""Snakemake job: one decoder on one target x task x temperature, all its budget conditions.

Resolves `matched` budgets from the baseline decoder's runs (`targetrows.analysis.online`),
claims its GPUs and calls `targetrows decode`, which resumes an interrupted job from
OUT.partial and writes OUT atomically.
"""

import sys

from targetrows.analysis.online import resolve_budgets, summarise
from targetrows.pipeline.gpu_lock import run_claimed


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
    with open(smk.log[0], "w") as log:
        if "matched" in budgets:
            baseline = summarise(list(smk.input.baseline))
            budgets = resolve_budgets(smk.wildcards.decoder, budgets, smk.params.base_budgets,
                                      baseline)
            print(f"{smk.wildcards.decoder} budgets {smk.params.budgets} -> {budgets} "
                  "(the baseline's mean tree sizes)", file=log)
    rc = run_claimed(command(smk, budgets), smk.resources.gpu, smk.log[0],
                     smk.params.lock_dir or None)
    if rc:
        sys.exit(f"targetrows decode failed with status {rc}; see {smk.log[0]}")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
