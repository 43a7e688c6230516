"""The paper's claims, one by one: which of them this run's tables reproduce, and by how much.

The paper (arXiv, 21 October 2026; code in the repository TargetRows) makes seven claims; each
is one or more rows here, read off the pipeline's tidy tables (`results/tables/*.csv`), never
re-estimated. A row gives the paper's figure, this run's with its 95% interval (prompts
resampled), the table it comes from, the conditions it was measured under, and a verdict:

    holds           every cell the claim covers (each pair, temperature and budget the table
                    has) agrees, with an interval that excludes the opposite;
    does not hold   some cell does not: its interval includes 0 or lies on the wrong side
                    (`why` says which and how many);
    not measured    the run has no cell under the claim's conditions (`why` says what is
                    missing: a standalone draft, a root pass that overlapped drafting, ...).

Where the paper states a claim without a figure or a definition to test, the row says so. A
claim about a condition the run does not reproduce exactly (a budget of 16 where the paper used
59) is judged at the run's closest condition, which `conditions` names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from targetrows.core.atomic import atomic_write_text

from .frames import with_ci
from .output import write_csv

HOLDS, FAILS, UNMEASURED = "holds", "does not hold", "not measured"
COLUMNS = ["claim", "statement", "paper", "ours", "conditions", "table", "verdict", "why"]
TABLES = ("relative_gains", "equal_size", "online_gain", "reuse")


@dataclass(frozen=True)
class Finding:
    ours: str  # this run's figure(s), with intervals
    conditions: str  # what the run measured it under
    verdict: str
    why: str = ""


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str
    paper: str  # the paper's figure, as it states it
    table: str  # the table the finding is read from
    judge: Callable[[dict[str, pd.DataFrame]], Finding]


# -- reading cells ------------------------------------------------------------------------------

def _cell(row) -> str:
    """Where a cell sits: 'pair T=0 B=16'."""
    parts = [str(row.pair), f"T={row.temperature:g}"]
    if "budget" in row._fields:
        parts.append(f"B={int(row.budget)}")
    return " ".join(parts)


def _range(cells: pd.DataFrame) -> str:
    """The smallest and the largest gain with their intervals and where they sit."""
    shown = cells.assign(text=with_ci(cells)).sort_values("gain", kind="stable")
    ends = shown.iloc[[0, -1]] if len(shown) > 1 else shown
    return (" to ".join(f"{r.text} ({_cell(r)})" for r in ends.itertuples())
            + f" ({len(cells)} cells)")


def _positive(cells: pd.DataFrame, what: str, conditions: str) -> Finding:
    """Holds when every cell's interval lies above 0. A cell without a ratio (its baseline
    accepted nothing: `pearl` at budget 1) shows nothing either way: it is left out of the
    verdict, and the row names it; a cell without an interval (one prompt) cannot hold."""
    defined = cells[np.isfinite(cells["gain"])] if len(cells) else cells
    if defined.empty:
        return Finding("", conditions, UNMEASURED, f"no {what} in this run's tables")
    above = defined["lo"] > 0
    below = defined["hi"] < 0
    why = []
    if not above.all():
        why.append(f"{int((~above).sum())} of {len(defined)} cells' intervals include 0 or lie "
                   "below it")
    if below.any():
        worst = defined[below].sort_values("gain", kind="stable").head(1)
        w = next(worst.assign(text=with_ci(worst)).itertuples())
        why.append(f"{int(below.sum())} lie below 0 (lowest: {w.text} at {_cell(w)})")
    if len(defined) < len(cells):
        left = cells[~np.isfinite(cells["gain"])]
        why.append(f"left out: {len(left)} cells without a ratio, the baseline accepting nothing "
                   f"({', '.join(_cell(r) for r in left.itertuples())})")
    return Finding(_range(defined), conditions, HOLDS if above.all() else FAILS, "; ".join(why))


def _gains(t: dict, rule: str, baseline: str, temperature: float | None = None) -> pd.DataFrame:
    g = t["relative_gains"]
    if g.empty:
        return g
    g = g[(g["rule"] == rule) & (g["baseline"] == baseline)]
    if "metric" in g.columns:
        g = g[g["metric"] == "accepted"]
    return g if temperature is None else g[np.isclose(g["temperature"], temperature)]


def _temperatures(cells: pd.DataFrame) -> str:
    if cells.empty:
        return "no temperature"
    return ", ".join(f"T={t:g}" for t in sorted(set(cells["temperature"])))


def _budgets(cells: pd.DataFrame) -> str:
    if cells.empty:
        return "none"
    return ", ".join(str(int(b)) for b in sorted(set(cells["budget"])))


def _span(values: pd.Series, fmt: str) -> str:
    """'0.24 to 0.31', or '0.31' when they agree at that precision."""
    lo, hi = fmt.format(values.min()), fmt.format(values.max())
    return lo if lo == hi else f"{lo} to {hi}"


# -- the claims ---------------------------------------------------------------------------------

def exact_reuse(t: dict) -> Finding:
    reuse = t["reuse"]
    if reuse.empty:
        return Finding("", "", UNMEASURED, "no reuse table (results/tables/reuse.csv)")
    toy = reuse[reuse["found"].notna()]
    logs = reuse[reuse["found"].isna()]
    found = float((toy["found"] * toy["positions"]).sum())
    parts = [f"next root's row among the rows the verify pass computed: {found:.0f} of "
             f"{int(toy['positions'].sum())} toy rounds"] if len(toy) else []
    for name, rows in (("toy pair", toy), ("row logs", logs)):
        if len(rows):
            parts.append(f"{name}: row one token short vs exact row, total variation "
                         f"{_span(rows['tv'], '{:.2f}')}, first-ranked token differs at "
                         f"{_span(rows['best_differs'], '{:.0%}')} of positions")
    conditions = (f"toy pair and {len(logs)} pair x temperature row logs "
                  "(first-level tokens: a lower bound)") if len(logs) else "toy pair only"
    exact = found == 0 and (reuse["tv_lo"] > 0).all()
    why = "" if exact else ("a next root's row was found among the verify pass's rows" if found
                            else "some source's interval of the total variation includes 0")
    return Finding("; ".join(parts), conditions, HOLDS if exact else FAILS, why)


def stale_cost(t: dict) -> Finding:
    cells = _gains(t, "target_rerank", "stale_rerank")
    found = _positive(cells, "target_rerank / stale_rerank gains",
                      f"offline, {_temperatures(cells)}, budgets {_budgets(cells)}")
    persist = ("the loss's persistence across rounds is not tested: the paper gives its "
               "conditions without figures")
    return Finding(found.ours, found.conditions, found.verdict,
                   "; ".join(w for w in (found.why, persist) if w))


def rerank_at(temperature: float) -> Callable[[dict], Finding]:
    def judge(t: dict) -> Finding:
        cells = _gains(t, "target_rerank", "draft_rank", temperature)
        return _positive(cells, f"target_rerank / draft_rank gains at T={temperature:g}",
                         f"offline, budgets {_budgets(cells)}")
    return judge


def rerank_small_budgets(t: dict) -> Finding:
    cells = _gains(t, "target_rerank", "draft_rank")
    cells = cells[np.isfinite(cells["gain"])] if len(cells) else cells
    if cells.empty or cells["budget"].nunique() < 2:
        return Finding("", "", UNMEASURED, "fewer than two budgets scored")
    lines, fails = [], []
    for (pair, temp), g in cells.groupby(["pair", "temperature"]):
        small, large = g.loc[g["budget"].idxmin()], g.loc[g["budget"].idxmax()]
        lines.append(f"{pair} T={temp:g}: B={int(small.budget)} {small.gain:+.1%} vs "
                     f"B={int(large.budget)} {large.gain:+.1%}")
        if not small["lo"] > large["hi"]:
            fails.append(f"{pair} T={temp:g}")
    why = ("the smallest budget's interval does not lie above the largest's at "
           + ", ".join(fails)) if fails else ""
    return Finding("; ".join(lines), f"offline, smallest vs largest budget scored "
                   f"({_budgets(cells)})", FAILS if fails else HOLDS, why)


def fts_equal_cap(t: dict) -> Finding:
    cells = _gains(t, "first_token", "pearl")
    return _positive(cells, "first_token / pearl gains",
                     f"offline, {_temperatures(cells)}, budgets {_budgets(cells)}")


def fts_equal_size(t: dict) -> Finding:
    e = t["equal_size"]
    cells = e[(e["rule"] == "first_token") & (e["baseline"] == "pearl")] if len(e) else e
    return _positive(cells, "first_token / pearl gains at pearl's mean tree size",
                     f"offline, {_temperatures(cells)}, at pearl's mean tree size at budgets "
                     f"{_budgets(cells)} (first_token's curve interpolated between scored budgets)")


def _online(t: dict, decoder: str, baseline: str, metric: str) -> pd.DataFrame:
    g = t["online_gain"]
    if g.empty:
        return g
    return g[(g["decoder"] == decoder) & (g["baseline"] == baseline) & (g["metric"] == metric)]


def _fixed(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells at one fixed budget against the same budget (no auto pick, no matched cap)."""
    if cells.empty:
        return cells
    return cells[~cells["auto"].astype(bool) & ~cells["matched"].astype(bool)
                 & (cells["budget"] == cells["baseline_budget"])]


