"""The claims table's verdicts, and how a claim's cells reach one.

A cell is one comparison the claim covers (a pair, temperature and budget of a table) with its
value and 95% interval (prompts resampled). A verdict says what the cells can show:

    holds          every cell's interval lies on the claim's side of the null (above 0 for a
                   gain);
    contradicted   some cell's interval lies on the other side;
    inconclusive   neither: some interval includes the null (or a cell has no interval);
    illustrated    a statement the data can show an instance of but not test (the claim says
                   something can happen): some cell shows it, with its interval off the null;
    not measured   the run has no cell under the claim's conditions; the row says why.

Each verdict names the cells it rests on, so a reader can check it against the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .frames import with_ci

HOLDS, CONTRADICTED, INCONCLUSIVE = "holds", "contradicted", "inconclusive"
ILLUSTRATED, UNMEASURED = "illustrated", "not measured"
VERDICTS = (HOLDS, CONTRADICTED, INCONCLUSIVE, ILLUSTRATED, UNMEASURED)
NAMED = 4  # cells a reason names before it counts the rest


@dataclass(frozen=True)
class Finding:
    ours: str  # this run's figure(s), with intervals
    conditions: str  # what the run measured it under
    verdict: str
    why: str = ""  # why this verdict: the cells it rests on, or what is missing
    cells: str = ""  # every cell the verdict covers, with its value and interval


def unmeasured(why: str, conditions: str = "") -> Finding:
    return Finding("", conditions, UNMEASURED, why)


def cell_name(row) -> str:
    """Where a cell sits: 'pair T=0 B=16' ('nodes pair T=0 B=16' for a cell labelled by its
    metric)."""
    parts = [str(row.label)] if "label" in row._fields else []
    parts += [str(row.pair), f"T={row.temperature:g}"]
    if "budget" in row._fields:
        parts.append(f"B={int(row.budget)}")
    return " ".join(parts)


def cell_list(cells: pd.DataFrame) -> str:
    """Every cell with its gain and interval: 'pair T=0 B=16 +5.1% [+2.6, +7.4]; ...'."""
    shown = cells.assign(text=with_ci(cells))
    return "; ".join(f"{cell_name(r)} {r.text}" for r in shown.itertuples())


def named(cells: pd.DataFrame) -> str:
    """The cells' names, the first `NAMED` of them and a count of the rest."""
    names = [cell_name(r) for r in cells.itertuples()]
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return ", ".join(names[:NAMED]) + more


def span(cells: pd.DataFrame) -> str:
    """The smallest and the largest gain with their intervals and where they sit."""
    shown = cells.assign(text=with_ci(cells)).sort_values("gain", kind="stable")
    ends = shown.iloc[[0, -1]] if len(shown) > 1 else shown
    return (" to ".join(f"{r.text} ({cell_name(r)})" for r in ends.itertuples())
            + f" ({len(cells)} cells)")


def sides(cells: pd.DataFrame, low: float = 0.0, high: float | None = None):
    """(above, below): whether each cell's interval lies wholly above `high` (default `low`)
    and wholly below `low`; a cell with no interval is neither."""
    high = low if high is None else high
    return cells["lo"] > high, cells["hi"] < low


def defined(cells: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """(the cells with a gain, a note naming those without one: the baseline's total was 0,
    so no ratio exists; they show nothing either way)."""
    if cells.empty:
        return cells, ""
    finite = np.isfinite(cells["gain"].astype(float))
    left = cells[~finite]
    note = (f"left out: {len(left)} cells without a ratio, the baseline accepting nothing "
            f"({named(left)})") if len(left) else ""
    return cells[finite], note


def direction(cells: pd.DataFrame, what: str, conditions: str) -> Finding:
    """A claim that a gain is positive, judged cell by cell (the module docstring)."""
    judged, note = defined(cells)
    if judged.empty:
        return unmeasured(f"no {what} in this run's tables")
    above, below = sides(judged)
    if below.any():
        verdict = CONTRADICTED
        why = [f"{int(below.sum())} of {len(judged)} cells' intervals lie below 0: "
               + named(judged[below])]
    elif above.all():
        verdict, why = HOLDS, [f"all {len(judged)} cells' intervals lie above 0"]
    else:
        verdict = INCONCLUSIVE
        why = [f"{int((~above).sum())} of {len(judged)} cells' intervals include 0: "
               + named(judged[~above])]
    return Finding(span(judged), conditions, verdict, "; ".join(why + [note] * bool(note)),
                   cell_list(judged))


def in_range(cells: pd.DataFrame, low: float, high: float, conditions: str) -> Finding:
    """Whether each gain's magnitude falls in a stated range [low, high]: contradicted where an
    interval lies wholly outside it, holds where every gain lies in it (its interval then meets
    it), inconclusive otherwise."""
    judged, note = defined(cells)
    paper = f"{low:+.1%} to {high:+.1%}"
    if judged.empty:
        return unmeasured("no gain to compare with the paper's range")
    above, below = sides(judged, low, high)
    inside = judged["gain"].between(low, high)
    if (above | below).any():
        verdict = CONTRADICTED
        why = (f"{int(above.sum())} of {len(judged)} cells' intervals lie above the paper's "
               f"{paper}, {int(below.sum())} below it: " + named(judged[above | below]))
    elif inside.all():
        verdict, why = HOLDS, f"every gain lies in the paper's {paper}"
    else:
        verdict = INCONCLUSIVE
        why = (f"{int((~inside).sum())} gains lie outside the paper's {paper}, their "
               "intervals reaching into it: " + named(judged[~inside]))
    return Finding(span(judged), conditions, verdict, "; ".join([why] + [note] * bool(note)),
                   cell_list(judged))
