"""Builders: the embedded SmolLM2 target from PyPI, and small drafts distilled from a target."""
