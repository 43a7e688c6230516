"""The speed and correctness goals a `targetrows bench` report marks met or not, read from its
summary (one dict per temperature and method, `report.summarize`)."""

from __future__ import annotations

import numpy as np

# the speed goals at temperature 0 (ratios: medians of per-prompt ratios)
MIN_AR_VS_HF = 0.95  # our ar against HF generate()
MIN_BEST_VS_AR = 1.8  # the best decoder against our ar, with prompt lookup mixed into the draft
MIN_HEAD_VS_AR = 1.4  # the same with the draft alone
MIN_BEST_VS_LOOKUP = 2.0  # the best decoder against HF prompt lookup decoding
MIN_BEST_VS_PEER = 1.0  # the best decoder against each peer engine (--peer)
MIN_OF_BOUND = 0.9  # measured speed against the zero-overhead bound
MAX_PREDICTION_ERROR = 0.15  # measured speed against the cost model's prediction, either way
MAX_BOOKKEEPING = 0.05  # share of a round


def cell(value, fmt="{:.2f}") -> str:
    """A number for a table cell; "-" where there is none."""
    if value is None or value == "" or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return fmt.format(value)


def _best(candidates: list[dict], key: str):
    finite = [s for s in candidates if np.isfinite(s.get(key, np.nan))]
    return max(finite, key=lambda s: s[key]) if finite else None


Goal = tuple[str, str, "bool | None"]


def goals(summary: list[dict], settings, lookup: bool = False) -> list[Goal]:
    """(goal, what was measured, met? None when it could not be measured). `lookup`: prompt
    lookup is mixed into the draft (the best decoder's goal over ar is then the higher one)."""
    ours = [s for s in summary if not s["method"].startswith(("hf_", "peer:"))]
    out = []
    for temp in settings.temperatures:
        at = {s["method"]: s for s in summary if s["temperature"] == temp}
        spec = [s for s in ours if s["temperature"] == temp and s["method"] != "ar"]
        out += _speed_goals(at, spec, temp, lookup)
    for s in ours:
        out += _method_goals(s)
    return out


def _goal(text: str, best: dict | None, key: str, need: float) -> Goal:
    """The goal that the best summary's `key` reaches `need` (not measured where it has none:
    a baseline that did not run)."""
    if best is None or not np.isfinite(best.get(key, np.nan)):
        return (text, "-", None)
    return (text, f"{best['method']} {cell(best[key])}x", bool(best[key] >= need))


def _speed_goals(at: dict, spec: list[dict], temp: float, lookup: bool) -> list[Goal]:
    """At one temperature: ar against HF generate; at T=0 the best decoder against ar, HF
    prompt lookup and each peer engine, and every method's agreement with HF greedy."""
    out = []
    if "ar" in at:
        out.append(_goal(f"ar >= {MIN_AR_VS_HF}x HF generate (T={temp:g})", at["ar"],
                         "vs_hf_generate", MIN_AR_VS_HF))
    if temp != 0 or not spec:
        return out
    need = MIN_BEST_VS_AR if lookup else MIN_HEAD_VS_AR
    out.append(_goal(f"best decoder >= {need}x our ar (T=0, draft"
                     f"{' + lookup' if lookup else ' alone'})", _best(spec, "vs_ar"), "vs_ar", need))
    out.append(_goal(f"best decoder >= {MIN_BEST_VS_LOOKUP}x HF prompt lookup (T=0)",
                     _best(spec, "vs_hf_prompt_lookup"), "vs_hf_prompt_lookup",
                     MIN_BEST_VS_LOOKUP))
    same = [s for s in at.values() if s["same_as_hf"]]
    if same:  # a difference at a near-tie is the target's own rounding, not a loss
        off = [f"{s['method']} {s['same_as_hf']}" for s in same
               if s["identical"] + s["near_ties"] < s["compared"]]
        ties = sum(s["near_ties"] for s in same)
        out.append(("every method token-identical to HF greedy, or parted from it at a "
                    "near-tie (T=0)", ", ".join(off) or f"{len(same)} methods, all identical"
                    + (f" but for {ties} near-tie{'s' * (ties > 1)}" if ties else ""),
                    not off))
    best = _best(spec, "tps_median")
    for peer in (s for s in at.values() if s["method"].startswith("peer:")):
        v = best["tps_median"] / peer["tps_median"]
        out.append((f"best decoder >= {MIN_BEST_VS_PEER}x {peer['method']} (T=0, median "
                    "tokens/s)", f"{best['method']} {cell(v)}x", bool(v >= MIN_BEST_VS_PEER)))
    return out


def _method_goals(s: dict) -> list[Goal]:
    """One of our methods at one temperature: its share of the bound, its prediction error and
    its bookkeeping share, each where measured."""
    where = f"(T={s['temperature']:g})"
    out = []
    if "of_bound" in s:
        out.append((f"{s['method']} measured >= {MIN_OF_BOUND:.0%} of bound {where}",
                    cell(s["of_bound"], "{:.0%}"), s["of_bound"] >= MIN_OF_BOUND))
    if "of_predicted" in s:
        out.append((f"{s['method']} measured within {MAX_PREDICTION_ERROR:.0%} of the cost "
                    f"model's prediction {where}", cell(s["of_predicted"], "{:.0%}"),
                    abs(s["of_predicted"] - 1) <= MAX_PREDICTION_ERROR))
    if "bookkeeping_share" in s:
        out.append((f"{s['method']} bookkeeping < {MAX_BOOKKEEPING:.0%} of a round {where}",
                    cell(s["bookkeeping_share"], "{:.1%}"),
                    s["bookkeeping_share"] < MAX_BOOKKEEPING))
    return out
