#!/usr/bin/env bash
# Installs targetrows (without dependencies: the environment has them) from the repository
# root, the working directory Snakemake runs in.
set -euo pipefail
if [ ! -f pyproject.toml ] || ! grep -q 'name = "targetrows"' pyproject.toml; then
    echo "run snakemake from the targetrows repository root so the conda environment can" \
         "install targetrows from it" >&2
    exit 1
fi
python -m pip install --no-deps .
