"""Writing tables and figures atomically (temp file beside the target, then one rename), so a
killed job never leaves a half-written file under a final name."""

import os

import pandas as pd


def _replace(tmp: str, out: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    os.replace(tmp, out)


def write_csv(frame: pd.DataFrame, out: str) -> None:
    tmp = f"{out}.tmp"
    frame.to_csv(tmp, index=False)
    _replace(tmp, out)


def write_text(text: str, out: str) -> None:
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    _replace(tmp, out)


def write_table(tidy: pd.DataFrame, display: pd.DataFrame, stem: str, caption: str,
                floatfmt: str = ".3f") -> None:
    """`stem`.csv holds the tidy table; .md and .tex the display table (pivoted, rounded)."""
    write_csv(tidy, f"{stem}.csv")
    shown = display.reset_index() if display.index.name or display.index.nlevels > 1 else display
    write_text(f"{caption}\n\n" + shown.to_markdown(index=False, floatfmt=floatfmt) + "\n",
               f"{stem}.md")
    latex = shown.to_latex(index=False, float_format=lambda x: format(x, floatfmt),
                           caption=caption, na_rep="--", escape=True)
    write_text(latex, f"{stem}.tex")


def save_figure(fig, png: str, pdf: str) -> None:
    for out, fmt in ((png, "png"), (pdf, "pdf")):
        tmp = f"{out}.tmp"
        fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight")
        _replace(tmp, out)
