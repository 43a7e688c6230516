"""How the benchmark scripts hand back their Markdown report: printed, and written whole (a
temporary file, then a rename) when --out names a file."""

from __future__ import annotations

from targetrows.core.atomic import atomic_write_text


def emit(text: str, out: str | None) -> None:
    """Print `text`; write it to `out` too when given."""
    print(text, end="")
    if out:
        atomic_write_text(out, text)
