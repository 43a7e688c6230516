"""The pipeline's tables under results/tables/ (CSV tidy; Markdown and LaTeX pivoted for reading).

From the row-log score tables, one target x temperature at a time (tasks pooled; a prompt is
identified by task and prompt id, the bootstrap's resampling unit):

expected_accepted  expected accepted draft tokens per verify pass by pair, temperature, rule and
                   budget, with mean non-root nodes and tokens committed per pass (t0 included
                   for the rules that commit it, which the caption names).
relative_gains     paired gains with 95% bootstrap CIs (`stats.paired_gain`) of each rule over
                   each of its baselines (`Rule.baselines` in the registry), and of each of
                   our rules over each prior-art rule (`Rule.prior_art`: sequoia) and each
                   prior-art draft-free decoder (racer, recycle: rebuilt along the logged
                   path, an approximation, `targetrows.rowlog.draft_free`).
equal_size         the same at the baseline's mean tree size (`stats.equal_size_gain`), for the
                   rules whose trees are not their budget's size (those that commit t0).

From the online runs (results/summary/online.csv, `targetrows.analysis.online`):

online             tokens/s, speedup over ar and accepted draft tokens per round (95% CIs by
                   prompt), non-root nodes and tokens committed per round, by decoder and
                   condition (a budget, a matched cap, or the cost model's auto pick).
online_gain        each decoder over its baselines (`Decoder.baselines`), condition by
                   condition (a matched cap against the budget it was matched at), and each of
                   our decoders over each prior-art decoder (`Decoder.prior_art`: sequoia,
                   racer, recycle) at the same condition: accepted draft tokens per round,
                   non-root nodes per round and tokens/s, paired by prompt, with 95% CIs, the
                   count of undefined bootstrap replicates, and how the run drafted
                   (draft_kind, overlap).
consistency        each decoder online against the scored expectation of its rule, same budget.

From the drift rows (results/drift/<target>.csv, `targetrows drift`; `targetrows.analysis.drift`):

drift              at temperature 0, each decoder's answers identical to ar's, parted at a
                   near-tie of the target's two best logits, or parted beyond one.

Rules and decoders appear in the registry's order; a name the registry does not know still gets
its own rows and columns (after the known ones), never dropped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from targetrows.decoding.registry import DECODERS, RULES, draft_free_decoders

from . import stats
from .drift import CAPTION as DRIFT_CAPTION
from .drift import drift_table, read_drift
from .frames import in_order, ordered, tidy, with_ci, with_interval
from .online import METRICS, condition_label, consistency, online, online_gains
from .output import write_table

STRINGS = ("pair", "draft_kind", "task", "prompt_id", "rule")
PAIR = ("pair", "draft_kind")  # a pair, and the kind of draft that made its pools


def score_groups(paths: list[str]) -> list[dict[str, np.ndarray]]:
    """The score tables as stats' tables (dicts of columns), one per pair x temperature (the
    tables' own columns say which), prompt ids made unique across tasks; draft_kind empty
    where a table does not say it."""
    frame = pd.concat([pd.read_csv(p, dtype={k: str for k in STRINGS}) for p in paths],
                      ignore_index=True)
    frame["draft_kind"] = frame.get("draft_kind", pd.Series("", index=frame.index)).fillna("")
    frame["prompt_id"] = frame["task"] + "/" + frame["prompt_id"]
    return [{k: group[k].to_numpy(dtype=str if k in STRINGS else None) for k in group.columns}
            for _, group in frame.groupby(["pair", "temperature"], sort=True)]


def comparisons(present) -> list[tuple[str, str]]:
    """(rule, baseline) for each registered rule and each of its baselines scored too, then
    each of our rules (one with baselines, not prior art) over each prior-art rule scored
    (`Rule.prior_art`: Sequoia's) and each prior-art draft-free decoder scored (racer,
    recycle: `targetrows.rowlog.draft_free`)."""
    present = set(present)
    pairs = [(r.name, b) for r in RULES.values() for b in r.baselines if {r.name, b} <= present]
    prior = [r.name for r in RULES.values() if r.prior_art and r.name in present]
    prior += [d for d in draft_free_decoders() if DECODERS[d].prior_art and d in present]
    ours = [r.name for r in RULES.values()
            if r.baselines and not r.prior_art and r.name in present]
    return pairs + [(r, p) for r in ours for p in prior if (r, p) not in pairs]


def row_log_tables(paths: list[str], n_boot: int, seed: int):
    """(expected_accepted, relative_gains, equal_size) over every target x temperature."""
    acc, gains, equal = [], [], []
    for table in score_groups(paths):
        acc.append(tidy(stats.summarize(table, by=(*PAIR, "temperature", "rule", "budget"))))
        present = set(table["rule"])
        for rule, baseline in comparisons(present):
            gains.append(tidy(stats.paired_gain(
                table, rule, baseline, by=(*PAIR, "temperature", "budget"),
                n_boot=n_boot, seed=seed)))
            if _commits_t0(rule) or _commits_t0(baseline):
                equal.append(tidy(stats.equal_size_gain(
                    table, rule, baseline, by=(*PAIR, "temperature"), n_boot=n_boot,
                    seed=seed)))
    return (pd.concat(acc, ignore_index=True), pd.concat(gains, ignore_index=True),
            pd.concat(equal, ignore_index=True) if equal else pd.DataFrame())


def _t0_rules(names) -> str:
    """The rules and decoders among `names` that commit t0, in the registry's order."""
    known = {**RULES, **DECODERS}
    return ", ".join(n for n in in_order(names, known)
                     if n in known and known[n].commits_t0) or "none here"


