"""Snakemake job: time one pair on the GPUs it claims (`targetrows part-times`), what
its decode jobs' wall-time requests are worked out from (gpu_lock.py)."""

import sys

from targetrows.pipeline.gpu_lock import run_job


def command(smk):
    def argv(target_device: str, draft_device: str) -> list[str]:
        return [
            sys.executable, "-m", "targetrows.cli", "part-times",
            "--target", smk.input.target, "--draft", smk.input.draft,
            "--target-device", target_device, "--draft-device", draft_device,
            "--dtype", smk.params.dtype, "--prompts", *smk.input.prompts,
            "--max-new-tokens", str(smk.params.max_new_tokens),
            "--budgets", *map(str, smk.params.budgets),
            "--top-k", str(smk.params.top_k), "--depth", str(smk.params.depth),
            *smk.params.graphs, *smk.params.trust, *smk.params.chat, "--out", smk.output[0],
        ]
    return argv


def main(smk) -> None:
    run_job(smk, command(smk), "part-times")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