def fts_online(t: dict) -> Finding:
    cells = _fixed(_online(t, "fts", "pearl", "accepted"))
    if cells.empty:
        return Finding("", "", UNMEASURED, "no fts run beside a pearl run at the same budget")
    heads = cells[cells["draft_kind"] == "eagle3"]
    cells = heads if len(heads) else cells  # the paper's condition, where the run has it
    budget = int(cells["budget"].max())
    cells = cells[cells["budget"] == budget]
    found = _positive(cells, "fts / pearl online gains", "")
    nodes = _fixed(_online(t, "fts", "pearl", "nodes"))
    nodes = nodes[(nodes["budget"] == budget)
                  & nodes["draft_kind"].isin(set(cells["draft_kind"]))]
    sizes = ", ".join(f"{r.value:.1f} vs {r.baseline_value:.1f}" for r in nodes.itertuples())
    larger = len(nodes) > 0 and bool((nodes["value"] > nodes["baseline_value"]).all())
    kinds = ", ".join(sorted({str(k) for k in cells["draft_kind"].dropna()})) or "unrecorded"
    conditions = f"online, B={budget}{'' if budget == 59 else ' (the paper: 59)'}, {kinds} drafts"
    why = [found.why] if found.why else []
    if not larger:
        why.append("fts's trees are not larger than pearl's in every cell")
    verdict = found.verdict if larger or found.verdict != HOLDS else FAILS
    return Finding(f"{found.ours}; mean non-root nodes fts vs pearl: {sizes}", conditions,
                   verdict, "; ".join(why))