def _commits_t0(name: str) -> bool:
    """A scored rule that commits t0 (a draft-free decoder, scored under its name, does not)."""
    return name in RULES and RULES[name].commits_t0


def write_all(score_paths: list[str], decoding: pd.DataFrame, plan: pd.DataFrame, folder: str,
              n_boot: int, seed: int, drift_paths: list[str] = ()) -> None:
    """Every table, from the score tables, the online summary, the runs' conditions (`plan`,
    `online.conditions`) and the drift rows; see the module docstring."""
    acc = write_row_log_tables(score_paths, folder, n_boot, seed)
    table = write_online_tables(decoding, plan, folder, n_boot, seed)
    cons = consistency(acc, table[~table["auto"].fillna(False).astype(bool)])
    write_table(cons, cons, f"{folder}/consistency",
                "Online decoders vs the scored expectation of their rule (accepted per round).")
    drift = drift_table(read_drift(list(drift_paths)))
    write_table(drift, drift, f"{folder}/drift", DRIFT_CAPTION, floatfmt=".1f")


def write_row_log_tables(score_paths: list[str], folder: str, n_boot: int,
                         seed: int) -> pd.DataFrame:
    """expected_accepted, relative_gains and equal_size; returns expected_accepted's rows."""
    acc, gains, equal = row_log_tables(score_paths, n_boot, seed)
    counts = {"accepted": "accepted draft tokens", "committed": "tokens committed"}
    shown = ordered(acc, "rule", RULES).melt(
        id_vars=["pair", "temperature", "budget", "rule"], value_vars=list(counts),
        var_name="per_round").replace({"per_round": counts}).pivot_table(
        index=["pair", "temperature", "budget", "per_round"], columns="rule", values="value",
        observed=True, sort=False).sort_index(level=["pair", "temperature", "budget"],
                                             sort_remaining=False)
    shown = shown[in_order(acc["rule"], RULES)]  # columns in the registry's order
    write_table(acc, shown, f"{folder}/expected_accepted",
                "Expected accepted draft tokens and tokens committed per round (row logs; tasks "
                "pooled). Tokens committed: the accepted draft tokens, the bonus token, and t0 "
                f"for the rules that commit it ({_t0_rules(acc['rule'])}); so only the accepted "
                "draft tokens compare a rule that commits t0 with one that does not.")

    shown = gains.assign(comparison=gains["rule"] + " / " + gains["baseline"],
                         gain_ci=with_ci(gains))
    shown = shown.pivot_table(index=["pair", "temperature", "budget"], columns="comparison",
                              values="gain_ci", aggfunc="first")
    write_table(gains, shown, f"{folder}/relative_gains",
                "Relative gain in expected accepted draft tokens at equal budget (95% CI, "
                "prompts resampled).")

    shown = equal.assign(gain_ci=with_ci(equal))[
        ["pair", "temperature", "rule", "baseline", "budget", "nodes", "gain_ci", "n_prompts"]
    ] if len(equal) else equal
    write_table(equal, shown, f"{folder}/equal_size",
                "Each rule over its baseline at the baseline's mean non-root nodes (the "
                "baseline's budget and mean tree size shown; interpolated; 95% CI).")
    return acc


