"""The report of `targetrows bench`: a tidy CSV (one row per prompt, temperature and method) and a
Markdown file with the machine, versions and command, the summary table per temperature, the
cost model's part times, the budgets picked and the speed goals, each marked met or not."""

from __future__ import annotations

import csv
import io
import os
import platform
import time
from collections import defaultdict

import numpy as np

from targetrows.bench.baselines import PROMPT_LOOKUP_NGRAM
from targetrows.bench.goals import cell, goals
from targetrows.core.atomic import atomic_write_text
from targetrows.decoding.budget import NO_TREE, NO_TREE_TEXT, Auto

PER_ROUND_MS = ("t_draft", "t_root", "t_verify")
RATIO_HEADS = {  # the ratio columns: our ar and each Hugging Face baseline
    "ar": "x ar",
    "hf_generate": "x HF generate",
    "hf_assisted": "x HF assisted",
    "hf_prompt_lookup": "x HF lookup",
}


def _model(model) -> str:
    if model is None:
        return "none"
    return f"{model.name} ({model.dtype}, {model.device}, {_linears(model)} linear layers)"


def _linears(model) -> str:
    """Whether the model's linear layers multiply by prepacked weights ("packed") or not."""
    from targetrows.hf.packed import PackedLinear

    module = getattr(model, "model", None) or getattr(model, "head", None)
    modules = module.modules() if module is not None else ()
    return "packed" if any(isinstance(m, PackedLinear) for m in modules) else "plain"


def header(settings, target, draft, n_prompts: int, command: str | None = None,
           note: str = "", assistant=None, peers=None) -> dict:
    """Machine, versions, models (the assistant of hf_assisted when it is not the draft, the
    peer engines), settings, the command line and a note, for the report's head."""
    import torch
    import transformers

    machine = (
        f"{platform.platform()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}"
    )
    if torch.cuda.is_available():
        machine += ", " + ", ".join(
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        )
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if command is not None:
        out["command"] = command
    out.update(
        {
            "machine": machine,
            "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}, numpy {np.__version__}",
            "target": f"{target.name} ({target.dtype}, {target.device}, vocab {target.vocab_size}, "
            f"{_linears(target)} linear layers)",
            "draft": _model(draft),
        }
    )
    if assistant is not None:
        out["assistant"] = _model(assistant)
    for method, description in (peers or {}).items():
        out[method] = description
    deepest = " (the deepest auto tries)" if isinstance(settings.budget, Auto) else ""
    out["settings"] = (
        f"{n_prompts} prompts, temperatures {list(settings.temperatures)}, budget "
        f"{settings.budget}, max_new_tokens {settings.decode.max_new_tokens}, top_k "
        f"{settings.pool.top_k}, depth {settings.pool.depth}{deepest}, seed {settings.decode.seed}"
    )
    if settings.hf:
        out["settings"] += f", prompt lookup tokens {settings.prompt_lookup_tokens}"
    if note:
        out["note"] = note
    return out


def _pooled(rows, key):
    """Per-round mean over all rounds of these runs (each run weighted by its rounds)."""
    n = sum(r["rounds"] for r in rows)
    return sum(r[f"mean_{key}"] * r["rounds"] for r in rows) / n if n else float("nan")


def summarize(rows: list[dict], settings) -> list[dict]:
    """One summary per (temperature, method), in the order the methods first appear."""
    by_key = defaultdict(list)
    for r in rows:
        by_key[r["temperature"], r["method"]].append(r)
    speed = {(r["temperature"], r["method"], r["question_id"]): r["tokens_per_s"] for r in rows}
    out = []
    for (temp, method), group in by_key.items():
        tps = np.array([r["tokens_per_s"] for r in group])
        s = {
            "temperature": temp,
            "method": method,
            "budget": group[0]["budget"],
            "depth": group[0].get("depth", ""),  # rows of older runs have none
            "prompts": len(group),
            "tps_median": float(np.median(tps)),
            "tps_min": float(tps.min()),
            "tps_max": float(tps.max()),
        }
        for base in RATIO_HEADS:
            ratios = [
                r["tokens_per_s"] / speed[temp, base, r["question_id"]]
                for r in group
                if speed.get((temp, base, r["question_id"]), 0) > 0
            ]
            s[f"vs_{base}"] = float(np.median(ratios)) if ratios else float("nan")
        s.update(_agreement(group))
        s.update(_round_times([r for r in group if r.get("rounds")]))
        s.update(_prediction([r for r in group if r.get("predicted_tokens_per_s", "") != ""]))
        out.append(s)
    return out


