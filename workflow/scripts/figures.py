"""Snakemake job: every figure under results/figures/ (`targetrows.analysis.figures`)."""

import contextlib

from targetrows.analysis.figures import draw_all


def main(smk) -> None:
    # the job's warnings go to its log; an error, after the log is closed, to Snakemake
    with open(smk.log[0], "w") as log, contextlib.redirect_stderr(log):
        outputs = {name[: -len("_png")]: (path, getattr(smk.output, name[: -len("_png")] + "_pdf"))
                   for name, path in smk.output.items() if name.endswith("_png")}
        draw_all(smk.input.accepted, smk.input.gains, smk.input.online, outputs, log)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
