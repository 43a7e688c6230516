"""Snakemake job: a `targetrows` command that trains from a target (`params.command`: replies,
train-eagle3) on the GPUs its placement asks for (`params.placement`, `resources.gpu`), claimed
as decode jobs claim theirs (gpu_lock.py), with `--device` naming them. Without GPUs (none on
the machine, none allocated by SLURM, or resources.gpus_per_job: 0) it runs the command as it
stands, on the CPU, exactly as `targetrows_command.py` would."""

import sys

from targetrows.pipeline.gpu_lock import run_job


def command(smk):
    name, *rest = map(str, smk.params.command)

    def argv(target_device: str, draft_device: str) -> list[str]:
        # before the rest, so that a --device in the config's args still wins
        device = [] if target_device == "cpu" else ["--device", target_device]
        return [sys.executable, "-m", "targetrows.cli", name, *device, *rest]

    return argv


def main(smk) -> None:
    run_job(smk, command(smk), str(smk.params.command[0]))


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
