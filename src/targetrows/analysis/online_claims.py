"""The paper's online claims (5-7), judged on the `online_gain` table (`analysis.online`).

Claim 5 is about EAGLE-3 drafts at budget 59: it is judged on the runs with EAGLE-3 drafts at the
fixed budget both `fts` and `pearl` ran that lies closest to 59, in two rows: the direction
(more accepted draft tokens, and larger trees) and the magnitude (the gain within the paper's
+3.3% to +7.3%). Claims 6 and 7 are about speed with standalone drafts on two GPUs: they are
judged only on runs with a standalone draft whose root pass overlapped drafting on a second
device (the conditions files record both devices), and claim 7's matched cap only where the
measured trees matched (`fts`'s mean tree size within `MATCH_TOLERANCE` of `pearl`'s).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from .verdicts import Finding, direction, in_range, named, sides, unmeasured

PAPER_BUDGET = 59  # the paper's online budget (claims 5 and 7)
PAPER_GAIN = (0.033, 0.073)  # claim 5: fts over pearl, accepted draft tokens
PAPER_NODES = {"fts": "43-53", "pearl": "27-39"}  # claim 5: mean non-root nodes per round
MATCH_TOLERANCE = 0.10  # claim 7: a matched cap matched when its trees are this close in size


def online_cells(t: dict, decoder: str, baseline: str, metric: str) -> pd.DataFrame:
    g = t["online_gain"]
    if g.empty:
        return g
    return g[(g["decoder"] == decoder) & (g["baseline"] == baseline) & (g["metric"] == metric)]


def fixed(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells at one fixed budget against the same budget (no auto pick, no matched cap)."""
    if cells.empty:
        return cells
    return cells[~cells["auto"].astype(bool) & ~cells["matched"].astype(bool)
                 & (cells["budget"] == cells["baseline_budget"])]


def closest_budget(budgets, target: int = PAPER_BUDGET) -> int:
    """The budget closest to `target` (a tie: the larger)."""
    return int(min(set(budgets), key=lambda b: (abs(int(b) - target), -int(b))))


def _kinds(cells: pd.DataFrame) -> str:
    kinds = sorted(map(str, set(cells["draft_kind"].dropna()))) if len(cells) else []
    return ", ".join(kinds) or "none recorded"


# -- claim 5 ------------------------------------------------------------------------------------

def _fts_pearl(t: dict) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(accepted, nodes) cells of fts over pearl with EAGLE-3 drafts at the budget closest to
    59, and the reason when there are none."""
    ran = fixed(online_cells(t, "fts", "pearl", "accepted"))
    heads = ran[ran["draft_kind"] == "eagle3"] if len(ran) else ran
    if heads.empty:
        why = ("no fts run beside a pearl run at the same budget" if ran.empty else
               f"no fts run beside pearl with EAGLE-3 drafts (this run's: {_kinds(ran)})")
        return heads, heads, why
    budget = closest_budget(heads["budget"])
    nodes = fixed(online_cells(t, "fts", "pearl", "nodes"))
    at = nodes["budget"] == budget if len(nodes) else []
    nodes = nodes[at & (nodes["draft_kind"] == "eagle3")] if len(nodes) else nodes
    return heads[heads["budget"] == budget], nodes, ""


def _setting(cells: pd.DataFrame) -> str:
    budget, depth = int(cells["budget"].iloc[0]), int(cells["depth"].iloc[0])
    paper = "" if budget == PAPER_BUDGET else f" (the paper: {PAPER_BUDGET})"
    return f"online, EAGLE-3 drafts, B={budget}{paper}, pool depth {depth}"


def _sizes(nodes: pd.DataFrame) -> str:
    """Both mean tree sizes per cell (non-root nodes per round), against the paper's."""
    per_cell = [f"{r.value:.1f} vs {r.baseline_value:.1f} (T={r.temperature:g})"
                for r in nodes.itertuples()]
    return (f"mean non-root nodes per round fts vs pearl: {', '.join(per_cell) or 'none'} "
            f"(the paper: {PAPER_NODES['fts']} vs {PAPER_NODES['pearl']})")


def fts_online(t: dict) -> Finding:
    """Claim 5's direction: fts accepts more draft tokens than pearl, with larger trees: every
    cell of both metrics judged (`verdicts.direction`)."""
    accepted, nodes, why = _fts_pearl(t)
    if why:
        return unmeasured(why)
    cells = pd.concat([accepted.assign(label="accepted"), nodes.assign(label="nodes")])
    found = direction(cells, "fts / pearl online gains", _setting(accepted))
    ours = f"{found.ours}; {_sizes(nodes)}"
    return Finding(ours, found.conditions, found.verdict, found.why, found.cells)


