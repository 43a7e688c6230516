"""Snakemake job: one target's temperature-0 answers against ar's (`targetrows drift`), on the
GPUs it claims (gpu_lock.py)."""

import sys

from targetrows.pipeline.gpu_lock import run_claimed


def command(smk):
    def argv(target_device: str, draft_device: str) -> list[str]:
        return [
            sys.executable, "-m", "targetrows.cli", "drift",
            "--target", smk.input.target, "--target-device", target_device,
            "--dtype", smk.params.dtype, "--prompts", *smk.input.prompts,
            "--reference", *smk.input.reference, "--answers", *smk.input.answers,
            "--pair", smk.wildcards.target, *smk.params.trust, *smk.params.chat,
            "--out", smk.output[0],
        ]
    return argv


def main(smk) -> None:
    open(smk.log[0], "w").close()
    rc = run_claimed(command(smk), smk.resources.gpu, smk.log[0], smk.params.lock_dir or None,
                     smk.params.placement)
    if rc:
        sys.exit(f"targetrows drift failed with status {rc}; see {smk.log[0]}")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
