"""Snakemake job: per-prompt totals of every online run in one CSV
(`targetrows.analysis.online.summarise`)."""

import sys

from targetrows.analysis.online import summarise
from targetrows.analysis.output import write_csv


def main(smk) -> None:
    with open(smk.log[0], "w") as log:
        sys.stderr = log
        summary = summarise(list(smk.input))
        write_csv(summary, smk.output[0])
        print(f"{len(summary)} answers from {len(smk.input)} files", file=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