def _agreement(group: list[dict]) -> dict:
    """How many of a method's runs match HF greedy token for token, and where the others part."""
    compared = [r for r in group if r["same_as_hf_generate"] != ""]
    same = sum(bool(r["same_as_hf_generate"]) for r in compared)
    ties = sum(str(r.get("near_tie", "")) == "True" for r in compared)
    label = f"{same}/{len(compared)}" if compared else ""
    if ties:
        label += f" (+{ties} near-tie{'s' * (ties > 1)})"
    partings = [(r["question_id"], r["parting"], r["gap_steps"], r["tie_threshold_steps"])
                for r in compared if r.get("parting", "") != ""]
    return {"same_as_hf": label, "identical": same, "near_ties": ties,
            "compared": len(compared), "partings": partings}


def _round_times(timed: list[dict]) -> dict:
    """Per-round means pooled over the timed runs, the overlap and the zero-overhead bound."""
    if not timed:
        return {}
    keys = ("committed", "accepted", "nodes", "t_draft", "t_root", "t_verify",
            "t_bookkeeping", "t_round")
    s = {key: _pooled(timed, key) for key in keys}
    s["bookkeeping_share"] = s["t_bookkeeping"] / s["t_round"] if s["t_round"] else float("nan")
    s["overlap"] = float(np.median([r["overlap"] for r in timed]))
    s["bound_tps"] = float(np.median([r["bound_tokens_per_s"] for r in timed]))
    s["bound_speedup"] = float(np.median([r["bound_speedup"] for r in timed]))
    s["of_bound"] = float(np.median([r["measured_over_bound"] for r in timed]))
    return s


def _prediction(predicted: list[dict]) -> dict:
    """The cost model's predicted speed and the measured speed's ratio to it (median, range)."""
    if not predicted:
        return {}
    ratios = np.array([r["measured_over_predicted"] for r in predicted], dtype=float)
    return {"predicted_tps": float(np.median([r["predicted_tokens_per_s"] for r in predicted])),
            "of_predicted": float(np.median(ratios)),
            "of_predicted_range": (float(ratios.min()), float(ratios.max()))}


SUMMARY_HEAD = (
    "method",
    "budget",
    "depth",
    "tokens/s median [min-max]",
    *RATIO_HEADS.values(),
    "tokens/round",
    "accepted/round",
    "nodes/round",
    "draft ms",
    "root ms",
    "verify ms",
    "bookkeeping ms (share)",
    "bound tokens/s",
    "bound speedup",
    "measured/bound",
    "predicted tokens/s",
    "measured/predicted [min-max]",
    "= HF greedy",
)


def summary_markdown(summary: list[dict], settings) -> str:
    """One table per temperature, a row per method (columns: SUMMARY_HEAD)."""
    parts = []
    for temp in settings.temperatures:
        lines = [f"### Temperature {temp:g}", "", "| " + " | ".join(SUMMARY_HEAD) + " |",
                 "|" + "---|" * len(SUMMARY_HEAD)]
        lines += ["| " + " | ".join(_summary_cells(s)) + " |"
                  for s in summary if s["temperature"] == temp]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def budget_cell(budget) -> str:
    """A row's budget as the tables show it; an `auto` pick of no tree, which ran as ar, says
    so."""
    return f"{budget} ({NO_TREE_TEXT})" if budget == NO_TREE else str(budget)


def _summary_cells(s: dict) -> list[str]:
    ms = {k: cell(s[k] * 1e3 if k in s else None, "{:.1f}") for k in PER_ROUND_MS}
    book = ("-" if "t_bookkeeping" not in s
            else f"{s['t_bookkeeping'] * 1e3:.1f} ({s['bookkeeping_share']:.1%})")
    return [
        s["method"],
        budget_cell(s["budget"]) or "-",
        str(s["depth"]) or "-",
        f"{s['tps_median']:.1f} [{s['tps_min']:.1f}-{s['tps_max']:.1f}]",
        *(cell(s[f"vs_{base}"]) for base in RATIO_HEADS),
        cell(s.get("committed")),
        cell(s.get("accepted")),
        cell(s.get("nodes"), "{:.1f}"),
        ms["t_draft"],
        ms["t_root"],
        ms["t_verify"],
        book,
        cell(s.get("bound_tps"), "{:.1f}"),
        cell(s.get("bound_speedup")),
        cell(s.get("of_bound"), "{:.0%}"),
        cell(s.get("predicted_tps"), "{:.1f}"),
        _of_predicted(s),
        s["same_as_hf"] or "-",
    ]


def _of_predicted(s: dict) -> str:
    if "of_predicted" not in s:
        return "-"
    low, high = s["of_predicted_range"]
    return f"{s['of_predicted']:.0%} [{low:.0%}-{high:.0%}]"


