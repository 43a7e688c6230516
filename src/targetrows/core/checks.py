"""The checks of values every layer takes the same way; each message names the value, so a
caller that knows its option name passes it in (`name`)."""

from __future__ import annotations

import math


def check_budget(budget, name: str = "budget") -> int:
    """A budget: a positive integer count of non-root nodes."""
    if isinstance(budget, bool) or not _integral(budget) or budget < 1:
        raise ValueError(f"{name} must be a positive integer (non-root nodes), got {budget!r}")
    return int(budget)


def check_temperature(temperature, name: str = "temperature") -> float:
    """A sampling temperature: 0 (greedy) or more."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"{name} must be a number >= 0, got {temperature!r}")
    return float(temperature)


def check_count(value, name: str) -> int:
    """A count that must be at least 1 (tokens, levels, positions, repeats)."""
    if isinstance(value, bool) or not _integral(value) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _integral(value) -> bool:
    try:
        return int(value) == value
    except (TypeError, ValueError, OverflowError):
        return False


def check_format(doc, fmt: str, version: int, what: str, remedy: str) -> None:
    """A file's decoded header `doc` is `fmt` at `version`, else an error naming `what` (the
    file) and `remedy` (how to get one this version reads)."""
    found = doc.get("format") if isinstance(doc, dict) else None
    if found != fmt:
        raise ValueError(f"{what} is not a {fmt} file (format {found!r})")
    if doc.get("version") != version:
        raise ValueError(f"{what} has format version {doc.get('version')}; this targetrows "
                         f"reads version {version}: {remedy}")