def faster(decoder: str, baseline: str, *, overlap: bool, budget: int | None = None,
           matched: bool = False) -> Callable[[dict], Finding]:
    """Tokens/s of `decoder` over `baseline` with standalone drafts: with the root pass
    overlapped (`overlap`), at one budget, or at a matched cap against the baseline's cap."""
    def judge(t: dict) -> Finding:
        cells = _online(t, decoder, baseline, "tokens_per_s")
        if not cells.empty:
            cells = cells[cells["matched"].astype(bool)] if matched else _fixed(cells)
        if budget is not None and not cells.empty:
            cells = cells[cells["budget"] == budget]
        missing = []
        if cells.empty:
            ran = t["online_gain"]
            kinds = sorted(map(str, set(ran["draft_kind"].dropna()))) if len(ran) else []
            missing.append(f"no {decoder} run beside {baseline}"
                           + (f" at B={budget}" if budget else "")
                           + (" at a matched cap" if matched else "")
                           + (f" (this run's drafts: {', '.join(kinds)})" if kinds else ""))
        else:
            standalone = cells[cells["draft_kind"] == "standalone"]
            if standalone.empty:
                missing.append("no standalone draft (the paper's speed runs used one); this run "
                               f"drafts with {', '.join(sorted(map(str, set(cells['draft_kind']))))}")
            cells = standalone
            if overlap and not cells.empty:
                cells = cells[cells["overlap"].astype(bool)]
                if cells.empty:
                    missing.append("no run overlapped the root pass with drafting (target and "
                                   "draft on one device; the paper used two GPUs: "
                                   "pairs[].draft_own_gpu)")
        if missing:
            return Finding("", "", UNMEASURED, "; ".join(missing))
        where = (f"matched caps {_budgets(cells)} against {baseline} at "
                 f"{', '.join(str(int(b)) for b in sorted(set(cells['baseline_budget'])))}"
                 if matched else f"budgets {_budgets(cells)}")
        overlapped = cells["overlap"].astype(bool)
        setup = ("root pass overlapped" if overlapped.all() else "root pass in turn"
                 if not overlapped.any() else "root pass overlapped in some runs")
        return _positive(cells, f"{decoder} / {baseline} tokens/s",
                         f"online, standalone drafts, {setup}, {where}")
    return judge


