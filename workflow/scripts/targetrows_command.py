"""Snakemake job: one `targetrows` subcommand (`params.command`), run by this job's Python, the
one that has the package (the venv of `.venv/bin/snakemake`, or the job's conda env), so nothing
depends on PATH. Its output goes to the rule's log."""

import shlex
import subprocess
import sys


def main(smk) -> None:
    argv = [sys.executable, "-m", "targetrows.cli", *map(str, smk.params.command)]
    with open(smk.log[0], "w") as log:
        print("$ " + shlex.join(argv), file=log, flush=True)
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc:
        sys.exit(f"targetrows {smk.params.command[0]} failed with status {rc}; see {smk.log[0]}")


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
