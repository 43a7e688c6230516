"""Snakemake job: results/tables/reuse.*, exact reuse shown on the toy pair and on every pair's
row logs (`targetrows.analysis.reuse`)."""

import contextlib
import os

from targetrows.analysis.reuse import write_reuse


def main(smk) -> None:
    # the job's warnings go to its log; an error, after the log is closed, to Snakemake
    with open(smk.log[0], "w") as log, contextlib.redirect_stderr(log):
        logs = list(zip(smk.params.pairs, smk.input.rows, strict=True))
        table = write_reuse(logs, smk.params.temperatures, os.path.splitext(smk.output.csv)[0],
                            smk.params.bootstrap, smk.params.seed)
        print(f"{len(table)} rows from the toy pair and {len(logs)} row logs", file=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