CLAIMS = [
    Claim("1 exact reuse", "Exact reuse needs the row of the full next-round context; rows are "
          "keyed by the whole context", "the caa example (no figures)", "reuse", exact_reuse),
    Claim("2 cost of a kept row", "Keeping the target's distribution can cost accepted tokens, "
          "and under stated conditions that loss persists across rounds; measured here: the "
          "exact root row over the stale row one token short (target_rerank over stale_rerank)",
          "no figures", "relative_gains", stale_cost),
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
    Claim("5 fts online", "Online with EAGLE-3 drafts at B=59, first-token sampling accepts "
          "more draft tokens than PEARL, with larger trees",
          "+3.3% to +7.3% (smallest gain's 95% CI 2.6-4.1%); mean non-root nodes 43-53 vs 27-39",
          "online_gain", fts_online),
    Claim("6 rerank faster", "With the root pass overlapping standalone drafting, rerank "
          "decodes faster than draft ranking", "faster (no figures)", "online_gain",
          faster("rerank", "draft_rank", overlap=True)),
    Claim("6 fts faster", "With the root pass overlapping standalone drafting, first-token "
          "sampling decodes faster than draft ranking", "faster (no figures)", "online_gain",
          faster("fts", "draft_rank", overlap=True)),
    Claim("7 fts vs pearl, caps 8", "With standalone drafts, first-token sampling decodes "
          "faster than PEARL, both capped at 8", "faster on two RTX A6000s (no figures)",
          "online_gain", faster("fts", "pearl", overlap=False, budget=8)),
    Claim("7 fts vs pearl, matched", "With standalone drafts, first-token sampling at the cap "
          "matching PEARL's mean tree size decodes faster than PEARL at 59",
          "faster, PEARL at 59 vs first-token at 40-43 (no figures)", "online_gain",
          faster("fts", "pearl", overlap=False, matched=True)),
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
                     "verdict": f.verdict, "why": f.why})
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
    tally = ", ".join(f"{counts.get(v, 0)} {v}" for v in (HOLDS, FAILS, UNMEASURED))
    lines = [
        "The paper's claims in this run (written by the pipeline from results/tables/; "
        f"{len(table)} rows: {tally}). A claim holds when every cell it covers agrees with an "
        "interval (95%, prompts resampled) that excludes the opposite; the conditions say what "
        "this run measured it under.",
        "",
        "| claim | the paper | this run | verdict | table |",
        "|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        ours = r.ours or "-"
        lines.append(f"| **{r.claim}**: {r.statement} | {r.paper} | {ours} | {r.verdict} | "
                     f"{r.table} |")
    lines += ["", "Conditions and reasons:", ""]
    for r in table.itertuples():
        detail = "; ".join(x for x in (r.conditions, r.why) if x)
        lines.append(f"- **{r.claim}** ({r.verdict}): {detail or '-'}")
    return "\n".join(lines) + "\n"
