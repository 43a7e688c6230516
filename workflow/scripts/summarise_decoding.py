"""Snakemake job: per-prompt totals of every online run, and every run's budget conditions, in
two CSVs (`targetrows.analysis.online`)."""

import contextlib

from targetrows.analysis.online import conditions, summarise
from targetrows.analysis.output import write_csv


def main(smk) -> None:
    # the job's warnings go to its log; an error, after the log is closed, to Snakemake
    with open(smk.log[0], "w") as log, contextlib.redirect_stderr(log):
        summary = summarise(list(smk.input.answers))
        write_csv(summary, smk.output.online)
        write_csv(conditions(list(smk.input.conditions)), smk.output.conditions)
        print(f"{len(summary)} answers from {len(smk.input.answers)} files", file=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
