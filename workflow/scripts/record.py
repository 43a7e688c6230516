"""Snakemake job: record the target's rows on one pair x temperature, one row log per task.

Claims a GPU (gpu_lock.py) and calls `targetrows record` once for every task, which keeps finished
prompts in OUT.parts/ so an interrupted job resumes, and writes the log OUT atomically at the end.
"""

import sys

from targetrows.pipeline.gpu_lock import run_job


def command(smk):
    def argv(target_device: str, draft_device: str) -> list[str]:
        return [
            sys.executable, "-m", "targetrows.cli", "record",
            "--target", smk.input.target, "--draft", smk.input.draft,
            "--target-device", target_device, "--draft-device", draft_device,
            "--dtype", smk.params.dtype, "--prompts", *smk.input.prompts,
            "--temperature", smk.wildcards.temperature,
            "--top-k", str(smk.params.top_k), "--depth", str(smk.params.depth),
            "--stride", str(smk.params.stride), "--max-new-tokens", str(smk.params.max_new_tokens),
            "--seed", str(smk.params.seed), *smk.params.trust, *smk.params.chat, *smk.params.args,
            "--out", *smk.output,
        ]
    return argv


def main(smk) -> None:
    run_job(smk, command(smk), "record")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
