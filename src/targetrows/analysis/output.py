"""Writing the pipeline's tables and figures, each atomically (`targetrows.core.atomic`), so a
killed job never leaves a half-written file under a final name."""

from __future__ import annotations

import io

import pandas as pd

from targetrows.core.atomic import atomic_file, atomic_write_text


def write_csv(frame: pd.DataFrame, out: str) -> None:
    atomic_write_text(out, frame.to_csv(index=False))


def write_table(tidy: pd.DataFrame, display: pd.DataFrame, stem: str, caption: str,
                floatfmt: str = ".3f") -> None:
    """`stem`.csv holds the tidy table; .md and .tex the display table (pivoted, rounded)."""
    write_csv(tidy, f"{stem}.csv")
    shown = display.reset_index() if display.index.name or display.index.nlevels > 1 else display
    atomic_write_text(f"{stem}.md",
                      f"{caption}\n\n" + shown.to_markdown(index=False, floatfmt=floatfmt) + "\n")
    latex = shown.to_latex(index=False, float_format=lambda x: format(x, floatfmt),
                           caption=caption, na_rep="--", escape=True)
    atomic_write_text(f"{stem}.tex", latex)


def save_figure(fig, png: str, pdf: str) -> None:
    for out, fmt in ((png, "png"), (pdf, "pdf")):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=150, bbox_inches="tight")
        with atomic_file(out) as f:
            f.write(buf.getvalue())
