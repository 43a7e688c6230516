"""Snakemake job: download one hub model into resources/models/{model}
(targetrows.fetch.hub: retries, clear errors, the token kept out of the log)."""

import sys

from targetrows.fetch.hub import download


def main(smk) -> None:
    with open(smk.log[0], "w") as log:
        sys.stderr = log
        download(smk.params.repo, smk.params.revision, smk.output[0], smk.params.gated, log=log,
                 head=smk.params.head)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
