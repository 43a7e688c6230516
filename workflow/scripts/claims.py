"""Snakemake job: results/claims.md and .csv, the paper's claims judged on this run's tables
(`targetrows.analysis.claims`)."""

import contextlib
import os

from targetrows.analysis.claims import read_tables, write_claims


def main(smk) -> None:
    # the job's warnings go to its log; an error, after the log is closed, to Snakemake
    with open(smk.log[0], "w") as log, contextlib.redirect_stderr(log):
        folder = os.path.dirname(smk.input[0])
        table = write_claims(read_tables(folder), os.path.splitext(smk.output.md)[0])
        print(table["verdict"].value_counts().to_string(), file=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
