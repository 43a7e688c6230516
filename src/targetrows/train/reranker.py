"""`targetrows train-reranker`: the learned rules' branch scorers, fitted on row logs to expected
accepted draft tokens, cross-fitted by prompt so that every prompt is scored by a model that
never saw it (NumPy only).

What a model sees (`targetrows.core.rules.learned.FEATURES`): per first-level branch of a pool,
the exact root row's log-prob and rank of its token (learned_rerank only), the stale row's, the
draft's, and the draft's pool below the branch (its best child, its mass on the children, its
best chain to the deepest level). A branch's score is a weighted sum; nodes below it add the
draft's log-probs, as target_rerank's do.

Objective: the expected accepted draft tokens themselves, at the budgets scored, each budget's
total relative to draft_rank's on the same positions (so every budget counts alike), averaged.
Not a listwise fit to the root row: with the root row among its features, that fit's optimum is
target_rerank itself, and what a branch is worth also depends on how far the draft's pool below
it is right. The objective is a step function of the weights (a top-B selection), so it is
maximised by a seeded coordinate search over the weights from the rule's baseline (the root
row's log-prob for learned_rerank, the better of the stale row's and the draft's for
learned_stale_rerank): a step is kept only when it raises the objective on the training prompts,
and the search's result only when it beats that baseline on training prompts it was not fitted
on (`fit_checked`); otherwise the model is the baseline.

Cross-fitting: prompts ("task/question_id") are dealt into `folds` by a seeded shuffle; fold k's
model is trained on the other folds' prompts and scores fold k's; the model trained on every
prompt is the one used for new prompts. The report compares, on every prompt out of fold,
the learned rule with draft_rank, stale_rerank and target_rerank, by budget, with the paired
95% intervals (resampled by prompt) the pipeline's tables use.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from targetrows.analysis import stats
from targetrows.core.rules.batch import PoolBatch
from targetrows.core.rules.learned import (
    ALL_FEATURES,
    LEARNED_RULES,
    STALE_FEATURES,
    Reranker,
    branch_features,
    prompt_folds,
)
from targetrows.core.rules.rule import pool_expected
from targetrows.core.rules.sequoia_model import SEQUOIA, AcceptanceVector
from targetrows.rowlog import format as rowlog
from targetrows.rowlog.score import _Pools, score_log
from targetrows.train.sequoia import fit_acceptance

BASELINES = ("draft_rank", "stale_rerank", "target_rerank")
MODEL_RULES = (*LEARNED_RULES, SEQUOIA)  # the rules whose models this command fits
STEPS = (1.0, 0.5, 0.25, 0.1, 0.05)  # coordinate search steps, largest first


@dataclass(frozen=True)
class RerankerConfig:
    budgets: tuple[int, ...] = (2, 4, 8, 16, 32)
    folds: int = 2
    seed: int = 0
    sweeps: int = 6  # passes over the weights
    n_boot: int = 2000  # bootstrap replicates of the report's intervals


@dataclass
class _Data:
    """The training pools of some prompts: features, reach, and what draft_rank accepts."""

    features: np.ndarray  # [P, N, F]
    batch: PoolBatch
    reach: np.ndarray
    base: np.ndarray  # draft_rank's total accepted per budget

    def objective(self, weights: np.ndarray, budgets) -> float:
        branch = self.features @ weights
        acc, _ = pool_expected(self.batch.rescored_first(branch), self.reach, self.batch.size,
                               budgets)
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.mean(np.where(self.base > 0, acc.sum(0) / self.base, 1.0)))


def _data(logs: Sequence[rowlog.RowLog], keys: set[str], names, budgets) -> _Data:
    parts = []
    for log in logs:
        pools = _Pools(log)
        scored = np.flatnonzero(log.rec_scored)
        mine = scored[np.isin(pools.key[scored], list(keys))]
        if len(mine):
            parts.append(pools.batch(mine))
    if not parts:
        raise ValueError("no scored positions for these prompts")
    n = max(b.shape[1] for b, _, _ in parts)
    batch = _stack([b for b, _, _ in parts], n)
    reach = np.concatenate([np.pad(r, ((0, 0), (0, n - r.shape[1]))) for _, r, _ in parts])
    base, _ = pool_expected(batch.logq, reach, batch.size, budgets)
    return _Data(branch_features(batch, names), batch, reach, base.sum(0))


def _stack(batches: list[PoolBatch], n: int) -> PoolBatch:
    def pad(a, fill):
        return np.concatenate([np.pad(x, ((0, 0), (0, n - x.shape[1])), constant_values=fill)
                               for x in a])

    return PoolBatch(pad([b.tokens for b in batches], -1), pad([b.parents for b in batches], 0),
                     pad([b.logq for b in batches], -np.inf),
                     np.concatenate([b.size for b in batches]),
                     pad([b.root_logp for b in batches], 0.0),
                     pad([b.stale_logp for b in batches], 0.0))


def fit(data: _Data, names: tuple[str, ...], start: np.ndarray, budgets,
        sweeps: int) -> np.ndarray:
    """Coordinate search from `start`: each weight moved by each step (both ways) in turn, a
    move kept when it raises the objective."""
    weights, best = start.astype(np.float64), data.objective(start, budgets)
    for _ in range(sweeps):
        improved = False
        for j in range(len(names)):
            for step in STEPS:
                for sign in (1.0, -1.0):
                    trial = weights.copy()
                    trial[j] += sign * step
                    value = data.objective(trial, budgets)
                    if value > best + 1e-9:
                        weights, best, improved = trial, value, True
        if not improved:
            break
    return weights


def _start(rule: str, names: tuple[str, ...], data: _Data, budgets) -> np.ndarray:
    """The rule's baseline as weights: the root row alone, or the better of the stale row and
    the draft alone."""
    options = ["root_logp"] if rule == "learned_rerank" else ["stale_logp", "draft_logp"]
    starts = []
    for name in options:
        w = np.zeros(len(names))
        w[names.index(name)] = 1.0
        starts.append((data.objective(w, budgets), name, w))
    return max(starts, key=lambda s: (s[0], -options.index(s[1])))[2]


def fit_checked(logs, keys: Sequence[str], rule: str, names: tuple[str, ...], budgets,
                config: RerankerConfig) -> tuple[np.ndarray, bool]:
    """(weights, fitted) for the prompts `keys`: the search's weights when they beat the rule's
    baseline on prompts they were not fitted on (the keys dealt into two inner folds, each
    fitted on the other and scored), else the baseline itself (fitted False). With a few
    dozen prompts a search can fit their noise; this keeps the learned rule at its baseline
    unless what it learned holds out of sample, and below four prompts (an inner fold of two)
    nothing can be held out, so the rule stays at its baseline."""
    data = _data(logs, set(keys), names, budgets)
    start = _start(rule, names, data, budgets)
    if len(keys) < 4:
        return start, False
    inner = prompt_folds(keys, 2, config.seed + 1)
    gain = 0.0
    for j in range(2):
        train = _data(logs, {k for k, f in inner.items() if f != j}, names, budgets)
        test = _data(logs, {k for k, f in inner.items() if f == j}, names, budgets)
        weights = fit(train, names, _start(rule, names, train, budgets), budgets, config.sweeps)
        gain += test.objective(weights, budgets) - test.objective(
            _start(rule, names, train, budgets), budgets)
    if gain <= 1e-9:
        return start, False
    return fit(data, names, start, budgets, config.sweeps), True


def train_reranker(logs: Sequence[rowlog.RowLog], rule: str,
                   config: RerankerConfig = RerankerConfig()) -> tuple[Reranker, dict]:
    """The model of learned rule `rule` (cross-fitted) and its training summary: a reranker,
    or for `sequoia` its acceptance vector (`targetrows.train.sequoia`)."""
    if rule == SEQUOIA:
        return fit_acceptance(logs, config.folds, config.seed)
    if rule not in LEARNED_RULES:
        raise ValueError(f"--rule {rule!r}: choose one of {', '.join(MODEL_RULES)}")
    temps = {float(log.header.get("temperature", np.nan)) for log in logs}
    if len(temps) != 1:
        raise ValueError(f"row logs at several temperatures {sorted(temps)}: train one reranker "
                         "per temperature")
    names = ALL_FEATURES if rule == "learned_rerank" else STALE_FEATURES
    budgets = np.asarray(config.budgets)
    keys = sorted({k for log in logs for k in _Pools(log).key})
    if len(keys) < 2:
        raise ValueError(f"{len(keys)} prompt cannot be cross-fitted (each prompt is scored by a "
                         "model trained on others): record at least two")
    folds = min(config.folds, len(keys))  # with few prompts, fewer folds
    fold_of = prompt_folds(keys, folds, config.seed)
    start = time.perf_counter()
    fold_weights, fitted = [], []
    for k in range(folds):
        w, kept = fit_checked(logs, sorted(key for key, f in fold_of.items() if f != k), rule,
                              names, budgets, config)
        fold_weights.append(w)
        fitted.append(kept)
    weights, kept = fit_checked(logs, keys, rule, names, budgets, config)
    everything = _data(logs, set(keys), names, budgets)
    meta = dict(temperature=temps.pop(), budgets=list(config.budgets), folds=folds,
                seed=config.seed, prompts=len(keys),
                positions=int(len(everything.batch.size)),
                pair=sorted({f"{log.header.get('target')}+{log.header.get('draft')}"
                             for log in logs}),
                objective="mean over budgets of expected accepted / draft_rank's",
                fitted=kept, folds_fitted=fitted,
                train_seconds=round(time.perf_counter() - start, 2))
    model = Reranker(rule, names, tuple(map(float, weights)),
                     tuple(tuple(map(float, w)) for w in fold_weights), fold_of, meta)
    return model, meta


def held_out_report(logs: Sequence[rowlog.RowLog], models: dict[str, Reranker], budgets,
                    n_boot: int = 2000, seed: int = 0) -> dict:
    """Every prompt scored out of fold: expected accepted by budget of each learned rule and
    its baselines, and each learned rule's paired gains over each baseline (95% CIs)."""
    rules = (*BASELINES, *models)
    tables = [score_log(log, budgets, rules=rules, rerankers=models) for log in logs]
    table = {k: np.concatenate([t[k] for t in tables]) for k in tables[0]}
    table["prompt_id"] = np.array([f"{t}/{p}" for t, p in zip(table["task"], table["prompt_id"],
                                                              strict=True)], dtype=object)
    by = ("pair", "temperature", "budget")
    means = stats.summarize(table, by=(*by, "rule"))
    gains = [stats.paired_gain(table, name, base, by=by, n_boot=n_boot, seed=seed)
             for name in models for base in BASELINES if base in rules]
    return dict(means=means, gains={k: np.concatenate([g[k] for g in gains])
                                    for k in gains[0]} if gains else {})


