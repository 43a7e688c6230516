"""`targetrows ARGS` run in the test's own process, answered as a subprocess would answer.

A test worker has torch and transformers loaded already; a `python -m targetrows.cli`
subprocess spends about 5 of its 6 seconds importing them again. The command's code is the
same either way (`targetrows.cli.main`); what a subprocess adds, the entry point itself, is
checked once (`test_decoders_hf.py::test_help_lists_the_commands`)."""

from types import SimpleNamespace


def run_cli(capsys, *args: str) -> SimpleNamespace:
    """The exit status, stdout and stderr of `targetrows ARGS` (argparse's refusals too), as
    `returncode`, `stdout` and `stderr`; `capsys` is the test's fixture."""
    from targetrows.cli import main

    capsys.readouterr()  # what the test printed before is not the command's
    try:
        status = main(list(args))
    except SystemExit as stop:  # refused by argparse itself
        status = stop.code
    out = capsys.readouterr()
    return SimpleNamespace(returncode=status, stdout=out.out, stderr=out.err)
