"""The selection rules on two drafts' pools, side by side: expected accepted draft tokens per round
from the row logs of two pipeline runs on the same target and prompts (their
results/tables/expected_accepted.csv), one column pair per rule.

    python benchmarks/compare_drafts.py --a RUN_A/results/tables/expected_accepted.csv \
        --a-name "EAGLE-3 head" --b RUN_B/results/tables/expected_accepted.csv \
        --b-name "2-layer draft" --budgets 2 8 32 --out benchmarks/results/drafts.md
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from targetrows.core.atomic import atomic_write_text
from targetrows.decoding.registry import rule_names


def side_by_side(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str],
                 budgets: list[int]) -> str:
    """A Markdown table: temperature, budget, then each rule's value under draft a / draft b."""
    rules = [r for r in rule_names() if r in set(a["rule"]) & set(b["rule"])]
    keys = ["pair", "temperature", "budget", "rule"]
    both = a[keys + ["accepted"]].merge(b[keys + ["accepted"]], on=keys, suffixes=("_a", "_b"))
    both = both[both["budget"].isin(budgets)]
    if both.empty:
        raise ValueError(f"the two tables share no rows at budgets {budgets}: same target and "
                         "budgets in both runs?")
    lines = [f"Expected accepted draft tokens per round, {names[0]} / {names[1]} (row logs; "
             "tasks pooled).", "",
             "| T | budget | " + " | ".join(rules) + " |",
             "|---|---|" + "---|" * len(rules)]
    for (temp, budget), group in both.groupby(["temperature", "budget"]):
        by_rule = group.set_index("rule")
        cells = [f"{by_rule.at[r, 'accepted_a']:.3f} / {by_rule.at[r, 'accepted_b']:.3f}"
                 for r in rules]
        lines.append(f"| {temp:g} | {budget} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="expected_accepted.csv of the first run")
    p.add_argument("--b", required=True, help="expected_accepted.csv of the second run")
    p.add_argument("--a-name", default="a")
    p.add_argument("--b-name", default="b")
    p.add_argument("--budgets", type=int, nargs="+", default=[2, 8, 32])
    p.add_argument("--out", default=None, help="Markdown file (default: print only)")
    args = p.parse_args(argv)
    table = side_by_side(pd.read_csv(args.a), pd.read_csv(args.b), (args.a_name, args.b_name),
                         args.budgets)
    print(table)
    if args.out:
        atomic_write_text(args.out, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
