"""Snakemake job: one task's prompts in Spec-Bench's question format, from the bundled files or
the task's dataset on the hub (targetrows.fetch.datasets)."""

import sys

from targetrows.fetch.datasets import prepare


def main(smk) -> None:
    with open(smk.log[0], "w") as log:
        sys.stderr = log
        prepare(smk.wildcards.task, smk.params.source, smk.params.n, smk.params.seed,
                smk.output[0], bundled_path=smk.input.bundled or None, log=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
