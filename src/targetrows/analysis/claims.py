"""The paper's claims, one by one: which of them this run's tables show, and by how much.

The paper (arXiv, 21 October 2026; code in the repository TargetRows) makes seven claims; each
is one or more rows here, read off the pipeline's tidy tables (`results/tables/*.csv`), never
re-estimated. A row gives the paper's figure, this run's with its 95% intervals (prompts
resampled), the conditions it was measured under, the table it comes from, a verdict
(`analysis.verdicts`: holds, contradicted, inconclusive, illustrated, not measured), why, and
every cell the verdict covers.

Claims 3-5 are about EAGLE-3 drafts and are judged on EAGLE-3 pairs only (the score tables and
the online runs record the draft's kind); standalone pairs feed the speed claims (6, 7,
`analysis.online_claims`). A claim about a condition the run does not reproduce exactly (a
budget of 16 where the paper used 59) is judged at the run's closest condition, which
`conditions` names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from targetrows.core.atomic import atomic_write_text

from .online_claims import PAPER_NODES, faster, fts_online, fts_online_magnitude
from .output import write_csv
from .reuse import SAME_LAST, TOY
from .verdicts import (
    CONTRADICTED,
    HOLDS,
    ILLUSTRATED,
    INCONCLUSIVE,
    UNMEASURED,
    VERDICTS,
    Finding,
    cell_name,
    direction,
    named,
    unmeasured,
)

COLUMNS = ["claim", "statement", "paper", "ours", "conditions", "table", "verdict", "why",
           "cells"]
TABLES = ("relative_gains", "equal_size", "online_gain", "reuse")
# claim 2 is a trade a decoder makes; no decoder here makes it (docs/claims.md)
KEPT_ROW = ("no decoder here makes this trade: every one commits its bonus token (those that "
            "read the next root's row get it from a root pass or use the stale row); the paper "
            "names neither its decoder nor the conditions under which the loss persists. The "
            "exact row's gain over the stale row (target_rerank / stale_rerank) is the converse "
            "trade, context in reuse.md")
CAP = ("the same cap B as each rule counts it (the paper's definitions): pearl's tree of B "
       "draft nodes includes t0's first-level node, first_token's B nodes lie below it")


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str
    paper: str  # the paper's figure, as it states it
    table: str  # the table the finding is read from
    judge: Callable[[dict[str, pd.DataFrame]], Finding]


# -- offline cells: EAGLE-3 pairs only -----------------------------------------------------------

def eagle3(cells: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """(the cells of pairs drafted by EAGLE-3 heads, the reason when there are none)."""
    if cells.empty:
        return cells, ""
    if "draft_kind" not in cells.columns:
        return cells.iloc[:0], ("the score tables do not say which draft made the pools (row "
                                "logs recorded before they did): record them again")
    heads = cells[cells["draft_kind"] == "eagle3"]
    kinds = ", ".join(sorted(map(str, set(cells["draft_kind"].dropna())))) or "none recorded"
    return heads, "" if len(heads) else f"no EAGLE-3 pair's cells (this run's drafts: {kinds})"


def gain_cells(t: dict, rule: str, baseline: str, temperature: float | None = None):
    """(relative_gains cells of `rule` over `baseline` in accepted draft tokens, EAGLE-3 pairs
    only, at `temperature` when given; the reason when there are none)."""
    g = t["relative_gains"]
    if g.empty:
        return g, ""
    g = g[(g["rule"] == rule) & (g["baseline"] == baseline)]
    if "metric" in g.columns:
        g = g[g["metric"] == "accepted"]
    if temperature is not None:
        g = g[np.isclose(g["temperature"], temperature)]
    return eagle3(g)


def _offline(cells: pd.DataFrame, why: str, what: str, conditions: str) -> Finding:
    return unmeasured(why) if why else direction(cells, what, conditions)


def _temperatures(cells: pd.DataFrame) -> str:
    if cells.empty:
        return "no temperature"
    return ", ".join(f"T={t:g}" for t in sorted(set(cells["temperature"])))


def _budgets(cells: pd.DataFrame) -> str:
    if cells.empty:
        return "none"
    return ", ".join(str(int(b)) for b in sorted(set(cells["budget"])))


# -- claim 1 ---------------------------------------------------------------------------------------

def _tv_cell(r) -> str:
    interval = f" [{r.tv_lo:.3f}, {r.tv_hi:.3f}]" if np.isfinite(r.tv_lo) else ""
    return (f"{r.source} T={r.temperature:g} {r.tv:.3f}{interval} ({int(r.hits)} of "
            f"{int(r.positions)} positions, first-ranked token differs at {r.best_differs:.0%})")


def exact_reuse(t: dict) -> Finding:
    """Illustrated where the row logs show the same last token under another earlier context
    with another row: the total variation's interval above 0 in some cell; the toy pair shows
    it by construction and is not judged."""
    reuse = t["reuse"]
    if reuse.empty or "row" not in reuse.columns:
        return unmeasured("no reuse table of this kind (results/tables/reuse.csv)")
    same = reuse[reuse["row"] == SAME_LAST[1]]
    logs, toy = same[same["source"] != TOY], same[same["source"] == TOY]
    cells = logs[logs["hits"] > 0]
    conditions = ("row logs: each position's exact root row against the row logged at the latest "
                  "earlier position of its turn that ends in the same token, over the tokens "
                  "both hold (a lower bound)")
    if cells.empty:
        return unmeasured("no logged position ends in a token that ended an earlier logged "
                          "context of its turn" if len(logs) else "no row logs", conditions)
    shown = cells["tv_lo"] > 0
    named_cells = cells.rename(columns={"source": "pair"})
    if shown.any():
        verdict = ILLUSTRATED
        why = f"{int(shown.sum())} of {len(cells)} cells' intervals lie above 0: " + named(
            named_cells[shown.to_numpy()])
    else:
        verdict, why = INCONCLUSIVE, f"all {len(cells)} cells' intervals include 0 (or none has one)"
    ours = (f"the same-last-token row against the exact one: total variation "
            f"{_spread(cells, 'tv', '{:.3f}')}, first-ranked token differs at "
            f"{_spread(cells, 'best_differs', '{:.0%}')} of hits ({len(cells)} cells)")
    if len(toy):
        ours += (f"; toy pair, by construction: total variation {_spread(toy, 'tv', '{:.3f}')}")
    return Finding(ours, conditions, verdict, why,
                   "; ".join(_tv_cell(r) for r in cells.itertuples()))


def _spread(rows: pd.DataFrame, column: str, fmt: str) -> str:
    """'0.24 to 0.31', or '0.31' when they agree at that precision."""
    lo, hi = fmt.format(rows[column].min()), fmt.format(rows[column].max())
    return lo if lo == hi else f"{lo} to {hi}"


# -- claims 2-4 ------------------------------------------------------------------------------------

def kept_row(t: dict) -> Finding:
    return unmeasured(KEPT_ROW)


def rerank_at(temperature: float) -> Callable[[dict], Finding]:
    def judge(t: dict) -> Finding:
        cells, why = gain_cells(t, "target_rerank", "draft_rank", temperature)
        return _offline(cells, why, f"target_rerank / draft_rank gains at T={temperature:g}",
                        f"offline, EAGLE-3 pairs, budgets {_budgets(cells)}")
    return judge


def rerank_small_budgets(t: dict) -> Finding:
    """Per pair and temperature, the smallest budget's gain against the largest's: holds where
    every smallest-budget interval lies above the largest's, contradicted where one lies
    below it."""
    cells, why = gain_cells(t, "target_rerank", "draft_rank")
    cells = cells[np.isfinite(cells["gain"])] if len(cells) else cells
    if why or cells.empty or cells["budget"].nunique() < 2:
        return unmeasured(why or "fewer than two budgets scored")
    lines, above, below = [], [], []
    for (pair, temp), g in cells.groupby(["pair", "temperature"]):
        small, large = g.loc[g["budget"].idxmin()], g.loc[g["budget"].idxmax()]
        where = f"{pair} T={temp:g}"
        lines.append(f"{where}: B={int(small.budget)} {small.gain:+.1%} [{small.lo:+.1%}, "
                     f"{small.hi:+.1%}] vs B={int(large.budget)} {large.gain:+.1%} "
                     f"[{large.lo:+.1%}, {large.hi:+.1%}]")
        if small["lo"] > large["hi"]:
            above.append(where)
        elif small["hi"] < large["lo"]:
            below.append(where)
    if below:
        verdict, why = CONTRADICTED, "the smallest budget's interval lies below the largest's at "
        why += ", ".join(below)
    elif len(above) == len(lines):
        verdict, why = HOLDS, "the smallest budget's interval lies above the largest's everywhere"
    else:
        verdict = INCONCLUSIVE
        why = f"the intervals overlap at {len(lines) - len(above)} of {len(lines)} pair x temperature"
    return Finding("; ".join(lines), f"offline, EAGLE-3 pairs, smallest vs largest budget scored "
                   f"({_budgets(cells)})", verdict, why, "; ".join(lines))


def fts_equal_cap(t: dict) -> Finding:
    cells, why = gain_cells(t, "first_token", "pearl")
    return _offline(cells, why, "first_token / pearl gains",
                    f"offline, EAGLE-3 pairs, {_temperatures(cells)}, budgets {_budgets(cells)}, "
                    + CAP)


def fts_equal_size(t: dict) -> Finding:
    """At pearl's mean tree size; `ours` adds the cells at the paper's tree sizes (pearl's
    27-39 nodes), or at pearl's largest trees where none reaches them."""
    e = t["equal_size"]
    cells = e[(e["rule"] == "first_token") & (e["baseline"] == "pearl")] if len(e) else e
    cells, why = eagle3(cells)
    found = _offline(cells, why, "first_token / pearl gains at pearl's mean tree size",
                     f"offline, EAGLE-3 pairs, {_temperatures(cells)}, at pearl's mean tree size "
                     f"at budgets {_budgets(cells)} (first_token's curve interpolated between "
                     "scored budgets)")
    if found.verdict == UNMEASURED:
        return found
    low, high = (float(x) for x in PAPER_NODES["pearl"].split("-"))
    big = cells[cells["nodes"].between(low, high)]
    label = f"at the paper's tree sizes (pearl {PAPER_NODES['pearl']} nodes)"
    if big.empty:
        big = cells.loc[cells.groupby(["pair", "temperature"])["nodes"].idxmax()]
        label = "at pearl's largest trees here"
    sized = "; ".join(f"{cell_name(r)} ({r.nodes:.1f} nodes) {r.gain:+.1%} [{r.lo:+.1%}, "
                      f"{r.hi:+.1%}]" for r in big.itertuples())
    return Finding(f"{found.ours}; {label}: {sized}", found.conditions, found.verdict,
                   found.why, found.cells)


