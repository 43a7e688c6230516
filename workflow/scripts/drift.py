"""Snakemake job: one pair's temperature-0 answers against ar's (`targetrows drift`), on the
GPUs it claims (gpu_lock.py)."""

import sys

from targetrows.pipeline.gpu_lock import run_job


def command(smk):
    def argv(target_device: str, draft_device: str) -> list[str]:
        return [
            sys.executable, "-m", "targetrows.cli", "drift",
            "--target", smk.input.target, "--target-device", target_device,
            "--dtype", smk.params.dtype, "--prompts", *smk.input.prompts,
            "--reference", *smk.input.reference, "--answers", *smk.input.answers,
            "--pair", smk.wildcards.pair, *smk.params.trust, *smk.params.chat,
            "--out", smk.output[0],
        ]
    return argv


def main(smk) -> None:
    run_job(smk, command(smk), "drift")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