def describe_weights(model: Reranker) -> list[tuple[str, float]]:
    """The weights by feature, largest magnitude first (what the model learned to use)."""
    pairs = list(zip(model.features, model.weights, strict=True))
    return sorted(pairs, key=lambda p: -abs(p[1]))


def _fitted_line(meta: dict) -> str:
    folds = meta.get("folds_fitted", [])
    model = ("the search's weights" if meta.get("fitted") else
             "its baseline (the search's weights did not beat it on held-out training prompts)")
    return (f"The search beat the baseline out of sample in {sum(folds)} of {len(folds)} "
            f"folds; the model for new prompts is {model}.")


def _model_lines(name: str, model, microseconds: float | None) -> list[str]:
    """A model's section of report.md: what it was fitted on and what it learned (a
    reranker's weights, or Sequoia's acceptance vector)."""
    meta = model.meta
    lines = [f"## {name}", "",
             f"{meta['prompts']} prompts, {meta['positions']} positions, {meta['folds']} "
             f"folds, seed {meta['seed']}, temperature {meta['temperature']:g}, fitted in "
             f"{meta['train_seconds']} s"
             + (f"; scoring a round's pool costs {microseconds:.0f} us"
                if microseconds is not None else "") + ".", ""]
    if isinstance(model, AcceptanceVector):
        return lines + ["Acceptance by draft rank (Sequoia's p, fitted on every prompt):", "",
                        "| rank | p |", "|---|---|",
                        *[f"| {k} | {p:.3f} |" for k, p in enumerate(model.p, start=1)], ""]
    return lines + [_fitted_line(meta), "", "| feature | weight |", "|---|---|",
                    *[f"| {f} | {w:+.3f} |" for f, w in describe_weights(model)], ""]