def markdown(head: dict, summary: list[dict], context: dict, settings) -> str:
    lines = ["# targetrows bench", ""]
    lines += [f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in head.items()]
    lines += ["", summary_markdown(summary, settings), ""]
    lines += [
        "Ratios are medians of per-prompt ratios (methods interleaved prompt by prompt). "
        "tokens/round counts every committed token (t0 included); accepted/round counts "
        "accepted draft tokens; time split: per-round means, a decode's first pass over the "
        "prompt in the round that made it (an EAGLE-3 head reads the target's features of the "
        "prompt, so its first draft makes that pass: draft ms; RACER reads the prompt's rows "
        "first: root ms). Bound: zero-overhead speed from "
        "the part times below (each prompt's first pass included) with the run's acceptance "
        "and achieved overlap. Predicted: the cost model's speed for the run before it ran "
        "(what --budget auto maximises): the acceptance calibrated for its condition, the part "
        "times at the prompt's mean context and its first pass, no overhead. "
        "hf_assisted: `generate(assistant_model=...)`; hf_prompt_lookup: "
        "`generate(prompt_lookup_num_tokens=N, max_matching_ngram_size="
        f"{PROMPT_LOOKUP_NGRAM})`, candidates copied from the context, no draft model; "
        "= HF greedy: at T=0, runs token-identical to hf_generate.",
        "",
    ]
    partings = [(s["method"], *p) for s in summary for p in s.get("partings", ())]
    if partings:
        lines += ["Partings from HF greedy at T=0 (the first new token that differs; the "
                  "gap between the target's logits of the two tokens there from one pass over "
                  "the context, and the widest gap that rounding between pass shapes moves "
                  "there, both in rounding steps of the rows' dtype):", ""]
        for method, qid, at, gap, threshold in partings:
            gap_text = "a run that stopped early" if gap in (None, "") else (
                f"gap {float(gap):.1f} steps, near-tie up to {float(threshold):.1f}: "
                + ("a near-tie" if float(gap) <= float(threshold) else "NOT a near-tie"))
            lines.append(f"- {method}, prompt {qid}: new token {at}, {gap_text}")
        lines.append("")
    if context.get("peers"):
        lines += ["Peers (`peer:*`): other engines in their own processes, given the same "
                  "prompt token ids; their time is their own generate call's.", ""]
    for method, why in context.get("skipped", {}).items():
        lines += [f"Not run: {method}: {why}.", ""]
    lines += _part_times(context["parts"], context.get("prompt_s"),
                         context.get("prompt_rows_s", {}))
    if context["choices"] and isinstance(settings.budget, Auto):
        lines += ["", "## Budgets and depths picked by `--budget auto`", ""]
        for (decoder, temp), choice in context["choices"].items():
            lines.append(f"- {decoder}, T={temp:g}: {choice.describe()}")
    lines += ["", "## Goals", ""]
    for goal, value, met in goals(summary, settings, context.get("lookup", False)):
        mark = "not measured" if met is None else ("met" if met else "NOT met")
        lines.append(f"- {goal}: {value} -> {mark}")
    return "\n".join(lines) + "\n"


def _part_times(parts, prompt_s, prompt_rows_s) -> list[str]:
    """The part times as tables, one row per context timed at."""
    timings = [parts] + ([parts.longer] if parts.longer is not None else [])
    contexts = " and ".join(str(p.context_len) for p in timings)
    lines = [f"## Part times (median seconds per pass, {contexts} cached context tokens; "
             "each prompt's runs are priced at its own mean context, linear in between)", ""]

    def table(what, curves):
        sizes = curves[0][1].sizes
        out = ["", f"| {what} | " + " | ".join(map(str, sizes)) + " |",
               "|" + "---|" * (len(sizes) + 1)]
        for n_ctx, curve in curves:
            out.append(f"| ms at {n_ctx} | " + " | ".join(f"{t * 1e3:.1f}" for t in curve.seconds)
                       + " |")
        return out

    lines += table("target pass, new tokens", [(p.context_len, p.target) for p in timings])[1:]
    if prompt_s:
        lines += ["", "Each prompt's first pass beyond a one-token pass (in the bounds), ms: "
                  + ", ".join(f"{t * 1e3:.0f}" for t in prompt_s) + "."]
    for method, seconds in prompt_rows_s.items():
        lines += ["", f"{method}'s first pass, which ranks the target's rows at every prompt "
                  "position, beyond a one-token pass, ms: "
                  + ", ".join(f"{t * 1e3:.0f}" for t in seconds) + "."]
    if parts.draft is not None:
        lines += table("draft pass width", [(p.context_len, p.draft) for p in timings])
        if parts.draft_refeeds:
            lines += ["", "The draft feeds each round's committed tokens again in its next "
                      "round's first pass (priced at that width)."]
    return lines


def csv_text(rows: list[dict]) -> str:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def write(
    out_dir: str, name: str | None, rows: list[dict], context: dict, head: dict, settings
) -> tuple[str, str]:
    """Write NAME.csv and NAME.md under out_dir (atomically); return their paths."""
    name = name or time.strftime("bench_%Y%m%d-%H%M%S")
    csv_path, md_path = (os.path.join(out_dir, f"{name}.{ext}") for ext in ("csv", "md"))
    atomic_write_text(csv_path, csv_text(rows))
    atomic_write_text(md_path, markdown(head, summarize(rows, settings), context, settings))
    return csv_path, md_path
