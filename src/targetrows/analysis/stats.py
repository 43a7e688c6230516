"""Comparing rules on a score table: paired relative gains with bootstrap confidence intervals.

Positions within a prompt are correlated (same text, same trajectory), so the unit of
resampling is the prompt (``prompt_id``; both turns of an MT-bench question stay together). A
gain is a ratio of totals over the same positions: ``sum(rule) / sum(baseline) - 1``, and a
bootstrap replicate redraws prompts with replacement and recomputes that ratio (expanded
percentile interval, see `_interval`).

Rules that spend their budget differently (PEARL prunes its tree, first-token sampling keeps
all B nodes) are also compared at equal mean tree size: each rule's curve of mean accepted
tokens against mean non-root nodes (one point per budget, plus the origin: a tree with no draft
nodes accepts nothing) is interpolated linearly at the baseline's mean tree sizes. No
extrapolation: beyond the rule's largest mean tree the gain is NaN. Acceptance is concave in
tree size, so the chord under-estimates the rule between its points (a conservative gain);
score budget 1 as well when the baseline's trees are smaller than the rule's smallest.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

GROUP = ("pair", "task", "temperature", "budget")


def paired_gain(table: dict, rule: str, baseline: str, metric: str = "accepted",
                by=GROUP, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """Relative gain of `rule` over `baseline` in `metric` for each group of `by`, with a
    `level` bootstrap interval resampled by prompt. Returns a tidy table (dict of columns);
    `n_undefined` counts replicates with no ratio (the baseline's total was 0), which the
    interval leaves out."""
    by = tuple(by)
    groups, code, cluster, a, b = _paired(table, rule, baseline, metric, by)
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(code.max() + 1 if len(code) else 0):
        mine = code == g
        ids, inverse = np.unique(cluster[mine], return_inverse=True)
        sum_a = np.bincount(inverse, a[mine], len(ids))
        sum_b = np.bincount(inverse, b[mine], len(ids))
        weights = bootstrap_weights(rng, len(ids), n_boot)
        with np.errstate(divide="ignore", invalid="ignore"):
            boot = weights @ sum_a / (weights @ sum_b) - 1.0
            gain = sum_a.sum() / sum_b.sum() - 1.0
        lo, hi = interval(boot, level, len(ids))
        rows.append((gain, lo, hi, int((~np.isfinite(boot)).sum()), len(ids), int(mine.sum())))
    out = {k: groups[k] for k in by}
    out.update(rule=np.full(len(rows), rule, dtype=object),
               baseline=np.full(len(rows), baseline, dtype=object),
               metric=np.full(len(rows), metric, dtype=object))
    for j, name in enumerate(("gain", "lo", "hi", "n_undefined", "n_prompts", "n_positions")):
        out[name] = np.array([r[j] for r in rows])
    return out


def equal_size_gain(table: dict, rule: str, baseline: str, by=GROUP[:3], n_boot: int = 2000,
                    level: float = 0.95, seed: int = 0) -> dict:
    """Gain in accepted tokens of `rule` over `baseline` at the baseline's mean tree size, for
    each group of `by` and each baseline budget (interpolating the rule's accepted-vs-nodes
    curve), with a bootstrap interval resampled by prompt."""
    by = tuple(by)
    rng = np.random.default_rng(seed)
    keys, code = _codes(table, by)
    rows = []
    for g in range(len(keys[by[0]]) if by else 1):
        in_group = code == g
        curves = {}
        ids = np.unique(table["prompt_id"][in_group & np.isin(table["rule"], [rule, baseline])])
        for name in (rule, baseline):
            sel = in_group & (table["rule"] == name)
            budgets, b_idx = np.unique(table["budget"][sel], return_inverse=True)
            c_idx = np.searchsorted(ids, table["prompt_id"][sel])
            shape = (len(ids), len(budgets))
            flat = c_idx * len(budgets) + b_idx
            sums = [np.bincount(flat, w, shape[0] * shape[1]).reshape(shape)
                    for w in (table["accepted"][sel], table["nodes"][sel], None)]
            curves[name] = (budgets, *sums)
        weights = np.vstack([np.ones(len(ids)), bootstrap_weights(rng, len(ids), n_boot)])
        gains = _gains_at_baseline(weights, curves[rule], curves[baseline])  # [1 + n_boot, nb]
        budgets, acc_b, nodes_b, count_b = curves[baseline]
        for j, budget in enumerate(budgets):
            lo, hi = interval(gains[1:, j], level, len(ids))
            rows.append(dict({k: keys[k][g] for k in by}, budget=budget,
                             nodes=nodes_b[:, j].sum() / count_b[:, j].sum(),
                             gain=gains[0, j], lo=lo, hi=hi,
                             n_undefined=int((~np.isfinite(gains[1:, j])).sum()),
                             n_prompts=len(ids)))
    out = {k: np.array([r[k] for r in rows], dtype=object if k in ("pair", "task") else None)
           for k in (*by, "budget", "nodes", "gain", "lo", "hi", "n_undefined", "n_prompts")}
    out["rule"] = np.full(len(rows), rule, dtype=object)
    out["baseline"] = np.full(len(rows), baseline, dtype=object)
    return out


def _gains_at_baseline(weights, rule_curve, base_curve) -> np.ndarray:
    """For each weight row (a bootstrap replicate), rule's interpolated accepted over the
    baseline's accepted at each baseline budget's mean tree size, minus 1."""
    _, acc_r, nodes_r, count_r = rule_curve
    _, acc_b, nodes_b, count_b = base_curve
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = lambda s, c: (weights @ s) / (weights @ c)  # noqa: E731
        xr, yr = mean(nodes_r, count_r), mean(acc_r, count_r)
        xb, yb = mean(nodes_b, count_b), mean(acc_b, count_b)
        out = np.empty(xb.shape)
        for i in range(len(weights)):
            order = np.argsort(xr[i], kind="stable")
            xp = np.concatenate([[0.0], xr[i][order]])
            fp = np.concatenate([[0.0], yr[i][order]])
            at = np.interp(xb[i], xp, fp, right=np.nan)
            out[i] = at / yb[i] - 1.0
    return out


def summarize(table: dict, by=("pair", "task", "temperature", "rule", "budget")) -> dict:
    """Mean accepted, nodes and committed per group, with the number of positions."""
    by = tuple(by)
    keys, code = _codes(table, by)
    n = np.bincount(code)
    out = dict(keys)
    for name in ("accepted", "nodes", "committed"):
        out[name] = np.bincount(code, table[name].astype(np.float64), len(n)) / n
    out["n_positions"] = n
    return out


def _paired(table, rule, baseline, metric, by):
    """Group keys and codes, prompt ids and the two rules' values aligned position by position."""
    keys = (*by, "prompt_id", "turn", "position")
    rows = {}
    for name in (rule, baseline):
        sel = np.flatnonzero(table["rule"] == name)
        if len(sel) == 0:
            raise ValueError(f"rule {name!r} is not in the table (rules: "
                             f"{', '.join(sorted(set(table['rule'].tolist())))})")
        sub = {k: table[k][sel] for k in keys}
        order = np.lexsort([_codes(sub, (k,))[1] for k in reversed(keys)])
        rows[name] = ({k: v[order] for k, v in sub.items()}, table[metric][sel][order])
    (ka, a), (kb, b) = rows[rule], rows[baseline]
    if len(a) != len(b) or any(not np.array_equal(ka[k], kb[k]) for k in keys):
        raise ValueError(f"rules {rule!r} and {baseline!r} are not scored on the same positions "
                         "and budgets: pair them on one score table")
    groups, code = _codes(ka, by)
    return groups, code, ka["prompt_id"], a.astype(np.float64), b.astype(np.float64)


def _codes(table: dict, cols) -> tuple[dict, np.ndarray]:
    """(unique key columns, each row's group code) for grouping by `cols`."""
    n = len(next(iter(table.values())))
    if not cols:
        return {}, np.zeros(n, dtype=np.int64)
    parts = [np.unique(table[c], return_inverse=True) for c in cols]
    combined = np.zeros(n, dtype=np.int64)
    for values, inverse in parts:
        combined = combined * len(values) + inverse.reshape(-1)
    uniq, code = np.unique(combined, return_inverse=True)
    keys = {}
    for c, (values, _) in zip(reversed(cols), reversed(parts), strict=True):
        keys[c] = values[uniq % len(values)]
        uniq = uniq // len(values)
    return {c: keys[c] for c in cols}, code.reshape(-1)


def bootstrap_weights(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
    """Bootstrap replicates as counts: how often each of n prompts is drawn, [n_boot, n]."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)


def interval(boot: np.ndarray, level: float, n: int) -> tuple[float, float]:
    """Expanded percentile interval (Hesterberg 2015): the percentile interval's tails are
    narrowed from alpha/2 to Phi(-sqrt(n / (n - 1)) t_{n-1}), which corrects its small-sample
    under-coverage. NaN for fewer than 2 prompts."""
    boot = boot[np.isfinite(boot)]
    if len(boot) == 0 or n < 2:
        return np.nan, np.nan
    normal = NormalDist()
    z, nu = normal.inv_cdf(0.5 + level / 2), n - 1
    t = z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)  # Student-t
    tail = normal.cdf(-np.sqrt(n / (n - 1)) * t) * 100
    lo, hi = np.percentile(boot, [tail, 100 - tail])
    return float(lo), float(hi)
