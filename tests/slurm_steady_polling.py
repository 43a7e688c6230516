"""`snakemake`, with the SLURM executor plugin checking its jobs every
`--seconds-between-status-checks`, as the SLURM tests run it.

snakemake-executor-plugin-slurm (2.8.0) waits 10 s longer after every status check that finds
no job finished, up to 180 s: on a cluster whose jobs run for hours that spares the controller
and costs nothing, but the test DAG's jobs run for 5-15 s each, so Snakemake saw each one done
17-22 s after SLURM had ended it (alone, the run without accounting took 150 s that way and 124
s here; the run with it 83 s and 55 s). Here every wait is the interval the command line sets.
Nothing else changes: the jobs, their submission and the status command are the plugin's own.

Run as ``python tests/slurm_steady_polling.py ARGS``, where a user runs ``snakemake ARGS``.
"""

import sys

from snakemake_executor_plugin_slurm import Executor
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor


def _no_back_off(executor, seconds) -> None:
    """The plugin's setter of its next wait: ignored, so every wait is the command line's."""


Executor.next_seconds_between_status_checks = property(
    RemoteExecutor.next_seconds_between_status_checks.fget, _no_back_off)

if __name__ == "__main__":
    from snakemake.cli import main

    sys.argv[0] = "snakemake"
    sys.exit(main())