def fts_online_magnitude(t: dict) -> Finding:
    """Claim 5's magnitude: the accepted-token gain within the paper's range."""
    accepted, nodes, why = _fts_pearl(t)
    if why:
        return unmeasured(why)
    found = in_range(accepted, *PAPER_GAIN, _setting(accepted))
    return Finding(f"{found.ours}; {_sizes(nodes)}", found.conditions, found.verdict,
                   found.why, found.cells)


# -- claims 6 and 7 ------------------------------------------------------------------------------

def _overlapped(cells: pd.DataFrame) -> pd.Series:
    """Runs whose root pass ran alongside drafting with the draft on a second device."""
    if "draft_device" not in cells.columns:
        return pd.Series(False, index=cells.index)
    devices = cells["draft_device"].notna() & cells["target_device"].notna()
    return (cells["overlap"].fillna(False).astype(bool) & devices
            & (cells["draft_device"].astype(str) != cells["target_device"].astype(str)))


def _devices(cells: pd.DataFrame) -> str:
    pairs = sorted({(str(r.target_device), str(r.draft_device)) for r in cells.itertuples()})
    return ", ".join(f"target on {a}, draft on {b}" for a, b in pairs)


def _speed_cells(t: dict, decoder: str, baseline: str, budget: int | None,
                 matched: bool) -> tuple[pd.DataFrame, str]:
    """The tokens/s cells a speed claim covers, or none and what is missing."""
    cells = online_cells(t, decoder, baseline, "tokens_per_s")
    if not cells.empty:
        cells = cells[cells["matched"].astype(bool)] if matched else fixed(cells)
    if budget is not None and not cells.empty:
        cells = cells[cells["budget"] == budget]
    if cells.empty:
        return cells, (f"no {decoder} run beside {baseline}" + (f" at B={budget}" if budget else "")
                       + (" at a matched cap" if matched else "")
                       + f" (this run's drafts: {_kinds(t['online_gain'])})")
    standalone = cells[cells["draft_kind"] == "standalone"]
    if standalone.empty:
        return standalone, ("no standalone draft (the paper's speed runs used one); this run "
                            f"drafts with {_kinds(cells)}")
    overlapped = standalone[_overlapped(standalone)]
    if overlapped.empty:
        return overlapped, ("no run overlapped the root pass with drafting on a second device "
                            "(the paper used two GPUs: pairs[].draft_own_gpu; runs without the "
                            "devices recorded count as none)")
    return overlapped, ""


def _unmatched(t: dict, cells: pd.DataFrame) -> pd.Series:
    """Matched-cap cells whose measured trees did not match: fts's mean non-root nodes at the
    cap differ from pearl's beyond `MATCH_TOLERANCE` (the nodes gain's interval)."""
    nodes = online_cells(t, "fts", "pearl", "nodes")
    key = ["pair", "temperature", "budget", "baseline_budget"]
    nodes = nodes[nodes["matched"].astype(bool)].drop_duplicates(key) if len(nodes) else nodes
    both = cells[key].merge(nodes.reindex(columns=key + ["lo", "hi"]), on=key, how="left")
    above, below = sides(both, -MATCH_TOLERANCE, MATCH_TOLERANCE)
    return pd.Series((above | below | both["lo"].isna()).to_numpy(), index=cells.index)


def faster(decoder: str, baseline: str, *, budget: int | None = None,
           matched: bool = False) -> Callable[[dict], Finding]:
    """Tokens/s of `decoder` over `baseline`, standalone drafts, root pass overlapped on a
    second device: at one budget, or at a matched cap (checked against the trees' sizes)."""
    def judge(t: dict) -> Finding:
        cells, why = _speed_cells(t, decoder, baseline, budget, matched)
        if why:
            return unmeasured(why)
        note = ""
        if matched:
            off = _unmatched(t, cells)
            if off.all():
                return unmeasured("no matched cap matched pearl's measured tree size within "
                                  f"{MATCH_TOLERANCE:.0%}: {named(cells[off])}")
            note = f"left out, trees not matched: {named(cells[off])}" if off.any() else ""
            cells = cells[~off]
        where = (f"matched caps {_budgets(cells['budget'])} against {baseline} at "
                 f"{_budgets(cells['baseline_budget'])}" if matched
                 else f"budgets {_budgets(cells['budget'])}")
        found = direction(cells, f"{decoder} / {baseline} tokens/s",
                          f"online, standalone drafts, root pass overlapped ({_devices(cells)}), "
                          + where)
        why = "; ".join(w for w in (found.why, note) if w)
        return Finding(found.ours, found.conditions, found.verdict, why, found.cells)
    return judge


def _budgets(values) -> str:
    return ", ".join(str(int(b)) for b in sorted(set(np.asarray(values, dtype=float))))