def write_report(folder: str, models: dict[str, Reranker], report: dict, logs: Sequence[str],
                 microseconds: dict[str, float] | None = None) -> None:
    """report.md (what each model uses; held-out expected accepted and gains) and report.csv
    (the gains, tidy), atomically."""
    import csv
    import io
    import os

    from targetrows.core.atomic import atomic_write_text

    means, gains = report["means"], report["gains"]
    budgets = sorted(set(means["budget"].tolist()))
    rules = list(dict.fromkeys(means["rule"].tolist()))
    lines = ["# Learned rules' models", "",
             f"Row logs: {', '.join(logs)}. Every prompt scored by the fold model trained "
             "without it.", ""]
    for name, model in models.items():
        lines += _model_lines(name, model, (microseconds or {}).get(name))
    lines += ["## Held-out expected accepted draft tokens per round", "",
              "| budget | " + " | ".join(rules) + " |", "|---" * (len(rules) + 1) + "|"]
    for b in budgets:
        cells = []
        for r in rules:
            sel = (means["budget"] == b) & (means["rule"] == r)
            cells.append(f"{float(means['accepted'][sel].mean()):.3f}" if sel.any() else "")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    lines += ["", "## Paired gains (95% CI, prompts resampled)", "",
              "| rule | baseline | budget | gain | CI | prompts |", "|---|---|---|---|---|---|"]
    for i in range(len(gains.get("rule", []))):
        lines.append(f"| {gains['rule'][i]} | {gains['baseline'][i]} | {gains['budget'][i]} | "
                     f"{100 * gains['gain'][i]:+.1f}% | [{100 * gains['lo'][i]:+.1f}, "
                     f"{100 * gains['hi'][i]:+.1f}] | {gains['n_prompts'][i]} |")
    atomic_write_text(os.path.join(folder, "report.md"), "\n".join(lines) + "\n")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    cols = [k for k in ("pair", "temperature", "budget", "rule", "baseline", "gain", "lo", "hi",
                        "n_prompts", "n_positions") if k in gains]
    writer.writerow(cols)
    writer.writerows(zip(*(gains[k].tolist() for k in cols), strict=True))
    atomic_write_text(os.path.join(folder, "report.csv"), buf.getvalue())


def round_microseconds(model: Reranker, pool_size: tuple[int, int] = (10, 6),
                       repeats: int = 200) -> float:
    """Median microseconds to score and select one round's tree with `model` (a random pool of
    the given top_k and depth): the online cost of the learned rule over draft_rank's."""
    from targetrows.core.pool import expand
    from targetrows.core.toy import ToyPair
    from targetrows.decoding.registry import get_rule

    pair = ToyPair(64, seed=0, closeness=0.7)
    ctx = [1, 2, 3]
    cand, logq = expand(pair.draft_row, ctx, *pool_size)
    first = cand.tokens[cand.children(0)]
    with np.errstate(divide="ignore"):
        rows = {"stale_logp": np.log(pair.target_row(ctx[:-1])[first])}
        if model.rule == "learned_rerank":
            rows["root_logp"] = np.log(pair.target_row(ctx)[first])
    rule = get_rule(model.rule)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        rule.select(cand, logq, 32, reranker=model, **rows)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e6)
