"""How the tests start Snakemake: the way the README does (`.venv/bin/snakemake`, venv not
activated), so a rule that relies on the venv's `bin/` being on PATH fails here too."""

import os
import shutil
import sys

BIN = os.path.dirname(sys.executable)
SNAKEMAKE = shutil.which("snakemake", path=BIN) or shutil.which("snakemake")


def snakemake_env(**extra: str) -> dict[str, str]:
    """os.environ without the running Python's bin folder on PATH, offline, plus `extra`."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and os.path.realpath(p) != os.path.realpath(BIN))
    env = dict(os.environ, PATH=path or os.defpath, HF_HUB_OFFLINE="1")
    env.update(extra)
    return env