def _drafting(run) -> str:
    """'eagle3', 'standalone, overlap', ... ('' for answers that did not record it)."""
    kind = run.draft_kind if isinstance(run.draft_kind, str) else ""
    overlap = run.overlap if isinstance(run.overlap, bool | np.bool_) else False
    return kind + (", overlap" if overlap else "")


def write_online_tables(decoding: pd.DataFrame, plan: pd.DataFrame, folder: str, n_boot: int,
                        seed: int) -> pd.DataFrame:
    """online and online_gain; returns online's rows."""
    table = online(decoding, plan, n_boot, seed)
    shown = ordered(table, "decoder", DECODERS).sort_values(
        ["pair", "temperature", "decoder", "condition"])
    shown = shown.assign(
        run=[condition_label(r) for r in shown.itertuples(index=False)],
        speedup=with_interval(shown, "speedup", "speedup_lo", "speedup_hi", "{:.2f}"),
        accepted_per_round=with_interval(shown, "accepted_per_round", "accepted_lo",
                                          "accepted_hi", "{:.2f}"),
        drafting=[_drafting(r) for r in shown.itertuples(index=False)],
    )[["pair", "temperature", "run", "drafting", "tokens_per_s", "speedup",
       "accepted_per_round", "nodes_per_round", "committed_per_round"]]
    write_table(table, shown, f"{folder}/online",
                "Online decoding per decoder and condition (B: budget; auto: the cost model's "
                "pick of budget B and pool depth d on the machine that ran it; drafting: the "
                "draft's kind, and 'overlap' where the root pass ran alongside drafting): "
                "tokens/s, speedup over ar and accepted draft tokens per round (95% CI by "
                "prompt), non-root nodes and tokens committed per round (accepted, bonus, and "
                f"t0 for the decoders that commit it: {_t0_rules(table['decoder'])}).")

    gain = online_gains(decoding, plan, n_boot, seed)
    if len(gain):
        gain = ordered(gain, "decoder", DECODERS).sort_values(
            ["pair", "temperature", "decoder", "condition"])
        shown = gain.assign(
            gain_ci=with_ci(gain), run=[condition_label(r) for r in gain.itertuples(index=False)],
            against=[f"{r.baseline} B={r.baseline_budget}"
                     + (f" d={r.baseline_depth}" if r.auto else "")
                     for r in gain.itertuples(index=False)],
        ).pivot_table(
            index=["pair", "temperature", "run", "against"],
            columns="metric", values="gain_ci", aggfunc="first", observed=True, sort=False)
        shown = shown[[m for m in METRICS if m in shown.columns]]
    else:
        shown = gain
    write_table(gain, shown, f"{folder}/online_gain",
                "Online: each decoder's run over the runs it is compared with, its baseline's "
                "and each prior-art decoder's (a "
                "matched cap against the budget it was matched at, an auto pick against the "
                "baseline's auto pick): relative gain in accepted "
                "draft tokens per round, non-root nodes per round and tokens/s (95% CI by "
                "prompt; n_undefined in the CSV counts replicates without a ratio).")
    return table
