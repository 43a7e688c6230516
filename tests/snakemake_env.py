"""How the tests start Snakemake: the way the README does (`.venv/bin/snakemake`, venv not
activated), so a rule that relies on the venv's `bin/` being on PATH fails here too."""

import os
import shutil
import sys

BIN = os.path.dirname(sys.executable)
SNAKEMAKE = shutil.which("snakemake", path=BIN) or shutil.which("snakemake")
# a `scontrol` that fails at once: the SLURM executor plugin runs `scontrol show config` each
# time Snakemake starts, and with the SLURM client installed (as in CI) but no cluster running,
# the real one waits 9 s for a controller before it gives up
NO_SLURM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_slurm")


def snakemake_env(**extra: str) -> dict[str, str]:
    """os.environ without the running Python's bin folder on PATH, offline, plus `extra`.
    Without SLURM_CONF in `extra` (no test cluster), SLURM's scontrol is the stub in NO_SLURM."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and os.path.realpath(p) != os.path.realpath(BIN)]
    if "SLURM_CONF" not in extra:
        path.insert(0, NO_SLURM)
    env = dict(os.environ, PATH=os.pathsep.join(path) or os.defpath, HF_HUB_OFFLINE="1")
    env.update(extra)
    return env
