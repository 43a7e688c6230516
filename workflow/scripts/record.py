"""Snakemake job: record the target's rows on one target x temperature, one row log per task.

Claims a GPU (gpu_lock.py) and calls `targetrows record` once for every task, which keeps finished
prompts in OUT.parts/ so an interrupted job resumes, and writes the log OUT atomically at the end.
"""

import sys

from targetrows.pipeline.gpu_lock import run_claimed


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
    open(smk.log[0], "w").close()
    rc = run_claimed(command(smk), smk.resources.gpu, smk.log[0], smk.params.lock_dir or None,
                     smk.params.placement)
    if rc:
        sys.exit(f"targetrows record failed with status {rc}; see {smk.log[0]}")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
