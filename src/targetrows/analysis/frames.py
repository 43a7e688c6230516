"""Small helpers for the pipeline's tables: tidy frames from column dicts, gains printed with
their intervals, and the registry's order for rules and decoders."""

from __future__ import annotations

import numpy as np
import pandas as pd


def tidy(columns: dict) -> pd.DataFrame:
    return pd.DataFrame({k: np.asarray(v) for k, v in columns.items()})


def with_ci(frame: pd.DataFrame) -> pd.Series:
    """'+5.1% [+2.6, +7.4]' per row (gain and its interval, in percent); 'n/a' where the
    baseline accepted nothing, so that no ratio exists."""
    def fmt(g, lo, hi):
        if not np.isfinite(g):
            return "n/a"
        ci = f"[{100 * lo:+.1f}, {100 * hi:+.1f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
        return f"{100 * g:+.1f}% {ci}".strip()

    return pd.Series([fmt(g, lo, hi) for g, lo, hi in
                      zip(frame["gain"], frame["lo"], frame["hi"], strict=True)],
                     index=frame.index, dtype=object)


def in_order(names, order) -> list[str]:
    """The distinct `names` in the registry's `order`, any name it does not know after them
    (sorted): nothing is ever dropped from a table or a figure."""
    present = list(dict.fromkeys(names))
    known = [x for x in order if x in present]
    return known + sorted(x for x in present if x not in known)


def ordered(frame: pd.DataFrame, column: str, order) -> pd.DataFrame:
    """`frame` with `column` as an ordered category (see `in_order`)."""
    cats = in_order(frame[column], order)
    return frame.assign(**{column: pd.Categorical(frame[column], categories=cats, ordered=True)})


def with_interval(frame: pd.DataFrame, value: str, lo: str, hi: str, fmt: str) -> list[str]:
    """'1.23 [1.10, 1.35]' per row; the value alone where there is no interval (one prompt)."""
    out = []
    for v, a, b in zip(frame[value], frame[lo], frame[hi], strict=True):
        text = fmt.format(v) if np.isfinite(v) else "n/a"
        if np.isfinite(a) and np.isfinite(b):
            text += f" [{fmt.format(a)}, {fmt.format(b)}]"
        out.append(text)
    return out