CLAIMS = [
    Claim("1 exact reuse", "Exact reuse needs the row of the full next-round context: the same "
          "last token under a different earlier context can have another row",
          "the caa example (no figures)", "reuse", exact_reuse),
    Claim("2 cost of a kept row", "Keeping the target's distribution (an exact row for the next "
          "tree without another target pass) can require giving up accepted tokens, and under "
          "stated conditions that loss persists across rounds", "no figures", "-", kept_row),
    Claim("3 rerank, T=0", "Reranking the first-level branches by the root row raises expected "
          "accepted length over draft ranking", "higher on all six targets", "relative_gains",
          rerank_at(0.0)),
    Claim("3 rerank, T=1", "The same at temperature 1", "higher on all six targets",
          "relative_gains", rerank_at(1.0)),
    Claim("3 rerank, small budgets", "Reranking's gain is larger at smaller budgets",
          "larger at smaller budgets (no figures)", "relative_gains", rerank_small_budgets),
    Claim("4 fts, equal cap", "First-token sampling beats pruning a preset tree (PEARL) in "
          "expected accepted length at the same cap", "higher (no figures)", "relative_gains",
          fts_equal_cap),
    Claim("4 fts, equal size", "First-token sampling beats PEARL at the same mean tree size",
          "higher (no figures)", "equal_size", fts_equal_size),
    Claim("5 fts online, direction", "Online with EAGLE-3 drafts at B=59, first-token sampling "
          "accepts more draft tokens than PEARL, with larger trees",
          f"more, with mean non-root nodes {PAPER_NODES['fts']} vs {PAPER_NODES['pearl']}",
          "online_gain", fts_online),
    Claim("5 fts online, magnitude", "The same gain lies in the paper's range",
          "+3.3% to +7.3% (smallest gain's 95% CI 2.6-4.1%)", "online_gain",
          fts_online_magnitude),
    Claim("6 rerank faster", "With the root pass overlapping standalone drafting, rerank "
          "decodes faster than draft ranking", "faster (no figures)", "online_gain",
          faster("rerank", "draft_rank")),
    Claim("6 fts faster", "With the root pass overlapping standalone drafting, first-token "
          "sampling decodes faster than draft ranking", "faster (no figures)", "online_gain",
          faster("fts", "draft_rank")),
    Claim("7 fts vs pearl, caps 8", "With standalone drafts, first-token sampling decodes "
          "faster than PEARL, both capped at 8", "faster on two RTX A6000s (no figures)",
          "online_gain", faster("fts", "pearl", budget=8)),
    Claim("7 fts vs pearl, matched", "With standalone drafts, first-token sampling at the cap "
          "matching PEARL's mean tree size decodes faster than PEARL at 59",
          "faster, PEARL at 59 vs first-token at 40-43 (no figures)", "online_gain",
          faster("fts", "pearl", matched=True)),
]


