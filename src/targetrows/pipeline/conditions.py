"""Budget conditions of the online runs, and the matched cap: one place for both.

A decoder runs a list of budget conditions (config `decode.budgets`, or its own
`decode.decoder_budgets`), each a `targetrows.decoding.budget.Budget`: `Fixed(n)` (non-root
nodes per tree, at the pool's depth); `Auto`: the budget and pool depth the cost model predicts
fastest on the machine that runs the job (`targetrows.cost.calibration.auto_budget`, picked
once per pair, temperature and decoder, compared with the baseline's own `Auto` condition); or
`Matched(X)`: the cap at which the decoder's mean non-root nodes per round equals its
baseline's (`Decoder.baseline`) measured online at budget X, found from the row logs' curve of
the decoder's rule's mean tree size against budget (`matched_cap`). The paper's speed
comparison is PEARL capped at 59 against first-token sampling at its matched cap (40-43 there):
first-token trees are larger at equal cap, so an equal cap would not compare equal work.

Every decode job writes its resolved conditions next to its answers (`write_conditions`); the
tables read them back (`read_conditions`), so they always label a run with what it ran.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from targetrows.core.atomic import atomic_write_text
from targetrows.decoding.budget import NO_TREE, Auto, Budget, Fixed, Matched, budget_spec, parse_budget
from targetrows.decoding.registry import get_decoder


def baseline_budget(budget: Budget):
    """The baseline's condition a condition is compared with, as the conditions file writes
    it: its own budget, a matched one's X, or the baseline's own auto."""
    if isinstance(budget, Matched):
        return budget.at
    return budget_spec(budget)


def mean_nodes(answers: Sequence[dict], budget: int) -> float:
    """Mean non-root nodes verified per round over decoder answer records at `budget`."""
    nodes = [n for a in answers if a.get("budget") == budget
             for n in (a.get("rounds") or {}).get("nodes", [])]
    if not nodes:
        raise ValueError(f"no rounds at budget {budget} in {len(answers)} answers; cannot "
                         "match a cap to the baseline's tree size")
    return float(np.mean(nodes))


def size_curve(logs, rule: str, max_budget: int) -> np.ndarray:
    """Mean non-root nodes of `rule`'s trees at budgets 1..max_budget over every scored
    position of the row logs (index b - 1 holds budget b)."""
    from targetrows.rowlog.score import score_log

    budgets = np.arange(1, max_budget + 1)
    tables = [score_log(log, budgets, rules=(rule,)) for log in logs]
    nodes = np.concatenate([t["nodes"] for t in tables]).reshape(-1, len(budgets))
    if len(nodes) == 0:
        raise ValueError("the row logs hold no scored positions to match a cap on")
    return nodes.mean(axis=0)


def matched_cap(curve: np.ndarray, target_nodes: float) -> int:
    """The budget whose mean tree size (`curve[b - 1]`) is closest to `target_nodes` (ties to
    the smaller budget): the cap at which the rule's trees match the baseline's in size."""
    return int(np.argmin(np.abs(np.asarray(curve) - target_nodes)) + 1)


def resolve(decoder: str, specs: Sequence, depth: int, baseline_answers: Sequence[dict] = (),
            logs=()) -> list[dict]:
    """Each condition of `decoder` (budgets as the config writes them) as {condition, spec,
    budget, depth, baseline, baseline_budget} (pool `depth` for a fixed or matched budget;
    ar's answers say budget 0, depth 0) plus, for a matched one, the baseline's mean nodes and
    the rule's mean nodes at the chosen cap. An auto condition's budget and depth are None
    until the decode job has picked them (`fill_auto`)."""
    entry = get_decoder(decoder)
    out = []
    curve = None
    for i, spec in enumerate(specs):
        budget = parse_budget(spec, f"{decoder} condition {i}")
        row = {"condition": i, "spec": budget_spec(budget), "baseline": entry.baseline,
               "depth": depth if entry.drafts else NO_TREE}
        if entry.drafts and entry.baseline is not None:
            row["baseline_budget"] = baseline_budget(budget)
        if not entry.drafts:
            if not isinstance(budget, Fixed):
                raise ValueError(f"decoder {decoder!r} verifies no tree: it has no budget to "
                                 f"pick or match; drop its {budget} condition")
            row["budget"] = NO_TREE
        elif isinstance(budget, Auto):
            row.update(budget=None, depth=None)
        elif isinstance(budget, Matched):
            if entry.baseline is None:
                raise ValueError(f"decoder {decoder!r} has no baseline to match its cap to; "
                                 "give it numeric budgets")
            target = mean_nodes(baseline_answers, budget.at)
            if curve is None or len(curve) < budget.at:
                curve = size_curve(logs, entry.rule, budget.at)
            row.update(budget=matched_cap(curve[:budget.at], target), baseline_mean_nodes=target)
            row["rule_mean_nodes"] = float(curve[row["budget"] - 1])
        else:
            row["budget"] = budget.nodes
        out.append(row)
    return out


def fill_auto(conditions: list[dict], answers: Sequence[dict]) -> list[dict]:
    """The conditions with an auto one resolved to the (budget, depth) its answers ran at."""
    picked = {(int(a["budget"]), int(a["depth"])) for a in answers if a.get("budget_auto")}
    out = []
    for c in conditions:
        if isinstance(parse_budget(c["spec"]), Auto):
            if len(picked) != 1:
                raise ValueError(f"the answers hold {len(picked)} auto choices, not one: "
                                 f"{sorted(picked)}")
            (budget, depth), = picked
            c = {**c, "budget": budget, "depth": depth}
        out.append(c)
    return out


def write_conditions(path: str, pair: str, temperature: float, decoder: str,
                     conditions: list[dict], devices: dict[str, str] | None = None) -> None:
    """The conditions file; `devices` ({"target": "cuda:0", "draft": "cuda:1"}, or "cpu"):
    where the job ran target and draft, which says whether a root pass could overlap
    drafting on a device of its own."""
    doc = {"pair": pair, "temperature": float(temperature), "decoder": decoder,
           "conditions": conditions, **({"devices": devices} if devices else {})}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


def read_conditions(path: str) -> dict:
    """A conditions file: {pair, temperature, decoder, conditions}."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    missing = {"pair", "temperature", "decoder", "conditions"} - set(doc)
    if missing:
        raise ValueError(f"{path}: a conditions file without {sorted(missing)}; it was written "
                         "by an older targetrows: delete it and run the pipeline again")
    return doc
