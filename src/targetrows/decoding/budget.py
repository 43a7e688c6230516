"""A decode condition's budget, in one type: how many non-root nodes a tree decoder verifies.

A budget is one of three things, written the same way wherever it is written (the config, a
command line, a conditions file) and parsed by `parse_budget` alone:

    Fixed(n)        n non-root nodes per tree, at the pool's depth: `59`
    Auto(depth)     the budget and pool depth (at most `depth`) the cost model predicts
                    fastest on the machine that decodes (`targetrows.cost.calibration`): `auto`
    Matched(at)     the cap at which the decoder's mean tree size equals its baseline's
                    (`Decoder.baseline`) run at budget `at`, found from the row logs by the
                    pipeline (`targetrows.pipeline.conditions`): `{matched: 59}`

`ar` verifies no tree and has no budget: its `DecodeConfig.budget` is None. A condition (budget,
pool depth) of (NO_TREE, NO_TREE) is an `auto` pick of no tree: a tree decoder there decodes
as `ar` (`targetrows.decoding.config.condition_config`), in `decode`, `bench` and `compare` alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from targetrows.core.checks import check_budget

DEFAULT_BUDGET = 59  # the paper's online budget
# the budget and depth of no tree: what ar's answers record, and what `auto` picks where no tree
# is predicted faster than ar
NO_TREE = 0
NO_TREE_TEXT = "no tree, ar"  # how messages and tables name that pick


@dataclass(frozen=True)
class Fixed:
    nodes: int

    def __post_init__(self):
        check_budget(self.nodes)

    def __str__(self) -> str:
        return str(self.nodes)


@dataclass(frozen=True)
class Auto:
    max_depth: int | None = None  # the deepest pool tried (None: the pool's own depth)

    def __str__(self) -> str:
        return "auto"


@dataclass(frozen=True)
class Matched:
    at: int  # the baseline's budget whose mean tree size the cap matches

    def __post_init__(self):
        check_budget(self.at, "matched")

    def __str__(self) -> str:
        return f"matched {self.at}"


Budget = Fixed | Auto | Matched


def parse_budget(value, option: str = "budget") -> Budget:
    """A budget from any place it is written: a positive integer (or its digits), "auto", or
    {"matched": X}; a Budget is returned as it is. Anything else raises ValueError naming
    `option` and the forms it takes."""
    if isinstance(value, Fixed | Auto | Matched):
        return value
    if isinstance(value, str) and value.strip() == "auto":
        return Auto()
    if isinstance(value, dict) and set(value) == {"matched"}:
        return Matched(_integer(value["matched"], f"{option} matched"))
    return Fixed(_integer(value, option))


def _integer(value, option: str) -> int:
    forms = "a positive integer, auto or {matched: X}"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{option} {value!r} is not a budget: give {forms}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{option} {value!r} is not a budget: give {forms}") from None
    return check_budget(number, option)


def budget_spec(budget: Budget):
    """The budget as the config and the conditions files write it: 59, "auto", {"matched": 59}."""
    if isinstance(budget, Fixed):
        return budget.nodes
    if isinstance(budget, Matched):
        return {"matched": budget.at}
    return "auto"


def condition_text(budget: int, depth: int) -> str:
    """A condition as messages name it: "no tree, ar" (NO_TREE) or "B at depth D"."""
    return NO_TREE_TEXT if budget == NO_TREE else f"{budget} at depth {depth}"