def claims_table(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per claim (`COLUMNS`), from the tidy tables by name (`TABLES`; a missing one
    empty)."""
    tables = {name: tables.get(name, pd.DataFrame()) for name in TABLES}
    rows = []
    for c in CLAIMS:
        f = c.judge(tables)
        rows.append({"claim": c.name, "statement": c.statement, "paper": c.paper,
                     "ours": f.ours, "conditions": f.conditions, "table": c.table,
                     "verdict": f.verdict, "why": f.why, "cells": f.cells})
    return pd.DataFrame(rows, columns=COLUMNS)


def read_tables(folder: str) -> dict[str, pd.DataFrame]:
    """The tidy tables `claims_table` reads, from `folder` (a missing or empty one: empty;
    a run without rules that commit t0 writes an empty equal_size table)."""
    tables = {}
    for name in TABLES:
        try:
            tables[name] = pd.read_csv(f"{folder}/{name}.csv")
        except (FileNotFoundError, pd.errors.EmptyDataError):
            tables[name] = pd.DataFrame()
    return tables


def write_claims(tables: dict[str, pd.DataFrame], stem: str) -> pd.DataFrame:
    """`stem`.csv (one row per claim, `COLUMNS`) and `stem`.md (the same for reading)."""
    table = claims_table(tables)
    write_csv(table, f"{stem}.csv")
    atomic_write_text(f"{stem}.md", markdown(table))
    return table


def markdown(table: pd.DataFrame) -> str:
    counts = table["verdict"].value_counts()
    tally = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
    lines = [
        "The paper's claims in this run (written by the pipeline from results/tables/; "
        f"{len(table)} rows: {tally}). Each cell is a comparison with its 95% interval "
        "(prompts resampled): a claim holds when every cell's interval lies on its side of "
        "0, is contradicted when one lies on the other side, is inconclusive otherwise, and "
        "is illustrated when the data show an instance of what it says can happen.",
        "",
        "| claim | the paper | this run | verdict | table |",
        "|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(f"| **{r.claim}**: {r.statement} | {r.paper} | {r.ours or '-'} | "
                     f"{r.verdict} | {r.table} |")
    lines += ["", "Conditions, reasons and cells:", ""]
    for r in table.itertuples():
        detail = "; ".join(x for x in (r.conditions, r.why) if x)
        cells = f" Cells: {r.cells}." if r.cells else ""
        lines.append(f"- **{r.claim}** ({r.verdict}): {detail or '-'}.{cells}")
    return "\n".join(lines) + "\n"
