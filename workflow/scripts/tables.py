"""Snakemake job: every table under results/tables/ (`targetrows.analysis.tables`)."""

import contextlib
import os

import pandas as pd

from targetrows.analysis.tables import write_all


def main(smk) -> None:
    # the job's warnings go to its log; an error, after the log is closed, to Snakemake
    with open(smk.log[0], "w") as log, contextlib.redirect_stderr(log):
        decoding = pd.read_csv(smk.input.online, dtype={"prompt_id": str, "task": str})
        plan = pd.read_csv(smk.input.conditions)
        folder = os.path.dirname(smk.output[0])
        write_all(list(smk.input.scores), decoding, plan, folder, smk.params.bootstrap,
                  smk.params.seed, list(smk.input.drift))
        print(f"wrote tables to {folder}", file=log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
